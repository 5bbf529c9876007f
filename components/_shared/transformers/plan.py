"""The transformers engine's plan for one run, from the fine-tune step's own settings: the settings it trains with
(SftSettings, written to `<run>/sft_settings.json`) and the command that trains them, locally or in a TrainJob.

The step's settings arrive under its flat names (`learning_rate`, `lora_rank`, `enable_activation_checkpointing`;
the pipelines call them `tune_<name>`), unset ones as None (_shared/unset.py). A setting only torchtune reads
(`recipe`, `overrides`, `compile`, ...) is refused by its pipeline name with the fix, never silently dropped.
`plan_run` checks everything that needs neither torch nor the weights: it runs before any download or TrainJob.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.transformers import run_layout, run_length
from kfp_finetune.components._shared.transformers.rows import count_rows
from kfp_finetune.components._shared.transformers.seq_len import positions
from kfp_finetune.components._shared.transformers.settings import SftSettings
from kfp_finetune.components._shared.workspace import write_json_atomic

MODULE = "kfp_finetune.components._shared.transformers.train"
SETTINGS_FILE = "sft_settings.json"
#: The step's settings this engine reads -> its SftSettings field.
READ = {
    "method": "method",
    "epochs": "epochs",
    "batch_size": "batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "learning_rate": "learning_rate",
    "num_warmup_steps": "warmup_steps",
    "lora_rank": "lora_rank",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "lora_target_parameters": "target_parameters",
    "dataset_type": "dataset_type",
    "column_map": "column_map",
    "max_seq_len": "max_seq_len",
    "seed": "seed",
    "packed": "packing",
    "enable_activation_checkpointing": "gradient_checkpointing",
    "device": "device",
    "checkpoint_every_steps": "checkpoint_every_steps",
    "checkpoint_every_minutes": "checkpoint_every_minutes",
    "max_steps_per_epoch": "max_steps_per_epoch",
}
#: Settings read here under a rule of their own: dtype is bf16 or not; conversation_style is how chat rows are
#: written (a data style).
COMBINED = ("dtype", "conversation_style")
#: dataset-initialize's hints of a column's name (DatasetSplit.torchtune_hints) -> the column the engine reads.
_HINTED_COLUMNS = {"conversation_column": "messages", "text_column": "text"}
_DTYPES = {"bf16": True, "fp32": False}


@dataclass(frozen=True)
class SftRun:
    """One planned transformers-engine run: its settings and where they are written."""

    settings: SftSettings
    world: int  # processes over all nodes
    # This wing's face.NAME: the TrainJob's node pod checks and runs the command with it.
    engine: ClassVar[str] = "transformers"

    @property
    def run_dir(self) -> Path:
        return Path(self.settings.output_dir)

    @property
    def settings_path(self) -> Path:
        return self.run_dir / SETTINGS_FILE

    @property
    def resolved_path(self) -> Path:
        """What the run trained with, TRL's arguments included (train.py writes it)."""
        return self.run_dir / run_layout.RESOLVED_CONFIG

    @property
    def recipe(self) -> str:
        """The training entry point, as the model metadata's `recipe` names torchtune's."""
        return MODULE

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / run_layout.METRICS_FILE

    @property
    def model_path(self) -> Path:
        return Path(self.settings.model_dir)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def command(self, torchrun_args: list[str] | tuple[str, ...] = ()) -> list[str]:
        """`python -m <train module> <settings>`; with torchrun flags, torchrun starts one process per device
        (never `accelerate launch`: Kubeflow's TRL proof of concept found it trained at world size 1)."""
        if torchrun_args:
            return ["torchrun", *torchrun_args, "-m", MODULE, str(self.settings_path)]
        return ["python", "-m", MODULE, str(self.settings_path)]


