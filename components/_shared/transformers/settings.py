"""The transformers engine's typed settings, checked and turned into TRL's `SFTConfig` and PEFT's `LoraConfig`
before any model is downloaded or loaded: this is the engine's early validation.

`SftSettings.check()` raises the first problem as a SettingError that names the field and the fix;
`trl_config()` builds the TRL/PEFT objects (importing transformers and torch, but reading no weights) and
`resolved()` is what the run records in `<run>/trl_config.json`. Module import needs neither torch nor TRL.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.data_formats import FORMATS, TEXT_DATASET_TYPES
from kfp_finetune.components._shared.engines import CLASSIFICATION, GENERATION, IMAGE_TEXT
from kfp_finetune.components._shared.errors import ConfigError, SettingError, one_of
from kfp_finetune.components._shared.transformers import fast
from kfp_finetune.components._shared.transformers.fast import AUTO, SWITCH_CHOICES

_READ_FORMATS = ("parquet", "json")

#: The peak learning rate of a run that leaves it unset, for fast.PLANNED_BATCH rows per device and step: LoRA's
#: customary 2e-4 (PEFT's and TRL's LoRA examples).
DEFAULT_LEARNING_RATE = 2e-4
#: CLASSIFICATION is also the data type of sequence-classification rows (dataset-initialize's labels.py): a text,
#: optionally a second one, and a class id.
#: Instruct or chat rows with a list of images each (dataset-initialize's images.py: `images`, embedded Image
#: structs), trained into a vision-language model (vision.py).
MULTIMODAL = "multimodal"
IMAGES = "images"
DATASET_TYPES = (*TEXT_DATASET_TYPES, MULTIMODAL, CLASSIFICATION)
#: dora: LoRA with its weight-decomposed magnitude (PEFT use_dora; torchtune's dora).
METHODS = ("lora", "qlora", "dora", "full")
DEVICES = ("auto", "cpu", "cuda")
#: The columns each dataset type reads, under these names unless column_map renames them (as torchtune's
#: builders take column_map: {"input": "question"} reads the input from the `question` column).
#: The Trainer's own output folder inside the run (SFTConfig.output_dir); run_layout.py names the run's outputs.
TRAINER_DIR = "trainer"
COLUMNS = {
    "instruct": ("input", "output"),
    "chat": ("messages",),
    "text": ("text",),
    CLASSIFICATION: ("text", "label"),
}
#: Columns read when the data has them: the second text of a sentence-pair classification.
OPTIONAL_COLUMNS = {CLASSIFICATION: ("text_pair",)}
#: How dataset-initialize wrote the rows (its `data_style`); "" reads COLUMNS as they are. Alpaca rows keep their
#: `instruction` (and optional `input`); ShareGPT turns are {"from", "value"} (read as OpenAI roles).
DATA_STYLES = ("", "input_output", "alpaca", "openai", "sharegpt", "text", CLASSIFICATION)
_STYLE_COLUMNS = {"alpaca": ("instruction", "input", "output")}
#: The data styles of conversations (multimodal rows are instruct rows otherwise).
_CHAT_STYLES = ("openai", "sharegpt")


@dataclass
class SftSettings:
    model_dir: str  # the base model's HF folder (config, safetensors, tokenizer files)
    data_files: list[str]  # parquet or JSON Lines files of the training split
    output_dir: str  # the run folder (run_layout.py names what goes in it)
    dataset_type: str = "instruct"
    column_map: dict[str, str] = field(default_factory=dict)
    method: str = "lora"
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.0
    # "all-linear" is PEFT's every nn.Linear but the output layer; MoE experts stored as 3D parameters (Qwen3-MoE in
    # transformers 5) are not nn.Linear: name them in target_parameters to adapt them too.
    target_modules: str | list[str] = "all-linear"
    target_parameters: list[str] = field(default_factory=list)
    # auto: DEFAULT_LEARNING_RATE, raised where the training process's micro-batch grows (run_length.py).
    learning_rate: float | str = AUTO
    epochs: int = 1
    max_steps: int | None = None  # None: train `epochs` epochs; else stop after this many optimizer steps
    # torchtune's cap: each epoch at most this many optimizer steps, so the run trains min(cap, the data's steps
    # per epoch) x epochs steps (train.py counts the data's: HF's max_steps alone would repeat the data to reach
    # cap x epochs). max_steps, where set, wins.
    max_steps_per_epoch: int | None = None
    # What the planner chose for the run's length where the step left it unset (run_length.py), with its reasons.
    planned: list[dict] = field(default_factory=list)
    # per device; auto: the training process chooses from max_seq_len, the model and its GPU (fast.py).
    batch_size: int | str = AUTO
    gradient_accumulation_steps: int = 1
    # auto: the training process chooses from the rows' token lengths and the model's positions (seq_len.py).
    max_seq_len: int | str = AUTO
    # auto: the training process chooses from its hardware and the model (fast.py), with its reasons.
    packing: bool | str = AUTO
    gradient_checkpointing: bool | str = AUTO  # TRL's default is on; off is faster where memory allows (§7)
    liger_kernel: bool | str = AUTO
    # auto: on several GPUs, FSDP2 where one GPU cannot hold a whole training replica, else DDP (fast.py).
    fsdp: bool | str = AUTO
    # Resume (train.py): a checkpoint every N optimizer steps (0: none), every M minutes (0: none) and on SIGTERM.
    checkpoint_every_steps: int = 0
    checkpoint_every_minutes: float = 30.0
    data_style: str = ""  # dataset-initialize's data_style (DATA_STYLES)
    # Multimodal rows: the placeholder in the text standing for the row's images in order ("": none, the images
    # come before the first user turn's text), as dataset-initialize checked it.
    image_tag: str = "<image>"
    bf16: str | bool = "auto"  # auto: bf16 mixed precision where the GPU supports it, fp32 elsewhere
    device: str = "auto"  # auto: the GPUs where CUDA has any, else the CPU
    seed: int = 0
    logging_steps: int = 1
    warmup_steps: int = 0
    lr_scheduler: str = "cosine"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SftSettings:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(
                f"unknown transformers-engine setting(s) {', '.join(unknown)}: known are {', '.join(sorted(known))}"
            )
        missing = sorted(n for n in ("model_dir", "data_files", "output_dir") if n not in values)
        if missing:
            raise ConfigError(f"the transformers-engine settings need {', '.join(missing)}")
        return cls(**values)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> SftSettings:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON ({e}): write the settings as one JSON object") from e

    @property
    def step_budget(self) -> int | None:
        """The most optimizer steps the run trains (`max_steps`, or the cap per epoch x epochs), None: all epochs."""
        if self.max_steps is not None:
            return self.max_steps
        return self.max_steps_per_epoch * self.epochs if self.max_steps_per_epoch is not None else None

    def check(self) -> None:
        """Field-level checks that need neither the model nor TRL: raise the first problem."""
        problems = self.problems()
        if problems:
            raise problems[0]

    def problems(self) -> list[SettingError]:
        found = (
            one_of("dataset_type", self.dataset_type, DATASET_TYPES)
            + one_of("method", self.method, METHODS)
            + one_of("device", self.device, DEVICES)
            + one_of("data_style", self.data_style, DATA_STYLES)
        )
        for name in ("bf16", "packing", "gradient_checkpointing", "liger_kernel", "fsdp"):
            if getattr(self, name) not in SWITCH_CHOICES:
                found.append(SettingError(name, f"must be auto, true or false (got {getattr(self, name)!r})"))
        if not self.model_dir:
            found.append(SettingError("model_dir", "is empty: give the base model's HF folder"))
        if not self.output_dir:
            found.append(SettingError("output_dir", "is empty: give the run folder to write into"))
        if not isinstance(self.data_files, list | tuple) or not self.data_files:
            found.append(SettingError("data_files", "must list at least one .parquet or .jsonl file"))
        else:
            for path in self.data_files:
                if data_format(path) is None:
                    found.append(
                        SettingError("data_files", f"has {path!r}: use .parquet, .jsonl or .json files")
                    )
        at_least_one = ["epochs", "gradient_accumulation_steps", "logging_steps"]
        at_least_one += [name for name in ("batch_size", "max_seq_len") if getattr(self, name) != AUTO]
        if self.method != "full":
            at_least_one.append("lora_rank")
        at_least_one += [
            name for name in ("max_steps", "max_steps_per_epoch") if getattr(self, name) is not None
        ]
        for name in at_least_one:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                found.append(SettingError(name, f"must be a whole number of at least 1 (got {value!r})"))
        for name in ("seed", "warmup_steps", "checkpoint_every_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                found.append(SettingError(name, f"must be a whole number, 0 or more (got {value!r})"))
        if not _number(self.checkpoint_every_minutes) or self.checkpoint_every_minutes < 0:
            found.append(SettingError("checkpoint_every_minutes",
                                      f"must be a number, 0 or more (got {self.checkpoint_every_minutes!r})"))  # fmt: skip
        if self.learning_rate != AUTO and not _positive(self.learning_rate):
            found.append(
                SettingError("learning_rate", f"must be a number above 0 (got {self.learning_rate!r})")
            )
        if self.method != "full":
            if not _positive(self.lora_alpha):
                found.append(
                    SettingError("lora_alpha", f"must be a number above 0 (got {self.lora_alpha!r})")
                )
            if not _number(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
                found.append(SettingError("lora_dropout", f"must be in [0, 1) (got {self.lora_dropout!r})"))
            if not self.target_modules:
                found.append(SettingError("target_modules", "is empty: use all-linear or list module names"))
            if self.target_parameters and self.method == "dora":
                # PEFT's lora.ParamWrapper refuses use_dora, as it wraps the model.
                found.append(SettingError("target_parameters", "cannot be adapted with DoRA (PEFT has no DoRA for "
                                                               "a parameter's adapter): use method lora, or empty "
                                                               "it"))  # fmt: skip
            if self.target_parameters and _number(self.lora_dropout) and self.lora_dropout > 0:
                # PEFT's lora.ParamWrapper cannot factor the input out of lora_B(lora_A(dropout(x))).
                found.append(SettingError("lora_dropout", "must be 0 where LoRA adapts 3D parameters (PEFT has no "
                                                          "dropout for a parameter's adapter): set it to 0"))  # fmt: skip
            if not isinstance(self.target_parameters, list) or not all(
                isinstance(name, str) and name.strip() for name in self.target_parameters
            ):
                found.append(SettingError("target_parameters", "must be a list of parameter names within a layer, "
                                                               "e.g. [\"mlp.experts.gate_up_proj\"] (got "
                                                               f"{self.target_parameters!r})"))  # fmt: skip
        elif self.target_parameters:
            found.append(
                SettingError("target_parameters", "needs an adapter: set method to lora, or remove it")
            )
        if not isinstance(self.column_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.column_map.items()
        ):
            found.append(SettingError("column_map", "must map column names to column names"))
        elif self.row_kind in COLUMNS:
            extra = sorted(
                set(self.column_map) - {*self.columns(), *OPTIONAL_COLUMNS.get(self.dataset_type, ())}
            )
            if extra:
                found.append(
                    SettingError(
                        "column_map",
                        f"maps {', '.join(extra)}, which {self.dataset_type} data does not read: its columns "
                        f"are {', '.join(self.columns())}",
                    )
                )
        if self.task == CLASSIFICATION and self.packing is True:
            found.append(SettingError("packing", "packs causal-LM sequences; a classifier reads one padded row "
                                                 "per example: set it false or auto"))  # fmt: skip
        if self.task == IMAGE_TEXT and self.packing is True:
            found.append(SettingError("packing", "cannot pack image + text rows (TRL trains a vision-language "
                                                 "model on whole rows with their images): set it false or auto"))  # fmt: skip
        if self.fsdp is True and self.method == "qlora":
            found.append(
                SettingError("fsdp", "cannot shard QLoRA's 4-bit weights here: set it false or auto")
            )
        if self.fsdp is True and self.device == "cpu":
            found.append(SettingError("fsdp", "shards GPU runs only (accelerate trains CPU processes data-"
                                              "parallel): set it false or auto"))  # fmt: skip
        if not isinstance(self.image_tag, str):
            found.append(SettingError("image_tag", f"must be text (got {self.image_tag!r})"))
        return found

    @property
    def task(self) -> str:
        """What the run learns: `classification` (a sequence classifier), `image-text-to-text` (a vision-language
        model) or `generation` (a causal LM)."""
        return {CLASSIFICATION: CLASSIFICATION, MULTIMODAL: IMAGE_TEXT}.get(self.dataset_type, GENERATION)

    @property
    def row_kind(self) -> str:
        """How the rows read, whatever else they carry: multimodal rows are chat or instruct rows with images."""
        if self.dataset_type == MULTIMODAL:
            return "chat" if self.data_style in _CHAT_STYLES else "instruct"
        return self.dataset_type

    def columns(self) -> tuple[str, ...]:
        """The columns the rows are read from, by their names before column_map."""
        images = (IMAGES,) if self.dataset_type == MULTIMODAL else ()
        if self.row_kind == "instruct" and self.data_style in _STYLE_COLUMNS:
            return _STYLE_COLUMNS[self.data_style] + images
        return COLUMNS[self.row_kind] + images

    def column(self, name: str) -> str:
        """The dataset column the engine reads as `name` (column_map applied)."""
        return self.column_map.get(name, name)

    def use_bf16(self) -> bool:
        """bf16 resolved: auto is on where a CUDA GPU supports it (imports torch)."""
        if self.bf16 != "auto":
            return bool(self.bf16)
        if self.device == "cpu":
            return False
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()

    def trl_config(self, world_size: int = 1) -> tuple[Any, Any]:
        """TRL's SFTConfig and PEFT's LoraConfig (None for full) for these settings; no model is read. Building
        them runs TRL's and transformers' own argument checks, so a bad combination fails here, before training.
        (A new SFTConfig resets accelerate's process state: build none between a trainer's creation and its run.)"""
        self.check()
        if self.packing is True and importlib.util.find_spec("flash_attn") is None:
            # TRL packs rows padding-free (position ids restart per row); flash attention keeps the rows of a pack
            # apart, while SDPA lets each row attend to the rows packed before it (measured with transformers 5.24
            # on the tiny Qwen3-MoE: the second row's logits moved by 0.5).
            raise SettingError(
                "packing",
                "needs flash attention (the flash-attn package) to keep packed rows apart: set it false",
            )
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise SettingError("device", "is cuda, but CUDA sees no GPU here: set it to auto or cpu")
        bf16 = self.use_bf16()
        chosen = {choice.setting: choice.value for choice in self.fast_choices(world_size)}
        checkpointing = chosen.get("gradient_checkpointing", self.gradient_checkpointing)
        sharded = chosen.get("fsdp", self.fsdp) is True and world_size > 1
        common = dict(
            output_dir=str(Path(self.output_dir) / TRAINER_DIR),
            num_train_epochs=self.epochs,
            max_steps=self.step_budget or -1,  # the cap per epoch: train.py lowers it to what the data has
            per_device_train_batch_size=self.micro_batch(),
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            learning_rate=self.rate(),
            lr_scheduler_type=self.lr_scheduler,
            warmup_steps=self.warmup_steps,
            # Under FSDP2 its own activation checkpointing (fsdp_arguments): the Trainer's would gather each
            # layer's weights once more in the backward pass (transformers' own warning, issue 30404).
            gradient_checkpointing=checkpointing and not sharded,
            **(fsdp_arguments(checkpointing) if sharded else {}),
            use_liger_kernel=chosen.get("liger_kernel", self.liger_kernel),
            train_sampling_strategy=chosen.get("train_sampling_strategy", "random"),
            bf16=bf16,
            fp16=False,
            use_cpu=self.device == "cpu" or not torch.cuda.is_available(),
            seed=self.seed,
            data_seed=self.seed,
            logging_steps=self.logging_steps,
            # Checkpoints only for resuming (train.py: also on time and SIGTERM); the run's outputs are written by
            # train.py, in run_layout's names.
            save_strategy="steps" if self.checkpoint_every_steps else "no",
            save_steps=self.checkpoint_every_steps or 500,  # 500 (transformers' default): unused with "no"
            save_total_limit=1,
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
            # A vision-language model's tower gets no gradient from a text-only batch: TRL then has DDP look for
            # unused parameters (None lets it).
            ddp_find_unused_parameters=False if world_size > 1 and self.task == GENERATION else None,
        )
        if self.task == CLASSIFICATION:  # transformers' own Trainer trains the classifier (classify.py)
            from transformers import TrainingArguments

            return TrainingArguments(**common), self.lora_config()
        from trl import SFTConfig

        packing = chosen.get("packing", self.packing)
        sft = SFTConfig(
            **common,
            max_length=self.cut_length(),
            packing=packing,
            # torchtune trains instruct rows with train_on_input false: the prompt is masked out of the loss.
            completion_only_loss=self.row_kind == "instruct",
            assistant_only_loss=self.row_kind == "chat",
            model_init_kwargs=self.model_init_kwargs(bf16, packing),
        )
        return sft, self.lora_config()

    def cut_length(self) -> int | None:
        """Where rows are cut: max_seq_len; None while it is auto (the training process chooses it from the rows
        before it builds a trainer, seq_len.py: settings checked before that have nothing to cut yet)."""
        return None if self.max_seq_len == AUTO else self.max_seq_len

    def rate(self) -> float:
        """The peak learning rate: learning_rate; DEFAULT_LEARNING_RATE while it is auto."""
        return DEFAULT_LEARNING_RATE if self.learning_rate == AUTO else self.learning_rate

    def micro_batch(self) -> int:
        """Rows per device per step: batch_size; fast.PLANNED_BATCH while it is auto (settings checked before the
        training process chose it)."""
        return fast.PLANNED_BATCH if self.batch_size == AUTO else self.batch_size

    def lora_config(self) -> Any:
        if self.method == "full":
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.lora_rank,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=self.target_modules,
            target_parameters=list(self.target_parameters) or None,
            use_dora=self.method == "dora",
            bias="none",
            # A classifier's new head (PEFT: `classifier` / `score`) trains in full beside the adapter.
            task_type="SEQ_CLS" if self.task == CLASSIFICATION else "CAUSAL_LM",
        )

    def fast_choices(self, world_size: int = 1) -> list[fast.Choice]:
        """What the auto settings become where this process trains in a run of `world_size` processes (fast.py;
        imports torch)."""
        hardware = fast.Hardware.here(self.device)
        model = fast.ModelSize.of(self.model_dir) if fast.needs_model(self, hardware, world_size) else None
        return fast.choose(self, hardware, model, world_size)

    def model_init_kwargs(self, bf16: bool, packing: bool) -> dict[str, Any]:
        # A frozen LoRA base is read in bf16 where training computes in bf16 (half the memory); a full fine-tune
        # keeps fp32 master weights under bf16 autocast.
        kwargs: dict[str, Any] = {"dtype": "bfloat16" if bf16 and self.method != "full" else "float32"}
        if packing:
            kwargs["attn_implementation"] = "flash_attention_2"
        if self.method == "qlora":
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_compute_dtype="bfloat16" if bf16 else "float32",
                bnb_4bit_use_double_quant=True,
            )
        return kwargs

    def resolved(self, world_size: int = 1, sft: Any = None, lora: Any = None) -> dict[str, Any]:
        """What the run records: these settings, bf16 and the world size resolved, and the TRL arguments (`sft`
        and `lora`: the trainer's own, when it has been built; building a new SFTConfig after it resets the
        accelerate state the trainer holds)."""
        if sft is None:
            sft, lora = self.trl_config(world_size)
        # TRL's SFTConfig, or (classification) transformers' TrainingArguments.
        arguments = "sft_config" if self.task != CLASSIFICATION else "training_arguments"
        return {
            "engine": "transformers",
            "settings": {**asdict(self), "bf16": sft.bf16},
            "world_size": world_size,
            "choices": [*self.planned, *(asdict(choice) for choice in self.fast_choices(world_size))],
            arguments: _jsonable(sft.to_dict()),
            "lora_config": _jsonable(lora.to_dict()) if lora is not None else None,
        }


def fsdp_arguments(checkpointing: bool) -> dict[str, Any]:
    """The Trainer's arguments for FSDP2 over every process of the run: each decoder layer (the model's
    _no_split_modules) a unit whose weights are gathered for its forward and backward and resharded after each;
    checkpoints saved sharded (each process its own part, none gathering the whole model); activations recomputed
    by FSDP where `checkpointing`."""
    return {
        "fsdp": True,
        "fsdp_config": {
            "version": 2,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "reshard_after_forward": True,
            "state_dict_type": "SHARDED_STATE_DICT",
            "activation_checkpointing": bool(checkpointing),
        },
    }


def data_format(path: str) -> str | None:
    """The `datasets` builder that reads `path`, by its suffix (the one table, data_formats.py); None for a format
    this engine does not read: it reads dataset-initialize's parquet shards and JSON (Lines)."""
    found = FORMATS.get(Path(str(path)).suffix.lower())
    return found if found in _READ_FORMATS else None


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _positive(value: object) -> bool:
    return _number(value) and value > 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return (
            [_jsonable(v) for v in sorted(value, key=str)]
            if isinstance(value, set)
            else [_jsonable(v) for v in value]
        )
    if isinstance(value, str | int | float | bool | type(None)):
        return value
    return str(value)
