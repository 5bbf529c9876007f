"""The processes a pod can keep busy: its cgroup's CPU and memory limits (v2 and v1 files, faked in a temp dir) and
the CPUs this process may run on."""

from __future__ import annotations

import os

import pytest

from kfp_finetune.components._shared import cpus
from kfp_finetune.components._shared.cpus import GIB, PARENT_MEMORY, PROCESS_MEMORY

ALLOWED = len(os.sched_getaffinity(0))


def _files(root, files: dict[str, str]):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return root


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "400000 100000"}, 4.0),
        ({"cpu.max": "250000 100000"}, 2.5),
        ({"cpu.max": "max 100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3.0),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({}, None),
    ],
)
def test_cpu_limit_from_cgroup_v2_and_v1(tmp_path, files, limit):
    assert cpus.cpu_limit(_files(tmp_path, files)) == limit


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"memory.max": str(8 * GIB)}, 8 * GIB),
        ({"memory.max": "max"}, None),
        ({"memory/memory.limit_in_bytes": str(6 * GIB)}, 6 * GIB),
        ({"memory/memory.limit_in_bytes": "9223372036854771712"}, None),  # v1's "no limit"
        ({}, None),
    ],
)
def test_memory_limit_from_cgroup_v2_and_v1(tmp_path, files, limit):
    assert cpus.memory_limit(_files(tmp_path, files)) == limit


@pytest.mark.parametrize(
    ("limit", "allowed", "memory", "count", "bound"),
    [
        (4.0, 64, None, 4, "CPU limit"),
        (2.5, 64, None, 2, "CPU limit"),  # floored
        (0.5, 64, None, 1, "CPU limit"),  # at least one
        (8.0, 2, None, 2, "CPUs this process may run on"),
        (None, 16, None, 16, "CPUs this process may run on"),
        (4.0, 4, None, 4, "CPU limit"),  # a tie names the limit the pipeline sets
        (16.0, 64, PARENT_MEMORY + 3 * PROCESS_MEMORY, 3, "memory limit"),
        (16.0, 64, PARENT_MEMORY, 1, "memory limit"),
    ],
)
def test_the_fewest_bound_wins_and_is_named(limit, allowed, memory, count, bound):
    chosen = cpus.choose(limit, allowed, memory)
    assert chosen.count == count
    assert bound in chosen.reason


def test_the_pod_default_reads_the_cgroup_limit(tmp_path):
    """One CPU allowed by the quota: one process, whatever the machine's CPUs, named by its bound."""
    root = _files(tmp_path, {"cpu.max": "100000 100000", "memory.max": "max"})
    assert str(cpus.pod_processes(root)) == "1 process: the pod's CPU limit (1)"
    roomy = _files(tmp_path / "roomy", {"cpu.max": f"{1000 * 100000} 100000", "memory.max": "max"})
    assert cpus.pod_processes(roomy).count == ALLOWED
    tight = _files(
        tmp_path / "tight", {"cpu.max": "max 100000", "memory.max": str(PARENT_MEMORY + PROCESS_MEMORY)}
    )
    limit = f"{(PARENT_MEMORY + PROCESS_MEMORY) / GIB:.1f} GiB"
    assert str(cpus.pod_processes(tight)).startswith(f"1 process: the pod's memory limit ({limit}")
