"""How long a transformers-engine run trains: the floor under its optimizer steps (_shared/run_floor.py), planned
from dataset-initialize's row count before anything trains, so data too small for a run that learns is refused
before a TrainJob starts. Steps are counted as the Trainer counts them: each process's share of the rows in
batches (the last one partial), over the accumulation steps, capped by max_steps_per_epoch. Padding-free packing
(chosen by the training process on a GPU with flash attention) puts several rows in one sample: where the packs
of the built trainer would train fewer than MIN_OPTIMIZER_STEPS, the training process unpacks the rows again
(`unpacked_for_floor`), as torchtune's defaults do.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from kfp_finetune.components._shared import run_floor
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.micro_batch_rule import LR_SCALE_CAP, square_root_rate
from kfp_finetune.components._shared.transformers import fast
from kfp_finetune.components._shared.transformers.fast import AUTO, PLANNED_BATCH
from kfp_finetune.components._shared.transformers.rows import read_rows
from kfp_finetune.components._shared.transformers.settings import DEFAULT_LEARNING_RATE, SftSettings

log = get_logger(__name__)

#: The settings the floor may choose where the step leaves them unset: the step's (tune_<name>) and SftSettings'
#: fields have these names.
_CHOSEN = ("gradient_accumulation_steps", "batch_size", "epochs")


def per_epoch(rows: int, batch: int, accumulation: int, world: int, cap: int | None) -> int:
    """One epoch's optimizer steps, as the Trainer counts them (train.capped_steps counts the same at run time)."""
    batches = math.ceil(math.ceil(rows / max(world, 1)) / batch)
    steps = math.ceil(batches / accumulation)
    return min(steps, cap) if cap else steps


def fit_run_length(fields: dict[str, Any], given: set[str], rows: int | None, world: int) -> list[dict]:
    """Plan at least MIN_OPTIMIZER_STEPS for `rows` training rows over `world` processes: the SftSettings `fields`
    the user left unset (not in `given`, the step's settings by name) are changed in place. The choices made, each
    with its reason (the run's resolved config and report show them); a short run the user's settings plan is kept
    with a warning in the log; too few rows for any run that learns raise ConfigError. Nothing without a row count."""
    if not rows:
        return []
    accumulation, batch, epochs = (fields.get(name, getattr(SftSettings, name)) for name in _CHOSEN)
    # Left to the training process: planned at the batch it takes where no GPU is to be filled; a larger one it
    # chooses is lowered again to keep the floor (fit_micro_batch).
    batch = PLANNED_BATCH if batch == AUTO else batch
    cap = fields.get("max_steps_per_epoch")
    fixed = run_floor.Given(
        batch="batch_size" in given,
        accumulation="gradient_accumulation_steps" in given,
        epochs=bool({"epochs", "max_steps_per_epoch"} & given),
    )

    def count(n: int, b: int, a: int) -> int:
        return per_epoch(n, b, a, world, cap)

    before = count(rows, batch, accumulation) * epochs
    if before >= run_floor.MIN_OPTIMIZER_STEPS:
        return []
    plan = (f"{rows} rows over batch {batch} x accumulation {accumulation} x {world} process(es) x {epochs} "
            f"epoch(s) plan {before} optimizer step(s)")  # fmt: skip
    found = run_floor.fit(rows, batch, accumulation, epochs, world, fixed, count)
    floor = f"at least {run_floor.MIN_OPTIMIZER_STEPS} where the data allows (MIN_OPTIMIZER_STEPS)"
    choices = []
    for name, old, new, how in (
        ("gradient_accumulation_steps", accumulation, found.accumulation, "fewer accumulation steps first"),
        ("batch_size", batch, found.batch, "then a smaller micro-batch"),
        ("epochs", epochs, found.epochs, f"then more epochs, at most {run_floor.MAX_DEFAULT_EPOCHS}"),
    ):
        if new != old:
            fields[name] = new
            moved = f"lowered from {old}" if new < old else f"raised from {old}"
            choices.append({"setting": name, "value": new, "reason": f"{moved}: {plan}, {floor}; {how}"})
    if found.total >= run_floor.MIN_OPTIMIZER_STEPS:
        return [
            *choices,
            {"setting": "optimizer steps", "value": found.total, "reason": f"{floor}; before: {plan}"},
        ]
    counted = (f"{rows} rows over batch {found.batch} x accumulation {found.accumulation} x {world} process(es)"
               f"{f' (at most {cap} per epoch)' if cap else ''} x {found.epochs} epoch(s) plan {found.total} "
               "optimizer step(s)")  # fmt: skip
    accepted = sorted(f"tune_{name}" for name in given & {*_CHOSEN, "max_steps_per_epoch"})
    if not accepted or found.total == 0:
        raise ConfigError(run_floor.too_little_data(
            counted, "rows", "rows", found.total, "tune_epochs, tune_batch_size or tune_gradient_accumulation_steps"
        ))  # fmt: skip
    log.warning(
        "%s, fewer than the %d a run needs to learn reliably; kept as set (%s)",
        counted, run_floor.MIN_OPTIMIZER_STEPS, ", ".join(accepted),
    )  # fmt: skip
    return choices


