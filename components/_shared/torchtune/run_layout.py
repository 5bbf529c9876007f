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
#: The resolved YAML's keys a model card shows, as (label, dotted key).
_HYPERPARAMETERS = (
    ("epochs", "epochs"),
    ("max steps per epoch", "max_steps_per_epoch"),
    ("batch size", "batch_size"),
    ("gradient accumulation steps", "gradient_accumulation_steps"),
    ("optimizer", "optimizer._component_"),
    ("learning rate", "optimizer.lr"),
    ("weight decay", "optimizer.weight_decay"),
    ("lr scheduler", "lr_scheduler._component_"),
    ("warmup steps", "lr_scheduler.num_warmup_steps"),
    ("loss", "loss._component_"),
    ("LoRA rank", "model.lora_rank"),
    ("LoRA alpha", "model.lora_alpha"),
    ("LoRA dropout", "model.lora_dropout"),
    ("LoRA attention modules", "model.lora_attn_modules"),
    ("LoRA on MLP", "model.apply_lora_to_mlp"),
    ("LoRA on output", "model.apply_lora_to_output"),
    ("max sequence length", "tokenizer.max_seq_len"),
    ("packed", "dataset.packed"),
    ("training dtype", "dtype"),
    ("seed", "seed"),
)


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


def hyperparameters(resolved: dict) -> list[tuple[str, object]]:
    """What a model card shows of how the run trained, from its resolved YAML (read_resolved_config): (label,
    value), None where the YAML has no such key."""
    return [(label, _lookup(resolved, key)) for label, key in _HYPERPARAMETERS]


def _lookup(config: dict, dotted: str) -> object:
    node: object = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node
