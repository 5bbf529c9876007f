"""The typed torchtune run configuration: every field of the KEP-2401 TorchTuneConfig, plus what users of
torchtune reach for next (packing, sequence length, compile, seeds, free overrides).

`None` everywhere means "keep the value of the base torchtune config" — the recipe authors' tested defaults. The
component's parameters spell that `None` with the one "unset" convention of `_shared/unset.py` (-1, "", [], {},
"auto"); `finetune.component_settings` converts them.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError, SettingError, one_of
from kfp_finetune.components._shared.torchtune.dataset_node import DATASET_TYPES

METHODS = ("full", "lora", "qlora", "dora")
DTYPES = ("bf16", "fp16", "fp32")
DEVICES = ("cuda", "cpu", "xpu", "npu", "mps")
LORA_ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "output_proj")


@dataclass
class LoraSettings:
    """LoRA / QLoRA / DoRA adapter settings (ignored by full fine-tuning)."""

    lora_attn_modules: list[str] | None = None
    apply_lora_to_mlp: bool | None = None
    apply_lora_to_output: bool | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    quantize_base: bool | None = None
    use_dora: bool | None = None


@dataclass
class DatasetSettings:
    """How torchtune builds training examples from the data files."""

    dataset_type: str = "instruct"
    # instruct data: "input_output" (torchtune's instruct_dataset) or "alpaca" (instruction/input/output).
    data_style: str | None = None
    source: str | None = None
    data_files: list[str] | None = None
    split: str = "train"
    train_on_input: bool | None = None
    new_system_prompt: str | None = None
    column_map: dict[str, str] | None = None
    conversation_column: str | None = None
    conversation_style: str | None = None
    text_column: str | None = None


@dataclass
class TorchtuneConfig:
    method: str = "lora"
    recipe: str | None = None
    config: str | None = None
    device: str | None = None
    dtype: str | None = None
    batch_size: int | None = None
    epochs: int | None = None
    gradient_accumulation_steps: int | None = None
    loss: str | None = None
    optimizer: str | None = None
    optimizer_fused: bool | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    lr_scheduler: str | None = None
    num_warmup_steps: int | None = None
    enable_activation_checkpointing: bool | None = None
    enable_activation_offloading: bool | None = None
    lora: LoraSettings = field(default_factory=LoraSettings)
    dataset: DatasetSettings = field(default_factory=DatasetSettings)
    max_steps_per_epoch: int | None = None
    packed: bool | None = None
    max_seq_len: int | None = None
    compile: bool | None = None
    seed: int | None = None
    save_adapter_weights_only: bool | None = None
    log_every_n_steps: int | None = None
    # Resume (resume.py): None keeps the defaults (on; every 30 minutes; no step interval); 0 turns an interval off.
    resume: bool | None = None
    checkpoint_every_steps: int | None = None
    checkpoint_every_minutes: float | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.lora, dict):
            self.lora = LoraSettings(**self.lora)
        if isinstance(self.dataset, dict):
            self.dataset = DatasetSettings(**self.dataset)

    @property
    def is_peft(self) -> bool:
        return self.method != "full"

    def check(self) -> None:
        """Field-level checks that need neither the model nor torchtune: raise the first problem."""
        problems = self.problems()
        if problems:
            raise problems[0]

    def problems(self) -> list[SettingError]:
        """Every field-level problem (types, ranges, closed vocabularies, combinations), each naming its field."""
        found = [*_type_problems(self), *_finite_problems(self)]
        if self.overrides is None:
            found.append(SettingError("overrides", "must be a mapping of dotted torchtune keys to values"))
        if found:  # the range checks below compare values of the declared types
            return found
        found += one_of("method", self.method, METHODS)
        if self.dtype is not None:
            found += one_of("dtype", self.dtype, DTYPES)
        if self.device is not None:
            found += one_of("device", self.device, DEVICES)
        found += one_of("dataset_type", self.dataset.dataset_type, DATASET_TYPES)
        if self.dataset.dataset_type == "instruct" and self.dataset.data_style is not None:
            found += one_of("data_style", self.dataset.data_style, ("input_output", "alpaca"))
        if self.dataset.conversation_style is not None:
            found += one_of("conversation_style", self.dataset.conversation_style, ("openai", "sharegpt"))
        for name in (
            "batch_size",
            "epochs",
            "gradient_accumulation_steps",
            "max_steps_per_epoch",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                found.append(SettingError(name, f"must be at least 1 (got {value}){_unset_hint(value)}"))
        if self.learning_rate is not None and not self.learning_rate > 0:
            found.append(
                SettingError(
                    "learning_rate",
                    f"must be > 0 (got {self.learning_rate}), e.g. 2e-4 for LoRA"
                    f"{_unset_hint(self.learning_rate)}",
                )
            )
        if self.num_warmup_steps is not None and self.num_warmup_steps < 0:
            found.append(
                SettingError(
                    "num_warmup_steps",
                    f"must be >= 0 (got {self.num_warmup_steps}){_unset_hint(self.num_warmup_steps)}",
                )
            )
        if self.weight_decay is not None and not self.weight_decay >= 0:
            found.append(
                SettingError(
                    "weight_decay",
                    f"must be >= 0 (got {self.weight_decay}); typical values are 0-0.1"
                    f"{_unset_hint(self.weight_decay)}",
                )
            )
        if self.seed is not None and self.seed < 0:
            found.append(SettingError("seed", f"must be 0 or more (got {self.seed}){_unset_hint(self.seed)}"))
        for name in ("checkpoint_every_steps", "checkpoint_every_minutes"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                found.append(SettingError(name, f"must be 0 (no interval) or more (got {value})"))
        if self.log_every_n_steps is not None and self.log_every_n_steps < 1:
            found.append(
                SettingError("log_every_n_steps", f"must be at least 1 (got {self.log_every_n_steps})")
            )
        found += _lora_problems(self.lora)
        lora = self.lora
        if self.method == "full" and (lora.quantize_base or lora.use_dora):
            name, what, method = (
                ("quantize_base", "QLoRA", "qlora") if lora.quantize_base else ("use_dora", "DoRA", "dora")
            )
            found.append(
                SettingError(name, f"({what}) needs an adapter: set method to {method} instead of full")
            )
        if self.method == "qlora" and lora.quantize_base is False:
            found.append(
                SettingError(
                    "quantize_base",
                    "must not be false with method=qlora, which quantizes the base model: remove it, or set "
                    "method=lora",
                )
            )
        if self.method == "dora" and lora.use_dora is False:
            found.append(
                SettingError("use_dora", "must not be false with method=dora: remove it, or set method=lora")
            )
        return found


def _lora_problems(lora: LoraSettings) -> list[SettingError]:
    found = []
    if lora.lora_rank is not None and lora.lora_rank < 1:
        found.append(
            SettingError(
                "lora_rank",
                f"must be at least 1 (got {lora.lora_rank}); typical values are 8-64"
                f"{_unset_hint(lora.lora_rank)}",
            )
        )
    if lora.lora_alpha is not None and not lora.lora_alpha > 0:
        found.append(
            SettingError(
                "lora_alpha",
                f"must be > 0 (got {lora.lora_alpha}); usually twice the LoRA rank"
                f"{_unset_hint(lora.lora_alpha)}",
            )
        )
    if lora.lora_dropout is not None and not 0 <= lora.lora_dropout < 1:
        found.append(
            SettingError(
                "lora_dropout", f"must be in [0, 1) (got {lora.lora_dropout}){_unset_hint(lora.lora_dropout)}"
            )
        )
    if lora.lora_attn_modules is not None:
        unknown = sorted(set(lora.lora_attn_modules) - set(LORA_ATTN_MODULES))
        if unknown or not lora.lora_attn_modules:
            found.append(
                SettingError(
                    "lora_attn_modules",
                    f"has {unknown or 'no modules'}; choose from {', '.join(LORA_ATTN_MODULES)}",
                )
            )
    return found


@functools.cache
def _declared_types() -> dict[str, tuple[type, type]]:
    """Each field's declared type (TorchtuneConfig and its groups), as the field name -> (class, its group)."""
    import types
    import typing

    found = {}
    for cls in (TorchtuneConfig, LoraSettings, DatasetSettings):
        for name, hint in typing.get_type_hints(cls).items():
            args = (
                typing.get_args(hint)
                if typing.get_origin(hint) in (typing.Union, types.UnionType)
                else (hint,)
            )
            kinds = [typing.get_origin(a) or a for a in args if a is not type(None)]
            if len(kinds) == 1 and kinds[0] in (int, float, str, bool, list, dict):
                found[name] = (kinds[0], cls)
    return found