def fit_micro_batch(settings: SftSettings, world: int) -> SftSettings:
    """`settings` with the micro-batch chosen where it is auto (fast.choose_batch: from max_seq_len, the model and
    the GPU), at most the largest that still plans MIN_OPTIMIZER_STEPS for the training rows over `world`
    processes (the floor the plan kept at fast.PLANNED_BATCH), and an unset learning rate raised by the square-root
    rule where it grew (micro_batch_rule.py); the choices and their reasons added to `planned`."""
    if settings.batch_size != AUTO:
        return settings
    hardware = fast.Hardware.here(settings.device)
    model = fast.ModelSize.of(settings.model_dir) if hardware.cuda else None
    choice = fast.choose_batch(settings, hardware, model, world)
    batch, reason = choice.value, choice.reason
    if settings.max_steps is None and batch > PLANNED_BATCH:  # fewer rows per step than planned: more steps
        rows = len(read_rows(settings))  # into the run's datasets cache, which training then reads
        kept = _keeping_floor(settings, rows, batch, world)
        if kept < batch:
            steps = per_epoch(
                rows, kept, settings.gradient_accumulation_steps, world, settings.max_steps_per_epoch
            )
            reason += (f"; lowered to {kept}: {rows} rows over {world} process(es) then plan {steps * settings.epochs}"
                       f" optimizer steps, at least the {run_floor.MIN_OPTIMIZER_STEPS} a run needs")  # fmt: skip
            batch = kept
    planned = [*settings.planned, {"setting": "batch_size", "value": batch, "reason": reason}]
    # The default rate was set for PLANNED_BATCH samples per device (packs where packed, as before the choice).
    rate = square_root_rate(DEFAULT_LEARNING_RATE, batch / PLANNED_BATCH)
    if settings.learning_rate != AUTO or rate is None:
        return replace(settings, batch_size=batch, planned=planned)
    grown = (f"{DEFAULT_LEARNING_RATE:g} x {rate / DEFAULT_LEARNING_RATE:.2f}: a micro-batch of {batch} is "
             f"{batch / PLANNED_BATCH:.1f}x the {PLANNED_BATCH} the default rate is for (the square-root rule, at "
             f"most {LR_SCALE_CAP:g}x; set tune_learning_rate to choose another)")  # fmt: skip
    planned.append({"setting": "learning_rate", "value": rate, "reason": grown})
    return replace(settings, batch_size=batch, learning_rate=rate, planned=planned)


def _keeping_floor(settings: SftSettings, rows: int, batch: int, world: int) -> int:
    """The largest micro-batch up to `batch` whose steps reach MIN_OPTIMIZER_STEPS; where none does (a short run
    the user's settings keep), the planned one at most."""
    for size in range(batch, 0, -1):
        steps = per_epoch(
            rows, size, settings.gradient_accumulation_steps, world, settings.max_steps_per_epoch
        )
        if steps * settings.epochs >= run_floor.MIN_OPTIMIZER_STEPS:
            return size
    return min(batch, PLANNED_BATCH)


def trained_steps(trainer: Any, settings: SftSettings) -> int:
    """The optimizer steps a built trainer trains: this process's batches of its dataloader (rows, or packed,
    packs) over the accumulation steps, capped by max_steps_per_epoch, times the epochs."""
    batches = len(trainer.get_train_dataloader())
    per_epoch = max(math.ceil(batches / settings.gradient_accumulation_steps), 1)
    if settings.max_steps_per_epoch:
        per_epoch = min(per_epoch, settings.max_steps_per_epoch)
    return per_epoch * settings.epochs


def unpacked_for_floor(settings: SftSettings, trainer: Any) -> SftSettings | None:
    """The settings with the rows unpacked (one per sample, as the row count planned the run), the choice and its
    reason among the planned ones, where packing chosen here (auto) leaves the built trainer fewer than
    MIN_OPTIMIZER_STEPS; None where the packs are enough, nothing is packed, or the user set max_steps or packing
    (a warning then, where the packs are too few)."""
    if not getattr(trainer.args, "packing", False) or settings.max_steps is not None:
        return None
    steps = trained_steps(trainer, settings)
    if steps >= run_floor.MIN_OPTIMIZER_STEPS:
        return None
    packed = (f"packed, the rows make {len(trainer.train_dataset)} sample(s): {steps} optimizer step(s), fewer than "
              f"the {run_floor.MIN_OPTIMIZER_STEPS} a run needs (MIN_OPTIMIZER_STEPS)")  # fmt: skip
    if settings.packing is True:
        log.warning("%s; kept as set (tune_packed)", packed)
        return None
    choice = {"setting": "packing", "value": False, "reason": f"{packed}: rows unpacked, one per sample"}
    return replace(settings, packing=False, planned=[*settings.planned, choice])
