"""Sweep helpers: the trial grid, and choosing the best trial by an evaluate metric.

The best trial's artifacts are passed on as they are (their bytes stay in the workspace); only the small
manifest files and metadata are copied.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared import unset
from kfp_finetune.components._shared.contract import EvalMetrics, TunedModel, lower_is_better
from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)


def trial_grid(learning_rates: list, lora_ranks: list) -> list[dict[str, Any]]:
    """Every (learning rate, LoRA rank) pair as a named trial; names are unique and DNS-friendly.

    -1 keeps the base config's value (the one "unset" convention of `_shared/unset.py`); the trial passes it on
    as it is, so the fine-tune step reads it the way it reads its own parameters."""
    if not learning_rates or not lora_ranks:
        raise ValueError(
            "sweep needs at least one learning rate and one LoRA rank (use [-1] to keep the base config's)"
        )
    trials = []
    for lr, rank in itertools.product(learning_rates, lora_ranks):
        lr, rank = float(lr), int(rank)
        if not (lr > 0 or lr == unset.UNSET_NUMBER) or not (rank >= 1 or rank == unset.UNSET_NUMBER):
            raise ValueError(
                f"learning rates must be > 0 and LoRA ranks at least 1 (-1 keeps the base config's); got "
                f"lr={lr:g}, rank={rank}"
            )
        lr_name = (
            "base"
            if lr == unset.UNSET_NUMBER
            else f"{lr:g}".replace(".", "p").replace("+", "").replace("-", "m")
        )
        rank_name = "base" if rank == unset.UNSET_NUMBER else str(rank)
        name = f"trial-lr{lr_name}-r{rank_name}"
        trials.append({"trial_name": name.lower(), "learning_rate": lr, "lora_rank": rank})
    if len({t["trial_name"] for t in trials}) != len(trials):
        raise ValueError("sweep values repeat: each learning rate and rank may appear once")
    return trials


def best_trial(eval_metrics: list[dict], metric: str) -> int:
    """Index of the trial whose tuned `metric` is best (lower for losses, else higher)."""
    key = f"tuned_{metric}"
    values = [m.get(key) for m in eval_metrics]
    if not values or any(v is None for v in values):
        known = sorted(
            k.removeprefix("tuned_")
            for k in (eval_metrics[0] if eval_metrics else {})
            if k.startswith("tuned_")
        )
        raise ValueError(f"metric {metric!r} is not in every trial's evaluation; known: {', '.join(known)}")
    pick = min if lower_is_better(metric) else max
    return values.index(pick(values))


def select_best(
    models: list, eval_metrics: list, best_model: Any, best_metrics: Any, model_image: str, metric: str
) -> bool:
    """Copy the best trial's model and metrics artifacts to the outputs and write the image that trained it (where
    its export loads it) to `model_image`; return whether it passed its gate."""
    if len(models) != len(eval_metrics) or not models:
        raise ValueError(
            f"got {len(models)} models and {len(eval_metrics)} evaluations: one of each per trial"
        )
    evaluations = [
        EvalMetrics.from_metadata(m.metadata, input_name=f"eval_metrics[{i}]")
        for i, m in enumerate(eval_metrics)
    ]
    trials = [TunedModel.from_metadata(m.metadata, input_name=f"models[{i}]") for i, m in enumerate(models)]
    index = best_trial([e.values for e in evaluations], metric)
    for position, values in enumerate(evaluations):
        marker = "<- best" if position == index else ""
        log.info("trial %d (%s): %s=%.6g %s", position, trials[position].run_dir or "?", metric,
                 values.values[f"tuned_{metric}"], marker)  # fmt: skip
    best = trials[index]
    image = best.require("model_image", input_name=f"models[{index}]")
    best.sweep_metric, best.sweep_trial = metric, index
    for source, target, metadata in (
        (models[index], best_model, best.to_metadata()),
        (eval_metrics[index], best_metrics, evaluations[index].to_metadata()),
    ):
        target.metadata.update(metadata)
        if Path(source.path).is_file():
            Path(target.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source.path, target.path)
    Path(model_image).parent.mkdir(parents=True, exist_ok=True)
    Path(model_image).write_text(image)
    return evaluations[index].passed