_KIND_NAMES = {int: "an integer", float: "a number", str: "text", bool: "true or false", list: "a list",
               dict: "a mapping"}  # fmt: skip


def _holder(config: TorchtuneConfig, cls: type) -> object:
    return {LoraSettings: config.lora, DatasetSettings: config.dataset}.get(cls, config)


def _type_problems(config: TorchtuneConfig) -> list[SettingError]:
    found = []
    for name, (kind, cls) in _declared_types().items():
        value = getattr(_holder(config, cls), name)
        if value is None:
            continue
        fits = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            fits = True  # 1 for 1.0
        if not fits:
            found.append(
                SettingError(name, f"must be {_KIND_NAMES[kind]} (got {type(value).__name__} {value!r})")
            )
    return found


def _finite_problems(config: TorchtuneConfig) -> list[SettingError]:
    found = []
    for name, (kind, cls) in _declared_types().items():
        value = getattr(_holder(config, cls), name)
        if kind is float and isinstance(value, float) and not math.isfinite(value):
            found.append(SettingError(name, f"must be a finite number (got {value})"))
    return found


# On/off settings: the component takes them as "auto" | "true" | "false" text (see _shared/unset.py).
SWITCHES = frozenset(
    f.name
    for cls in (TorchtuneConfig, LoraSettings, DatasetSettings)
    for f in fields(cls)
    if f.type == "bool | None"
)


