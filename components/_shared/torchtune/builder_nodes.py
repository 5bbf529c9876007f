"""Config nodes of our builders that call a torchtune builder and fix what it returns (sample_packing.py,
flex_attention.py): `{_component_: ours, builder: torchtune's dotted path, **its arguments}`. The arguments stay
where the recipes and our other steps read them (e.g. `model.lora_rank`, `dataset.packed`).

A builder of ours that calls none but stands in for one (dataset-initialize's packs in place of the torchtune
dataset node they were made with: torchtune_finetune/packed_data.py) keeps that node under `STANDS_FOR`, an
argument the builder ignores; the steps that need the run's torchtune node (evaluation builds its split with it)
read it back with `torchtune_node`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

STANDS_FOR = "stands_for"


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


def stand_in(node: dict, torchtune_node: dict) -> dict:
    """`node` with the torchtune node it stands in for kept under `STANDS_FOR`."""
    return {**node, STANDS_FOR: torchtune_node}


def torchtune_node(node: dict) -> dict:
    """The torchtune node `stand_in` kept in `node`; any other node unchanged."""
    return node.get(STANDS_FOR) or node


def builder(path: str) -> Callable[..., Any]:
    """The function a dotted path names (importing its module)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
