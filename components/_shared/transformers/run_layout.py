"""A transformers-engine run folder as train.py leaves it, and the one reader of its layout:

    <run>/trl_config.json      the resolved settings the run trained with (RESOLVED_CONFIG)
    <run>/adapter/             the PEFT adapter (adapter_model.safetensors + adapter_config.json naming the base;
                               a classifier's also its class names, classify.LABELS_FILE); LoRA and QLoRA runs only
    <run>/merged/              the HF folder consumers load: the full fine-tune, or the base with the adapter merged
    <run>/logs/metrics.txt     one `Step N | loss:.. lr:..` line per logged step (_shared/metrics_file.py)

torch, transformers and PEFT are imported inside the merge only: reading the layout needs none of them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.safetensors_header import read_tensor_entries
from kfp_finetune.components._shared.workspace import atomic_dir

log = get_logger(__name__)

RESOLVED_CONFIG = "trl_config.json"
ADAPTER_DIR = "adapter"
MERGED_DIR = "merged"
METRICS_FILE = "logs/metrics.txt"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def read_resolved_config(run_dir: str | os.PathLike) -> dict:
    """The run's resolved settings; {} when the folder has none (a model this library did not train)."""
    path = Path(run_dir) / RESOLVED_CONFIG
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text()) or {}
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{path} is not valid JSON ({e}): the fine-tune run folder is damaged; train again"
        ) from e


def last_adapter_state(run_dir: str | os.PathLike) -> Path | None:
    """The run's PEFT adapter folder, None when there is none (a full fine-tune, or no training yet)."""
    folder = Path(run_dir) / ADAPTER_DIR
    return folder if (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_WEIGHTS).is_file() else None


def merged_model_dir(run_dir: str | os.PathLike, base_dir: str | os.PathLike) -> Path:
    """`<run_dir>/merged/`: reused when present (train.py or an earlier step wrote it; atomic_dir renames only a
    complete folder into place), else the run's adapter merged into `base_dir` on CPU, in the base's dtype."""
    run_dir = Path(run_dir)
    final = run_dir / MERGED_DIR
    if final.is_dir():
        log.info("merged model: reusing %s", final)
        return final
    adapter = last_adapter_state(run_dir)
    if adapter is None:
        raise ConfigError(
            f"cannot merge: the fine-tune run folder {run_dir} has neither {MERGED_DIR}/ nor a PEFT adapter in "
            f"{ADAPTER_DIR}/"
        )
    with atomic_dir(final) as tmp:
        merge_adapter(base_dir, adapter, tmp)
    return final


def merge_adapter(
    base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, out_dir: str | os.PathLike
) -> None:
    """Write into `out_dir` the base model in `base_dir` with the PEFT adapter `adapter_dir` merged in
    (PEFT's merge_and_unload), and the base's tokenizer and processor files. The base is read unquantized even for QLoRA: the
    merged model is the full-precision base plus the adapter's update."""
    import torch
    from peft import PeftModel

    from kfp_finetune.components._shared.transformers import classify

    log.info("merging the adapter %s into the base model %s on CPU", adapter_dir, base_dir)
    names = classify.read_labels(adapter_dir)
    if names is not None:  # a classifier's adapter: the base with a head of the trained classes
        base = classify.load_classifier(base_dir, names, dtype="auto", device_map={"": "cpu"})
    else:
        base = trained_class(base_dir).from_pretrained(base_dir, dtype="auto", device_map={"": "cpu"})
    model = PeftModel.from_pretrained(base, str(adapter_dir), torch_device="cpu")
    with torch.no_grad():
        merged = model.merge_and_unload()
    merged.save_pretrained(out_dir, safe_serialization=True)
    copy_model_files(base_dir, out_dir)
    log.info("merged model written to %s", out_dir)


#: safetensors' names of the floating dtypes (the format's header), as torch names them.
_SAFETENSORS_FLOATS = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def weights_dtype(model_dir: str | os.PathLike) -> str | None:
    """The dtype of the folder's first floating tensor, from its safetensors headers: what transformers reads a
    model in whose config.json names no dtype. None without safetensors."""
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        for entry in read_tensor_entries(path).values():
            if entry["dtype"] in _SAFETENSORS_FLOATS:
                return _SAFETENSORS_FLOATS[entry["dtype"]]
    return None


def trained_class(model_dir: str | os.PathLike) -> Any:
    """The class TRL trains the folder's model as (its create_model_from_path): config.json's first architecture
    (a vision-language model's whole class, tower included), else AutoModelForCausalLM."""
    import transformers

    names = json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or [""]
    return getattr(transformers, names[0], None) or transformers.AutoModelForCausalLM


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


def copy_model_files(base_dir: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Copy the base's files that are not weights and that `out_dir` lacks (tokenizer, chat template, processor
    configs): copied, not re-saved, so the merged folder tokenizes exactly as the base does."""
    out_dir = Path(out_dir)
    for path in sorted(Path(base_dir).iterdir()):
        if path.is_file() and not path.name.endswith(_WEIGHT_SUFFIXES) and not (out_dir / path.name).exists():
            shutil.copyfile(path, out_dir / path.name)


#: What the run's trl_config.json records that a model card shows, as (label, section, key): TRL's SFTConfig (or a
#: classifier's TrainingArguments) as the trainer had it, and PEFT's LoraConfig.
_HYPERPARAMETERS = (
    ("epochs", "arguments", "num_train_epochs"),
    ("max steps", "arguments", "max_steps"),
    ("batch size", "arguments", "per_device_train_batch_size"),
    ("gradient accumulation steps", "arguments", "gradient_accumulation_steps"),
    ("optimizer", "arguments", "optim"),
    ("learning rate", "arguments", "learning_rate"),
    ("weight decay", "arguments", "weight_decay"),
    ("lr scheduler", "arguments", "lr_scheduler_type"),
    ("warmup steps", "arguments", "warmup_steps"),
    ("LoRA rank", "lora_config", "r"),
    ("LoRA alpha", "lora_config", "lora_alpha"),
    ("LoRA dropout", "lora_config", "lora_dropout"),
    ("LoRA target modules", "lora_config", "target_modules"),
    ("DoRA", "lora_config", "use_dora"),
    ("max sequence length", "arguments", "max_length"),
    ("packed", "arguments", "packing"),
    ("bf16", "arguments", "bf16"),
    ("seed", "arguments", "seed"),
)


def hyperparameters(resolved: dict) -> list[tuple[str, object]]:
    """What a model card shows of how the run trained, from its trl_config.json (read_resolved_config): (label,
    value), None where it has no such entry (max steps -1: the epochs decide)."""
    sections = {
        "arguments": resolved.get("sft_config") or resolved.get("training_arguments") or {},
        "lora_config": resolved.get("lora_config") or {},
    }
    found = [(label, sections[section].get(key)) for label, section, key in _HYPERPARAMETERS]
    return [(label, None if label == "max steps" and value == -1 else value) for label, value in found]
