"""The floor under a run's length, one rule for every engine: a run of a handful of optimizer steps learns next to
nothing, so where the user left them unset the defaults choose gradient accumulation, micro-batch and epochs
together to plan at least MIN_OPTIMIZER_STEPS — first fewer accumulation steps, then a smaller micro-batch, then
more epochs (at most MAX_DEFAULT_EPOCHS). A setting the user gave is never changed. Each engine counts its own
steps per epoch (its dataloader's rule) and words its choices; torchtune/run_length.py and transformers/
run_length.py apply this rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

#: Optimizer steps a run plans at least where the data allows.
MIN_OPTIMIZER_STEPS = 20
#: The most epochs the defaults choose to reach MIN_OPTIMIZER_STEPS (more passes over a few rows only memorize).
MAX_DEFAULT_EPOCHS = 3


@dataclass(frozen=True)
class Given:
    """Which of the run-length settings the user gave (those are never changed)."""

    batch: bool
    accumulation: bool
    epochs: bool  # the epochs, or a cap on the steps per epoch


@dataclass(frozen=True)
class Fitted:
    accumulation: int
    batch: int
    epochs: int
    total: int  # optimizer steps the run plans with these


def fit(
    samples: int,
    batch: int,
    accumulation: int,
    epochs: int,
    world: int,
    given: Given,
    per_epoch: Callable[[int, int, int], int],
) -> Fitted:
    """The settings that plan at least MIN_OPTIMIZER_STEPS for `samples` per epoch over `world` processes where the
    settings left unset allow it; `per_epoch(samples, batch, accumulation)` counts one epoch's optimizer steps as
    the engine does."""
    share, needed = math.ceil(samples / max(world, 1)), math.ceil(MIN_OPTIMIZER_STEPS / epochs)
    a, b, e = accumulation, batch, epochs
    if not given.accumulation:
        a = max(1, min(a, share // b // needed))
    if not given.batch and per_epoch(samples, b, a) < needed:
        b = max(1, min(b, share // (a * needed)))
    steps = per_epoch(samples, b, a)
    if steps * e < MIN_OPTIMIZER_STEPS and steps and not given.epochs:
        e = max(e, min(MAX_DEFAULT_EPOCHS, math.ceil(MIN_OPTIMIZER_STEPS / steps)))
    return Fitted(a, b, e, steps * e)


def too_little_data(counted: str, kind: str, more: str, total: int, parameters: str) -> str:
    """The refusal of data too small for a run that learns: `counted` says what the settings plan; `parameters`
    names the settings that accept a short run."""
    per_process = math.ceil(MIN_OPTIMIZER_STEPS / MAX_DEFAULT_EPOCHS)
    return (
        f"too little training data for a run that learns: {counted}, fewer than the {MIN_OPTIMIZER_STEPS} a run "
        f"needs (MIN_OPTIMIZER_STEPS; {per_process} {kind} per device at least): add {more}, or set {parameters} "
        "explicitly to accept a short run" + (" (with at least one optimizer step)" if total == 0 else "")
    )
