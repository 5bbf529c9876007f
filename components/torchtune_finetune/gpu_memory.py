"""GPU memory for the defaults' memory model (memory_model.py): the `gpu_memory_gib` setting, else the memory of the
GPU product the training pods are placed on (`nvidia.com/gpu.product`, the label NVIDIA GPU feature discovery
puts on nodes) as the task's node selector or required node affinity names it, else unknown (None: the defaults
assume DEFAULT_GPU_MEMORY_GIB and say so)."""

from __future__ import annotations

from typing import Any

from kfp_finetune.components._shared.torchtune.memory_model import gpu_memory_from_product

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


def products(node_selector: dict[str, str] | None, affinity: dict[str, Any] | None) -> list[str]:
    """The GPU products the pods may run on: the node selector's label value, else the `In` values of required
    node affinity terms on that label."""
    if (node_selector or {}).get(GPU_PRODUCT_LABEL):
        return [node_selector[GPU_PRODUCT_LABEL]]
    required = ((affinity or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    found = []
    for term in (required or {}).get("nodeSelectorTerms") or []:
        for expression in term.get("matchExpressions") or []:
            if expression.get("key") == GPU_PRODUCT_LABEL and expression.get("operator") == "In":
                found.extend(expression.get("values") or [])
    return found


def gpu_memory_for(
    requested: float | None, node_selector: dict[str, str] | None, affinity: dict[str, Any] | None
) -> float | None:
    """`requested` when set (> 0); else the smallest memory among the products the pods may land on (every one
    must fit); None when none is named or known."""
    if requested is not None and requested > 0:
        return float(requested)
    known = [gib for gib in map(gpu_memory_from_product, products(node_selector, affinity)) if gib]
    return min(known) if known else None
