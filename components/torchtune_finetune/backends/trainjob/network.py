"""Several nodes need a fast network between them (_shared/launch_settings.py says why): a multi-node TrainJob on
a runtime that requests no RDMA network is refused before it is created, unless the user allows it
(`allow_slow_network`, recorded on the TrainJob as an annotation that also tells an operator why it is slow).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kfp_finetune.components._shared.launch_settings import (
    NETWORK_LABEL,
    RDMA,
    network_problem,
    slow_network_fix,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import TrainJobError

ANNOTATION_ALLOW_SLOW_NETWORK = "kfp-finetune.io/allow-slow-network"


def gpus_per_node(manifest: Mapping[str, Any]) -> int:
    """The GPUs each node pod of the TrainJob requests."""
    limits = ((manifest["spec"].get("trainer") or {}).get("resourcesPerNode") or {}).get("limits") or {}
    return int(limits.get("nvidia.com/gpu") or 0)


def check_network(
    runtime: Mapping[str, Any], kind: str, name: str, nodes: int, gpus: int, *, allowed: bool, log: Any
) -> None:
    """Raise TrainJobError for a multi-node GPU TrainJob without RDMA, unless allowed (then a warning)."""
    problem = network_problem(dict(runtime), kind, name, nodes, gpus)
    if problem is None:
        if nodes > 1 and gpus:
            log.info(
                "%d nodes on %s %r: RDMA network requested (%s: %s)", nodes, kind, name, NETWORK_LABEL, RDMA
            )
        return
    if allowed:
        log.warning("%s; going on, as tune_allow_slow_network=true asks", problem)
        return
    raise TrainJobError(f"{problem}: {slow_network_fix()}")
