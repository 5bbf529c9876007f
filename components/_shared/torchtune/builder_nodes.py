"""Config nodes of our builders that call a torchtune builder and fix what it returns (sample_packing.py,
flex_attention.py): `{_component_: ours, builder: torchtune's dotted path, **its arguments}`. The arguments stay
where the recipes and our other steps read them (e.g. `model.lora_rank`, `dataset.packed`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def wrap(node: dict, component: str) -> dict:
    """`node` as the node of `component` over the same builder and arguments."""
    return {
        "_component_": component,
        "builder": node["_component_"],
        **{k: v for k, v in node.items() if k != "_component_"},
    }


def unwrap(node: dict, component: str) -> dict:
    """The torchtune node `wrap` made a node of `component` from; any other node unchanged."""
    if node.get("_component_") != component:
        return node
    return {
        "_component_": node["builder"],
        **{k: v for k, v in node.items() if k not in ("_component_", "builder")},
    }


def builder(path: str) -> Callable[..., Any]:
    """The function a dotted path names (importing its module)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
