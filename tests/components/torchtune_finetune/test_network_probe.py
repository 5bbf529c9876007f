"""The all-reduce probe between a TrainJob's nodes (network_probe.py), run as the node pods' entrypoint runs it (in
a fresh interpreter beside the node process, entrypoint.probe_network_apart): two node processes with the Trainer's
PET_* environment on one machine (gloo on CPU)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from kfp_finetune.components.torchtune_finetune import network_probe as probe

pytestmark = pytest.mark.slow

SCRIPT = """
import sys
from pathlib import Path
from kfp_finetune.components.torchtune_finetune.entrypoint import probe_network_apart
sys.exit(0 if probe_network_apart(Path(sys.argv[1]), sys.argv[2]) else 2)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(run_dir, **env):
    """Both node processes' (exit code, output), as the Trainer starts them: PET_NNODES, PET_NODE_RANK, ..."""
    port = free_port() - 1  # the probe takes PET_MASTER_PORT + 1
    base = {
        **os.environ,
        "PET_NNODES": "2",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        **env,
    }
    nodes = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(run_dir), str(rank)],
            env={**base, "PET_NODE_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for rank in (0, 1)
    ]
    return [(node.wait(timeout=300), node.stdout.read()) for node in nodes]


def test_node_zero_records_the_bandwidth_between_the_nodes(tmp_path):
    (code0, out0), (code1, out1) = two_nodes(tmp_path, **{probe.FLOOR_ENV: "0"})
    assert (code0, code1) == (0, 0), out0 + out1
    recorded = json.loads((tmp_path / probe.NETWORK_FILE).read_text())
    assert recorded["nodes"] == 2 and recorded["backend"] == "gloo" and recorded["busbw_gbps"] > 0
    assert recorded["network"] == "pod network"  # no NCCL InfiniBand settings in this environment
    assert (
        "all-reduce bus bandwidth" in out0 and "all-reduce bus bandwidth" not in out1
    )  # said once, by node 0
    assert probe.read_result(tmp_path).busbw_gbps == recorded["busbw_gbps"]


def test_a_network_far_below_its_floor_stops_every_node_before_training(tmp_path):
    (code0, out0), (code1, out1) = two_nodes(
        tmp_path, **{probe.FLOOR_ENV: "1e9"}
    )  # no network reaches 1 Eb/s
    assert (code0, code1) == (2, 2), out0 + out1
    assert "far below what training across nodes needs" in out0 and "runtimes/components/rdma" in out0


def test_one_node_is_not_probed(tmp_path):
    assert probe.measure({"PET_NNODES": "1"}) is None


def test_rdma_is_recognised_from_the_rdma_components_nccl_settings():
    assert probe.network_kind({"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "0"}) == "rdma"
    assert probe.network_kind({"NCCL_IB_HCA": "mlx5", "NCCL_IB_DISABLE": "1"}) == "pod network"
    assert probe.floor_gbps("rdma", {}) == 25.0 and probe.floor_gbps("rdma", {probe.FLOOR_ENV: "3"}) == 3.0