def sft_settings(
    values: dict[str, Any],
    *,
    model_dir: str | os.PathLike,
    data_files: list[str],
    run_dir: str | os.PathLike,
    data_hints: dict[str, str] | None = None,
    num_rows: int | None = None,
    world: int = 1,
) -> SftSettings:
    """SftSettings from the step's flat settings (None: this engine's default) and how dataset-initialize wrote the
    rows (`data_hints`: its dataset_type, data_style and column names; a setting the user gave wins), checked; the
    first problem is raised as a SettingError of the pipeline parameter (`tune_<name>`), with the fix."""
    given = {k: v for k, v in values.items() if v is not None and v != {} and v != []}
    unread = [f"tune_{name}" for name in sorted(set(given) - set(READ) - set(COMBINED))]
    if unread:
        also = f" (nor {', '.join(unread[1:])})" if unread[1:] else ""
        raise SettingError(
            unread[0],
            f"is a torchtune setting the transformers engine does not read{also}: unset it, or set "
            "tune_engine=torchtune for a model torchtune serves",
        )
    fields: dict[str, Any] = {READ[k]: v for k, v in given.items() if k in READ}
    hints = data_hints or {}
    if hints.get("dataset_type"):
        fields.setdefault("dataset_type", hints["dataset_type"])
    if hints.get("image_tag") is not None:
        fields["image_tag"] = hints["image_tag"]
    style = given.get("conversation_style") or hints.get("data_style")
    if style:
        fields["data_style"] = style
    hinted = {read: hints[hint] for hint, read in _HINTED_COLUMNS.items() if hints.get(hint)}
    fields["column_map"] = {**hinted, **fields.get("column_map", {})}
    if "dtype" in given:
        if given["dtype"] not in _DTYPES:
            raise SettingError(
                "tune_dtype", f"must be bf16 or fp32 on the transformers engine (got {given['dtype']!r})"
            )
        fields["bf16"] = _DTYPES[given["dtype"]]
    _check_positions(fields, model_dir)
    planned = run_length.fit_run_length(fields, set(given), num_rows, world)
    settings = SftSettings(
        model_dir=str(model_dir),
        data_files=list(data_files),
        output_dir=str(run_dir),
        planned=planned,
        **fields,
    )
    problems = settings.problems()
    if problems:
        raise by_parameter(problems[0])
    return settings


def _check_positions(fields: dict[str, Any], model_dir: str | os.PathLike) -> None:
    """A max_seq_len the user set within the model's positions (seq_len.positions; the training process caps its
    own choice there): a model with learned positions (BERT: 512) fails on the first row longer than them, a rotary
    one was never trained there. Nothing to check where no config.json is at hand (pre-flight's check of the
    settings alone)."""
    asked = fields.get("max_seq_len")
    if not isinstance(asked, int) or isinstance(asked, bool):
        return
    try:
        limit = positions(engines.model_config(model_dir))
    except ConfigError:
        return
    if limit is not None and asked > limit:
        raise SettingError("tune_max_seq_len", f"is {asked}, more than the {limit} positions the model has "
                                               f"(config.json max_position_embeddings): set it to {limit} or less, "
                                               "or leave it unset")  # fmt: skip


def preview(
    values: dict[str, Any],
    *,
    model_dir: str | os.PathLike,
    data_files: list[str],
    run_dir: str | os.PathLike,
    devices: int = 1,
    nodes: int = 1,
) -> str:
    """The `sft_settings.json` plan_run would write for these settings, as text; nothing is written (resolve-
    config). Refused as plan_run refuses; where the data files are here, their rows plan the run's length as the
    fine-tune step's row count does."""
    where = {"model_dir": model_dir, "data_files": data_files, "run_dir": run_dir}
    settings = sft_settings(values, **where)
    if all(Path(path).is_file() for path in data_files):
        try:
            rows = count_rows(settings)
        except ValueError as error:  # columns the settings do not find, formats mixed
            raise ConfigError(str(error)) from None
        settings = sft_settings(values, **where, num_rows=rows, world=devices * nodes)
    return json.dumps(asdict(settings), indent=2) + "\n"


def check_settings(values: dict[str, Any], model_dir: str | os.PathLike = "model") -> None:
    """The step's settings checked as `plan_run` checks them, where no data is at hand (pre-flight); `model_dir`:
    a folder with the model's config.json, or none."""
    sft_settings(values, model_dir=model_dir, data_files=["data.parquet"], run_dir="run")


def plan_run(
    values: dict[str, Any],
    *,
    model_dir: str | os.PathLike,
    data_files: list[str],
    run_dir: str | os.PathLike,
    data_hints: dict[str, str] | None = None,
    devices: int = 1,
    nodes: int = 1,
    write: bool = True,
    num_rows: int | None = None,
) -> SftRun:
    """The checked run, its settings written into the run folder for the training command to read (`write`
    False: a preview, nothing written); `num_rows`, the training rows where known, plans the run's length
    (run_length.py)."""
    settings = sft_settings(
        values, model_dir=model_dir, data_files=data_files, run_dir=run_dir, data_hints=data_hints,
        num_rows=num_rows, world=devices * nodes,
    )  # fmt: skip
    run = SftRun(settings, devices * nodes)
    if write:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run.settings_path, asdict(run.settings))
    return run


def by_parameter(problem: SettingError) -> SettingError:
    """A problem with an SftSettings field, named by the pipeline parameter that sets it (the field's own name
    where the step has no such setting)."""
    step = next((step for step, field in READ.items() if field == problem.setting), problem.setting)
    return SettingError(f"tune_{step}", problem.problem)
