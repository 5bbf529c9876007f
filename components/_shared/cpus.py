"""How many processes a CPU-bound step (dataset-initialize's parsing and tokenizing) can use in its pod: the
fewest of its CPU limit, the CPUs it may run on and what its memory limit holds.

`os.cpu_count()` is the node's count, not the pod's: a container limited to 4 CPUs on a 64-core node would start
64 processes and be throttled to 4 CPUs' worth of time. The limit lives in the container's cgroup, mounted at
/sys/fs/cgroup (the container's own with a cgroup namespace, as Kubernetes runs them):
- cgroup v2: `cpu.max` is "<quota> <period>" or "max <period>"; `memory.max` is bytes or "max";
- cgroup v1: `cpu/cpu.cfs_quota_us` (-1: none) and `cpu/cpu.cfs_period_us`; `memory/memory.limit_in_bytes`
  (no limit reads as a number near 2**63).
A CPU limit of 2.5 gives 2 processes (floor, at least 1). `os.sched_getaffinity` counts the CPUs this process may
run on (a cpuset: Kubernetes' static CPU manager, `taskset`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
GIB = 1 << 30
# One tokenizing process (a fork of the step: torchtune's tokenizer and the memory-mapped rows are shared copy on
# write) holds the Python objects of the rows it tokenizes and its chunk's token arrays: a peak RSS of 0.33-0.45
# GiB with the tiny kit's tokenizer, shared pages counted in full (benchmarks/results-tokenize-procs); 1 GiB
# leaves room for a real tokenizer's larger vocabulary and caches and for longer rows.
PROCESS_MEMORY = GIB
# The parent's own: torch, the tokenizer, and every row's tokens and labels gathered from the processes (8 bytes a
# token: 1M rows of 250 tokens are 2 GiB).
PARENT_MEMORY = 2 * GIB
# cgroup v1 writes "no limit" as the largest page-aligned int64; nothing real comes close.
NO_LIMIT_V1 = 1 << 62


@dataclass(frozen=True)
class Processes:
    count: int
    reason: str

    def __str__(self) -> str:
        return f"{self.count} process{'es' if self.count != 1 else ''}: {self.reason}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """The container's CPU limit in CPUs (quota / period), from cgroup v2 or v1; None: no limit."""
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        quota, _, period = v2.partition(" ")
        return None if quota == "max" else int(quota) / int(period or 100_000)
    quota, period = _read(root / "cpu" / "cpu.cfs_quota_us"), _read(root / "cpu" / "cpu.cfs_period_us")
    if quota is None or period is None or int(quota) <= 0:
        return None
    return int(quota) / int(period)


def memory_limit(root: Path = CGROUP_ROOT) -> int | None:
    """The container's memory limit in bytes, from cgroup v2 or v1; None: no limit."""
    v2 = _read(root / "memory.max")
    if v2 is not None:
        return None if v2 == "max" else int(v2)
    v1 = _read(root / "memory" / "memory.limit_in_bytes")
    return None if v1 is None or int(v1) >= NO_LIMIT_V1 else int(v1)


def choose(cpus: float | None, allowed: int, memory: int | None) -> Processes:
    """The fewest of: the CPU limit (floored), the `allowed` CPUs and the processes `memory` holds (each
    PROCESS_MEMORY beside PARENT_MEMORY); at least 1. The reason names the bound that set it."""
    # A tie names the limit: it is what the pipeline sets.
    bounds = [(int(cpus), f"the pod's CPU limit ({cpus:g})")] if cpus is not None else []
    bounds.append((allowed, "the CPUs this process may run on"))
    if memory is not None:
        bounds.append(
            (
                (memory - PARENT_MEMORY) // PROCESS_MEMORY,
                f"the pod's memory limit ({memory / GIB:.1f} GiB, {PROCESS_MEMORY / GIB:g} GiB a process "
                f"beside {PARENT_MEMORY / GIB:g} GiB for the step itself)",
            )
        )
    count, reason = min(bounds, key=lambda bound: bound[0])
    return Processes(max(1, count), reason)


def pod_processes(root: Path = CGROUP_ROOT) -> Processes:
    """How many processes this pod can keep busy (see the module docstring)."""
    return choose(cpu_limit(root), len(os.sched_getaffinity(0)), memory_limit(root))
