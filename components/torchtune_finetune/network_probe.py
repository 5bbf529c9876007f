"""Before a multi-node TrainJob trains: one short all-reduce between its nodes, to measure the network it got.

Each node pod runs it from the entrypoint, before `tune run` (so before torchrun), in a fresh interpreter whose
CUDA context ends with it: one process per node (GPU 0, NCCL; gloo on CPU) joins a process group over the TrainJob's rendezvous address (PET_MASTER_ADDR, the next port
after PET_MASTER_PORT, which torchrun itself uses afterwards), all-reduces a 256 MiB buffer a few times and
computes the bus bandwidth as nccl-tests defines it (bytes x 2 (n - 1) / n / time). Node 0 prints the result and
writes `network.json` into the run folder, where the fine-tune step reads it for its report.

A bandwidth far below what the network should give stops the run before any GPU hour is spent on it (exit 2, the
numbers in the message): under `EXPECTED_GBPS[network] * FAR_BELOW`, where the network is RDMA when the runtime's
rdma component set NCCL's InfiniBand variables (runtimes/components/rdma), else the pod network.
`KFP_FINETUNE_MIN_ALLREDUCE_GBPS` overrides the floor (0 turns the stop off).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

NETWORK_FILE = "network.json"
PROBE_BYTES = 256 * 1024 * 1024
WARMUP, ROUNDS = 2, 5
#: Bus bandwidth, Gb/s, a healthy network of each kind gives an all-reduce between nodes: RDMA (InfiniBand / RoCE,
#: 200-400 Gb/s per GPU, NCCL over one GPU per node) and an ordinary pod network (10-25 GbE, TCP sockets).
EXPECTED_GBPS = {"rdma": 100.0, "pod network": 8.0}
FAR_BELOW = 0.25
FLOOR_ENV = "KFP_FINETUNE_MIN_ALLREDUCE_GBPS"
TIMEOUT_SECONDS = 300


@dataclass(frozen=True)
class NetworkResult:
    nodes: int
    network: str  # "rdma" or "pod network"
    backend: str  # nccl or gloo
    bytes: int
    seconds: float  # per all-reduce, mean of ROUNDS
    busbw_gbps: float
    floor_gbps: float

    @property
    def too_slow(self) -> bool:
        return self.floor_gbps > 0 and self.busbw_gbps < self.floor_gbps

    def line(self) -> str:
        return (
            f"network between {self.nodes} nodes ({self.network}, {self.backend}): all-reduce bus bandwidth "
            f"{self.busbw_gbps:.1f} Gb/s ({self.bytes / 2**20:.0f} MiB in {self.seconds * 1000:.1f} ms; expected "
            f"~{EXPECTED_GBPS[self.network]:g} Gb/s, stop below {self.floor_gbps:g})"
        )


def network_kind(environ: dict[str, str]) -> str:
    """RDMA when NCCL was told to use InfiniBand/RoCE devices (the rdma runtime component sets these)."""
    return (
        "rdma" if environ.get("NCCL_IB_HCA") and environ.get("NCCL_IB_DISABLE", "0") != "1" else "pod network"
    )


def floor_gbps(network: str, environ: dict[str, str]) -> float:
    given = environ.get(FLOOR_ENV)
    return float(given) if given not in (None, "") else EXPECTED_GBPS[network] * FAR_BELOW


def measure(environ: dict[str, str] | None = None, size: int = PROBE_BYTES) -> NetworkResult | None:
    """Run the probe on this node; None on one node. Every node must call it (it is a collective)."""
    environ = dict(os.environ if environ is None else environ)
    nodes = int(environ.get("PET_NNODES") or 1)
    if nodes < 2:
        return None
    import datetime

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    address = f"tcp://{environ['PET_MASTER_ADDR']}:{int(environ['PET_MASTER_PORT']) + 1}"
    dist.init_process_group(
        backend,
        init_method=address,
        world_size=nodes,
        rank=int(environ.get("PET_NODE_RANK") or 0),
        timeout=datetime.timedelta(seconds=TIMEOUT_SECONDS),
    )
    try:
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(WARMUP):
            dist.all_reduce(buffer)
        if cuda:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(ROUNDS):
            dist.all_reduce(buffer)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - started) / ROUNDS
        # Every node's clock differs: node 0's figure is the one reported, the slowest of all decides.
        slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = float(slowest.item())
    finally:
        dist.destroy_process_group()
    busbw = size * 2 * (nodes - 1) / nodes / seconds * 8 / 1e9
    network = network_kind(environ)
    return NetworkResult(nodes, network, backend, size, seconds, busbw, floor_gbps(network, environ))


def write_result(run_dir: Path, result: NetworkResult) -> None:
    scratch = run_dir / f".{NETWORK_FILE}.tmp"
    scratch.write_text(json.dumps(asdict(result)))
    os.replace(scratch, run_dir / NETWORK_FILE)


def read_result(run_dir: Path) -> NetworkResult | None:
    """The probe's result in a run folder (None: one node, or not measured)."""
    try:
        return NetworkResult(**json.loads((run_dir / NETWORK_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def too_slow_message(result: NetworkResult) -> str:
    return (
        f"{result.line()}: far below what training across nodes needs, so the run stops before training. Check "
        "that the runtime requests the RDMA devices and NCCL settings (runtimes/components/rdma, docs/"
        f"cluster-install.md 'Which runtime?'), train on one node, or set {FLOOR_ENV}=0 in the task's env to train "
        "anyway"
    )
