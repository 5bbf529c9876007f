"""A torchtune run folder as the fine-tune step leaves it, and the one reader of its layout:

    <run>/torchtune_config.yaml   the resolved YAML the run trained with (RESOLVED_CONFIG)
    <run>/epoch_N/                torchtune's checkpointer, per epoch: the weights, the adapter in torchtune's
                                  names (ADAPTER_STATE) and as PEFT files, the recipe state (RECIPE_STATE)
    <run>/merged/, <run>/adapter/ what consumers load (torchtune_finetune/outputs.py; merge.py builds merged/)

Steps read a run through these names instead of building paths of their own. No torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from kfp_finetune.components._shared.errors import ConfigError

RESOLVED_CONFIG = "torchtune_config.yaml"
ADAPTER_STATE = "adapter_model.pt"
RECIPE_STATE = "recipe_state"
MERGED_DIR = "merged"
#: Kept in epoch_N/ for resuming, never handed to consumers.
TRAINING_STATE = frozenset({ADAPTER_STATE, RECIPE_STATE})


def read_resolved_config(run_dir: str | os.PathLike) -> dict:
    """The run's resolved torchtune YAML; {} when the folder has none (a model this library did not train)."""
    path = Path(run_dir) / RESOLVED_CONFIG
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(
            f"{path} is not valid YAML ({e}): the fine-tune run folder is damaged; train again"
        ) from e


def epoch_dirs(run_dir: str | os.PathLike) -> list[Path]:
    """The run's `epoch_N/` folders, oldest first."""
    found = [p for p in Path(run_dir).glob("epoch_*") if p.is_dir() and re.fullmatch(r"epoch_\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def last_epoch_dir(run_dir: str | os.PathLike) -> Path:
    epochs = epoch_dirs(run_dir)
    if not epochs:
        raise FileNotFoundError(f"training wrote no checkpoint: no epoch_N folder in {run_dir}")
    return epochs[-1]


def last_adapter_state(run_dir: str | os.PathLike) -> Path | None:
    """The newest `epoch_N/adapter_model.pt` (the adapter in torchtune's names), None when there is none."""
    found = [epoch / ADAPTER_STATE for epoch in epoch_dirs(run_dir) if (epoch / ADAPTER_STATE).is_file()]
    return found[-1] if found else None
