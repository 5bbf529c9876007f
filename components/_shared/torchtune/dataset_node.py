"""The `dataset:` node of a torchtune run, built in one place for the three steps that need the same one: the
fine-tune's resolver (resolve.py), dataset-initialize's packs (packing.py: the packs must be the rows training
would build) and evaluate (the eval rows masked as training masked them).

A node names torchtune's builder for the rows' shape (instruct, alpaca-style instruct, chat, text), the
`datasets` builder that reads the files (SOURCES, by file suffix) and the masking settings. No torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from kfp_finetune.components._shared.data_formats import FORMATS, TEXT_DATASET_TYPES
from kfp_finetune.components._shared.errors import ConfigError, SettingError

DATASET_TYPES = TEXT_DATASET_TYPES
_BUILDERS = {
    "instruct": "torchtune.datasets.instruct_dataset",
    "alpaca": "torchtune.datasets.alpaca_dataset",
    "chat": "torchtune.datasets.chat_dataset",
    "text": "torchtune.datasets.text_completion_dataset",
}
#: Data file suffix -> the `datasets` packaged builder torchtune's dataset builders read it with (`source`): the
#: formats whose columns come typed or named (plain text and tab-separated files need settings a node lacks).
#: In this order: a folder holding several is read in the first (parquet, as dataset-initialize writes it).
_SOURCE_ORDER = ("parquet", "json", "csv", "arrow")
SOURCES = {suffix: fmt for fmt in _SOURCE_ORDER for suffix, known in FORMATS.items() if known == fmt}


def source_of(path: str | os.PathLike) -> str:
    """The `source` for a data file, by its suffix."""
    suffix = Path(path).suffix
    if suffix not in SOURCES:
        raise ConfigError(f"data file {path} has an unsupported type; use {', '.join(SOURCES)}")
    return SOURCES[suffix]


def dataset_builder_node(
    dataset_type: str,
    *,
    source: str,
    data_files: Sequence[str] = (),
    data_style: str = "",
    split: str = "train",
    text_column: str = "",
    conversation_column: str = "",
    conversation_style: str = "",
    column_map: Mapping[str, str] | None = None,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    packed: bool = False,
) -> dict:
    """The node for rows of `dataset_type` (instruct: `data_style` alpaca picks torchtune's alpaca builder).
    Text completion takes no masking; alpaca takes no new_system_prompt (torchtune's builder has none)."""
    if dataset_type not in DATASET_TYPES:
        raise SettingError(
            "dataset_type", f"must be one of {', '.join(DATASET_TYPES)} (got {dataset_type!r})"
        )
    alpaca = dataset_type == "instruct" and data_style == "alpaca"
    node: dict = {"_component_": _BUILDERS["alpaca" if alpaca else dataset_type], "source": source}
    if data_files:
        node["data_files"] = list(data_files)
    node["split"] = split
    if dataset_type == "text":
        node["column"] = text_column or "text"
    else:
        node["train_on_input"] = bool(train_on_input)
        if new_system_prompt is not None:
            if alpaca:
                raise SettingError("new_system_prompt", "is not supported for alpaca-style data by torchtune")
            node["new_system_prompt"] = new_system_prompt
    if dataset_type == "instruct" and column_map:
        node["column_map"] = dict(column_map)
    if dataset_type == "chat":
        node["conversation_column"] = conversation_column or "messages"
        node["conversation_style"] = conversation_style or "openai"
    node["packed"] = bool(packed)
    return node