def _unset_hint(value: object) -> str:
    """How to keep the base config's value: the unset sentinel (-1) where it was not the value given (the CLI
    takes -1 as a value; there a setting is unset by leaving it out)."""
    if value == -1:
        return "; leave it out to keep the base config's"
    return "; -1 keeps the base config's"


def parse_value(text: str) -> Any:
    """A command-line value as YAML, reading `3e-4` as a float the way torchtune's OmegaConf does."""
    import yaml

    value = yaml.safe_load(text)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


_NESTED = {"lora": LoraSettings, "dataset": DatasetSettings}
#: The step's settings only another engine reads, and why torchtune does not: refused by name, never dropped.
OTHER_ENGINES_SETTINGS = {
    "lora_target_parameters": "its LoRA adapts linear layers only, no 3D parameter such as a mixture-of-experts' "
    "fused experts",
}


def other_engines_settings(values: dict[str, Any]) -> list[SettingError]:
    """A problem for each setting in `values` that only another engine reads."""
    return [
        SettingError(name, f"is not read by torchtune ({why}): unset it, or set tune_engine=transformers")
        for name, why in OTHER_ENGINES_SETTINGS.items()
        if values.get(name) is not None
    ]


def from_flat(values: dict[str, Any], unknown_to_overrides: bool = False) -> TorchtuneConfig:
    """A TorchtuneConfig from flat names (`lora_rank`, `column_map`, `learning_rate`, ...) as KFP parameters and
    CLI flags give them. Unknown names are an error, or torchtune overrides when `unknown_to_overrides`."""
    top = {f.name for f in fields(TorchtuneConfig)} - set(_NESTED)
    nested_names = {f.name: group for group, cls in _NESTED.items() for f in fields(cls)}
    kwargs: dict[str, Any] = {group: {} for group in _NESTED}
    overrides = values.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(
            f"tune_overrides must be a mapping of dotted torchtune keys to values, e.g. {{'clip_grad_norm': 1.0}} "
            f"(got {type(overrides).__name__} {overrides!r})"
        )
    overrides = dict(overrides)
    if refused := other_engines_settings(values):
        raise refused[0]
    for name, value in values.items():
        if name == "overrides":
            continue
        if name in top:
            kwargs[name] = value
        elif name in nested_names:
            kwargs[nested_names[name]][name] = value
        elif unknown_to_overrides:
            overrides[name] = value
        else:
            raise ConfigError(
                f"unknown setting {name!r}; known: {', '.join(sorted(top | set(nested_names)))}"
            )
    return TorchtuneConfig(**kwargs, overrides=overrides)
