"""The typed torchtune run configuration: every field of the KEP-2401 TorchTuneConfig, plus what users of
torchtune reach for next (packing, sequence length, compile, seeds, free overrides).

`None` everywhere means "keep the value of the base torchtune config" — the recipe authors' tested defaults. The
component's parameters spell that `None` with the one "unset" convention of `_shared/unset.py` (-1, "", [], {},
"auto"); `finetune.component_settings` converts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError

METHODS = ("full", "lora", "qlora", "dora")
DATASET_TYPES = ("instruct", "chat", "text")
DTYPES = ("bf16", "fp16", "fp32")
DEVICES = ("cuda", "cpu", "xpu", "npu", "mps")


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
        """Field-level checks that need neither the model nor torchtune."""
        _one_of("method", self.method, METHODS)
        if self.dtype is not None:
            _one_of("dtype", self.dtype, DTYPES)
        if self.device is not None:
            _one_of("device", self.device, DEVICES)
        _one_of("dataset_type", self.dataset.dataset_type, DATASET_TYPES)
        if self.dataset.dataset_type == "instruct" and self.dataset.data_style not in (
            None,
            "input_output",
            "alpaca",
        ):
            raise ConfigError(
                f"data_style for instruct data must be input_output or alpaca (got {self.dataset.data_style!r})"
            )
        if self.dataset.conversation_style not in (None, "openai", "sharegpt"):
            raise ConfigError(
                f"conversation_style must be openai or sharegpt (got {self.dataset.conversation_style!r})"
            )
        for name in (
            "batch_size",
            "epochs",
            "gradient_accumulation_steps",
            "max_steps_per_epoch",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1 (got {value}){_UNSET_HINT}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise ConfigError(f"learning_rate must be > 0 (got {self.learning_rate}){_UNSET_HINT}")
        if self.num_warmup_steps is not None and self.num_warmup_steps < 0:
            raise ConfigError(f"num_warmup_steps must be >= 0 (got {self.num_warmup_steps}){_UNSET_HINT}")
        if self.weight_decay is not None and not self.weight_decay >= 0:
            raise ConfigError(
                f"weight_decay must be >= 0 (got {self.weight_decay}); typical values are 0-0.1{_UNSET_HINT}"
            )
        if self.seed is not None and self.seed < 0:
            raise ConfigError(
                f"seed must be 0 or more (got {self.seed}); leave it unset (-1 in the component) for the base "
                "config's"
            )
        if self.log_every_n_steps is not None and self.log_every_n_steps < 1:
            raise ConfigError(f"log_every_n_steps must be at least 1 (got {self.log_every_n_steps})")
        lora = self.lora
        if lora.lora_rank is not None and lora.lora_rank < 1:
            raise ConfigError(
                f"lora_rank must be at least 1 (got {lora.lora_rank}); typical values are 8-64{_UNSET_HINT}"
            )
        if lora.lora_alpha is not None and not lora.lora_alpha > 0:
            raise ConfigError(
                f"lora_alpha must be > 0 (got {lora.lora_alpha}); usually twice lora_rank{_UNSET_HINT}"
            )
        if lora.lora_dropout is not None and not 0 <= lora.lora_dropout < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1) (got {lora.lora_dropout}){_UNSET_HINT}")
        if lora.lora_attn_modules is not None:
            unknown = sorted(set(lora.lora_attn_modules) - {"q_proj", "k_proj", "v_proj", "output_proj"})
            if unknown or not lora.lora_attn_modules:
                raise ConfigError(
                    f"lora_attn_modules has {unknown or 'no modules'}; choose from q_proj, k_proj, v_proj, output_proj"
                )
        if self.method == "full" and (lora.quantize_base or lora.use_dora):
            what = "quantize_base (QLoRA)" if lora.quantize_base else "use_dora (DoRA)"
            raise ConfigError(f"{what} needs an adapter: set method to qlora/dora instead of full")
        if self.method == "qlora" and lora.quantize_base is False:
            raise ConfigError(
                "method=qlora quantizes the base model; remove quantize_base=False or use method=lora"
            )
        if self.method == "dora" and lora.use_dora is False:
            raise ConfigError("method=dora needs use_dora; remove use_dora=False or use method=lora")
        if self.overrides is None or not isinstance(self.overrides, dict):
            raise ConfigError("overrides must be a mapping of dotted torchtune keys to values")


# On/off settings: the component takes them as "auto" | "true" | "false" text (see _shared/unset.py).
SWITCHES = frozenset(
    f.name
    for cls in (TorchtuneConfig, LoraSettings, DatasetSettings)
    for f in fields(cls)
    if f.type == "bool | None"
)

_UNSET_HINT = "; -1 keeps the base config's"


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)} (got {value!r})")


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


def from_flat(values: dict[str, Any], unknown_to_overrides: bool = False) -> TorchtuneConfig:
    """A TorchtuneConfig from flat names (`lora_rank`, `column_map`, `learning_rate`, ...) as KFP parameters and
    CLI flags give them. Unknown names are an error, or torchtune overrides when `unknown_to_overrides`."""
    top = {f.name for f in fields(TorchtuneConfig)} - set(_NESTED)
    nested_names = {f.name: group for group, cls in _NESTED.items() for f in fields(cls)}
    kwargs: dict[str, Any] = {group: {} for group in _NESTED}
    overrides = values.get("overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(
            f"overrides must be a mapping of dotted torchtune keys to values, e.g. {{'clip_grad_norm': 1.0}} "
            f"(got {type(overrides).__name__} {overrides!r})"
        )
    overrides = dict(overrides)
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
