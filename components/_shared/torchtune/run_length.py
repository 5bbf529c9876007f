"""How long a run trains: the optimizer steps it plans, a floor under them, the learning rate where the global
batch grew, and a warmup that never eats a short run. Part of the defaults (defaults.py), run after the
micro-batch and accumulation are chosen.

The floor. A run of a handful of optimizer steps learns next to nothing (with a warmup, maybe nothing), so where
the user left them unset the defaults choose micro-batch, gradient accumulation and epochs together to plan at
least MIN_OPTIMIZER_STEPS: first fewer accumulation steps, then a smaller micro-batch (on GPUs the throughput
micro-batch gives way to the floor), then more epochs, at most MAX_DEFAULT_EPOCHS and only while tune_epochs and
tune_max_steps_per_epoch are unset; where packs are still too few, rows unpacked (one row per sample). A setting the user gave is never changed: where the user's settings plan fewer
steps, a WARNING says so and what to change. Where even micro-batch 1, no accumulation and MAX_DEFAULT_EPOCHS
epochs plan fewer (fewer than MIN_OPTIMIZER_STEPS / MAX_DEFAULT_EPOCHS = 7 rows per device), the data is too small
for a run that learns and the step refuses, unless the user set one of those settings (which accepts a short run).

The learning rate. Where the global batch (tokens per optimizer step over all devices) is more than
GLOBAL_GROWTH_ACCEPTED times the base config's, an Adam-type optimizer's learning rate follows it by the square-root
rule (_shared/micro_batch_rule.py). A learning rate the user set is kept; where it is below what the rule gives, a
WARNING says so. A smaller global batch keeps the base's rate.

The warmup. torchtune's cosine schedule trains its first step at lr 0; the defaults use lr_schedule.py's instead
(first step above 0), and cap the base config's warmup at WARMUP_CAP of the planned steps.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from kfp_finetune.components._shared import run_floor
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.micro_batch_rule import (
    GLOBAL_GROWTH_ACCEPTED,
    LR_SCALE_CAP,
    square_root_rate,
)
from kfp_finetune.components._shared.run_floor import MAX_DEFAULT_EPOCHS, MIN_OPTIMIZER_STEPS
from kfp_finetune.components._shared.torchtune import lr_schedule
from kfp_finetune.components._shared.torchtune.choices import Choice, record, user_set
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig

if TYPE_CHECKING:  # defaults.py, which runs these rules, defines it
    from kfp_finetune.components._shared.torchtune.defaults import TokenLengths

WARMUP_CAP = 0.05  # of the planned optimizer steps
WARMUP_NEW = 0.03  # where we add a schedule (full fine-tunes' constant LR)
TORCHTUNE_COSINE = "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"


def samples_per_epoch(config: dict, lengths: TokenLengths | None, num_rows: int | None = None) -> int | None:
    """What one epoch's dataloader holds: the rows, or packed, their tokens in max_seq_len packs. Without token
    lengths `num_rows` counts unpacked rows; None when the rows (or, packed, the tokens) are unknown."""
    rows = lengths.num_rows if lengths is not None else num_rows
    if not config["dataset"].get("packed"):
        return rows
    seq = config["tokenizer"].get("max_seq_len")
    if lengths is None or not lengths.lengths or not seq:
        return None  # packs hold an unknown number of rows
    return math.ceil(lengths.num_rows * (sum(lengths.lengths) / len(lengths.lengths)) / seq)


def steps_per_epoch(samples: int, batch: int, accumulation: int, world: int, cap: int | None) -> int:
    """As torchtune counts them: each device's share of the samples in full micro-batches (drop_last), over the
    accumulation steps, capped by max_steps_per_epoch."""
    steps = math.ceil(samples / max(world, 1)) // batch // accumulation
    return min(steps, int(cap)) if cap else steps


def planned_steps(
    config: dict, world: int, lengths: TokenLengths | None, num_rows: int | None = None
) -> int | None:
    """Optimizer steps the run will take (the warmup cap, the floor and the progress estimate use this one count);
    None when the samples are unknown and no max_steps_per_epoch bounds the epoch."""
    samples = samples_per_epoch(config, lengths, num_rows)
    cap, epochs = config.get("max_steps_per_epoch"), int(config.get("epochs") or 1)
    if samples is None:
        return int(cap) * epochs if cap else None
    batch, accumulation = (
        int(config.get("batch_size") or 1),
        int(config.get("gradient_accumulation_steps") or 1),
    )
    return steps_per_epoch(samples, batch, accumulation, world, cap) * epochs


def fit_run_length(
    config: dict, cfg: TorchtuneConfig, world: int, lengths: TokenLengths | None, choices: list[Choice]
) -> None:
    """Plan at least MIN_OPTIMIZER_STEPS (see the module docstring); raises ConfigError when the data are too small."""
    samples = samples_per_epoch(config, lengths)
    if samples is None:
        return
    packed = bool(config["dataset"].get("packed"))
    given = {
        "tune_batch_size": user_set(cfg, "batch_size", "batch_size"),
        "tune_gradient_accumulation_steps": user_set(
            cfg, "gradient_accumulation_steps", "gradient_accumulation_steps"
        ),
        "tune_epochs": user_set(cfg, "epochs", "epochs"),
        "tune_max_steps_per_epoch": user_set(cfg, "max_steps_per_epoch", "max_steps_per_epoch"),
    }
    batch, accumulation = (
        int(config.get("batch_size") or 1),
        int(config.get("gradient_accumulation_steps") or 1),
    )
    epochs, cap = int(config.get("epochs") or 1), config.get("max_steps_per_epoch")
    before = steps_per_epoch(samples, batch, accumulation, world, cap) * epochs
    if before >= MIN_OPTIMIZER_STEPS:
        return
    kind = _kind(config, packed)
    plan = (f"{samples} {kind} over batch {batch} x accumulation {accumulation} x {world} device(s) x {epochs} "
            f"epoch(s) plan {before} optimizer step(s)")  # fmt: skip

    fixed = run_floor.Given(
        batch=given["tune_batch_size"],
        accumulation=given["tune_gradient_accumulation_steps"],
        epochs=given["tune_epochs"] or given["tune_max_steps_per_epoch"],
    )

    def fit(count: int) -> tuple[int, int, int, int]:
        """(accumulation, batch, epochs, total steps) for `count` samples per epoch."""
        found = run_floor.fit(count, batch, accumulation, epochs, world, fixed,
                              lambda n, b, a: steps_per_epoch(n, b, a, world, cap))  # fmt: skip
        return found.accumulation, found.batch, found.epochs, found.total

    new_accumulation, new_batch, new_epochs, total = fit(samples)
    floor = f"at least {MIN_OPTIMIZER_STEPS} where the data allows (MIN_OPTIMIZER_STEPS)"
    # Few rows in few packs: one row per sample gives more steps than more passes over the same packs.
    if total < MIN_OPTIMIZER_STEPS and packed and not user_set(cfg, "packed", "dataset.packed"):
        unpacked = fit(lengths.num_rows)
        if unpacked[3] > total:
            config["dataset"]["packed"] = packed = False
            samples, kind = lengths.num_rows, _kind(config, packed)
            new_accumulation, new_batch, new_epochs, total = unpacked
            record(choices, Choice("packed", False, f"{plan}, {floor}; packing off (one row per sample) before "
                                   "anything else helps"))  # fmt: skip
    for setting, old, new, how in (
        ("gradient_accumulation_steps", accumulation, new_accumulation, "fewer accumulation steps first"),
        ("batch_size", batch, new_batch, "then a smaller micro-batch"),
        ("epochs", epochs, new_epochs, f"then more epochs, at most {MAX_DEFAULT_EPOCHS}"),
    ):
        if new != old:
            config[setting] = new
            moved = f"lowered from {old}" if new < old else f"raised from {old}"
            record(choices, Choice(setting, new, f"{moved}: {plan}, {floor}; {how}"))
    if total >= MIN_OPTIMIZER_STEPS:
        record(choices, Choice("optimizer steps", total, f"{floor}; before: {plan}"))
        return
    accepted = [name for name, is_set in given.items() if is_set]
    counted = (f"{samples} {kind} over batch {new_batch} x accumulation {new_accumulation} x {world} device(s)"
               f"{f' (at most {cap} per epoch)' if cap else ''} x {new_epochs} epoch(s) plan {total} optimizer "
               f"step(s)")  # fmt: skip
    if not accepted or total == 0:
        more = "rows" if not packed else "rows of this length"
        raise ConfigError(run_floor.too_little_data(
            counted, kind, more, total, "tune_epochs, tune_batch_size or tune_gradient_accumulation_steps"
        ))  # fmt: skip
    fixes = {
        "tune_batch_size": "lower tune_batch_size",
        "tune_gradient_accumulation_steps": "lower tune_gradient_accumulation_steps",
        "tune_epochs": "raise tune_epochs",
        "tune_max_steps_per_epoch": "raise tune_max_steps_per_epoch",
    }
    record(choices, Choice(
        "optimizer steps", total,
        f"{counted}, fewer than the {MIN_OPTIMIZER_STEPS} a run needs to learn reliably; kept as set "
        f"({', '.join(accepted)}): {', '.join(fixes[name] for name in accepted)} or add rows",
        warning=True,
    ))  # fmt: skip


def _kind(config: dict, packed: bool) -> str:
    return f"{config['tokenizer'].get('max_seq_len')}-token packs" if packed else "rows"


def base_tokens_per_step(base: dict, lengths: TokenLengths, base_world: int = 1) -> float:
    """Tokens the base config trains per optimizer step on the devices it was written for (`base_world`: its
    header's `--nproc_per_node`, installed.written_world_size): batch x accumulation x mean row length x
    devices."""
    mean = sum(lengths.lengths) / len(lengths.lengths)
    return (
        int(base.get("batch_size") or 1)
        * int(base.get("gradient_accumulation_steps") or 1)
        * mean
        * base_world
    )


def global_batch_ratio(
    config: dict, base: dict, world: int, lengths: TokenLengths | None, base_world: int = 1
) -> float | None:
    """Tokens per optimizer step over all devices, as a multiple of the base config's; None without lengths."""
    if lengths is None or not lengths.lengths:
        return None
    per_sample = (config["tokenizer"].get("max_seq_len") if config["dataset"].get("packed") else None) or sum(
        lengths.lengths
    ) / len(lengths.lengths)
    tokens = (
        int(config.get("batch_size") or 1) * int(config.get("gradient_accumulation_steps") or 1) * per_sample
    )
    return tokens * max(world, 1) / base_tokens_per_step(base, lengths, base_world)


def scale_learning_rate(
    config: dict,
    base: dict,
    cfg: TorchtuneConfig,
    world: int,
    lengths: TokenLengths | None,
    choices: list[Choice],
    base_world: int = 1,
) -> None:
    """The square-root rule (see the module docstring)."""
    ratio = global_batch_ratio(config, base, world, lengths, base_world)
    optimizer = config.get("optimizer") or {}
    base_lr = (base.get("optimizer") or {}).get("lr")
    if ratio is None or ratio <= GLOBAL_GROWTH_ACCEPTED or not isinstance(base_lr, (int, float)):
        return
    if "adam" not in str(optimizer.get("_component_", "")).lower():
        return
    factor = min(math.sqrt(ratio), LR_SCALE_CAP)
    scaled = square_root_rate(base_lr, ratio)
    grown = f"the global batch is {ratio:.1f}x the base config's tokens per optimizer step"
    rule = f"square-root rule, at most {LR_SCALE_CAP:g}x"
    if not user_set(cfg, "learning_rate", "optimizer.lr"):
        optimizer["lr"] = scaled
        record(choices, Choice("learning_rate", scaled, f"the base config's {base_lr:g} x {factor:.2f}: {grown} "
                               f"({rule}; set tune_learning_rate to choose another)"))  # fmt: skip
    elif float(optimizer.get("lr") or 0) < scaled:
        record(choices, Choice(
            "learning_rate", optimizer.get("lr"),
            f"{grown}, and a larger batch takes a larger rate: tune_learning_rate is kept as set, below the "
            f"{scaled:g} the {rule} gives from the base config's {base_lr:g}; raise tune_learning_rate, or lower "
            "tune_batch_size / tune_gradient_accumulation_steps",
            warning=True,
        ))  # fmt: skip


def fit_schedule(
    config: dict, cfg: TorchtuneConfig, world: int, lengths: TokenLengths | None, choices: list[Choice]
) -> None:
    """No step at lr 0, and a warmup no longer than WARMUP_CAP of the planned steps (see the module docstring)."""
    scheduler = config.get("lr_scheduler")
    if (
        isinstance(scheduler, dict)
        and scheduler.get("_component_") == TORCHTUNE_COSINE
        and not user_set(cfg, "lr_scheduler", "lr_scheduler._component_")
    ):
        scheduler["_component_"] = lr_schedule.COMPONENT
        record(choices, Choice("lr_scheduler", lr_schedule.COMPONENT, "torchtune's cosine schedule trains its "
                               "first step at lr 0; this one warms up from lr/(warmup+1), then the same cosine"))  # fmt: skip
    # Only from the data's lengths (the step's progress estimate also counts rows: finetune.py).
    steps = planned_steps(config, world, lengths) if lengths is not None else None
    if steps is None or user_set(cfg, "num_warmup_steps", "lr_scheduler.num_warmup_steps"):
        return
    if not scheduler and not user_set(cfg, "lr_scheduler", "lr_scheduler") and cfg.method == "full":
        warmup = max(1, round(WARMUP_NEW * steps))
        config["lr_scheduler"] = {"_component_": lr_schedule.COMPONENT, "num_warmup_steps": warmup}
        record(choices, Choice("lr_scheduler", f"cosine, {warmup} warmup steps", f"the base config's LR is "
                               f"constant; {WARMUP_NEW:.0%} warmup of {steps} planned steps, first step above lr 0"))  # fmt: skip
        return
    if isinstance(scheduler, dict) and isinstance(scheduler.get("num_warmup_steps"), int):
        cap = max(1, math.floor(WARMUP_CAP * steps))
        if scheduler["num_warmup_steps"] > cap:
            record(choices, Choice("num_warmup_steps", cap, f"the base config's {scheduler['num_warmup_steps']} "
                                   f"is over {WARMUP_CAP:.0%} of the {steps} planned optimizer steps"))  # fmt: skip
            scheduler["num_warmup_steps"] = cap
