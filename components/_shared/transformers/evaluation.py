"""The transformers engine's side of evaluation (what the face's `evaluation()` hands the evaluate step; the names
every engine's evaluation module has, see _shared/torchtune/evaluation.py): plain HF model folders loaded with the
class training loaded them as and their tokenizer (no remote code), the eval rows tokenized and masked as train.py's
SFTTrainer tokenized and masked the training rows, teacher-forced loss on the trained tokens and greedy
generations with transformers' `generate`. A sequence classifier's rows and scores are classify.py's; a
vision-language model's rows are collated with their images by TRL's vision collator (vision.py).

The rows: train.formatted_rows (the same TRL format, chat loss mode and SFTConfig as training), then TRL's own
dataset preparation (tokenize, labels from the completion and assistant masks, truncation to max_length). The
tuned model is the run's merged/ folder (train.py always writes it), the base its base model folder.

No torch, transformers or TRL at import.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from math import prod
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kfp_finetune.components._shared import contract, engines
from kfp_finetune.components._shared.contract import ArtifactInput
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.eval_examples import Example, ModelScores, require_same_tokenizer
from kfp_finetune.components._shared.eval_scoring import score_examples
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.storage import hash_file
from kfp_finetune.components._shared.transformers import classify, plan, seq_len, train, vision
from kfp_finetune.components._shared.transformers.fast import AUTO
from kfp_finetune.components._shared.transformers.run_layout import trained_class
from kfp_finetune.components._shared.transformers.settings import (
    CLASSIFICATION,
    DATASET_TYPES,
    MULTIMODAL,
    SftSettings,
)

log = get_logger(__name__)

#: What to do where lm-eval does not import. Its versions before 0.4.10 import transformers.AutoModelForVision2Seq,
#: which transformers 5 removed (pyproject.toml: the lm-eval-transformers extra).
LM_EVAL_MISSING = (
    "install kfp-finetune[lm-eval-transformers] (lm-eval>=0.4.13), or leave eval_lm_eval_tasks empty"
)

__all__ = [
    "LM_EVAL_MISSING",
    "Example",
    "ModelScores",
    "TunedModel",
    "build_dataset",
    "check_lm_eval",
    "check_same_tokenizer",
    "eval_dataset",
    "inspect_model",
    "lm_eval_folder",
    "lm_eval_model",
    "load_tokenizer",
    "make_examples",
    "models_to_score",
    "score_model",
    "training_max_seq_len",
    "tuned_model",
]

# The files that define a tokenizer in an HF folder: equal files tokenize identically.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
)


# --- the models -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelDir:
    """An HF model folder: what evaluate needs to know before loading it."""

    path: Path
    hf_config: dict
    num_parameters: int  # counted from the safetensors headers


def inspect_model(path: Path, what: str) -> ModelDir:
    """The HF folder at `path`, checked (config.json, safetensors weights, tokenizer files); `what` (model,
    base_model) names it in errors."""
    path = Path(path)
    config = path / "config.json"
    weights = sorted(path.glob("*.safetensors"))
    problem = ""
    if not config.is_file():
        problem = f"model directory {path} has no config.json"
    elif not weights:
        problem = f"model directory {path} has no weights (*.safetensors)"
    elif not any((path / name).is_file() for name in _TOKENIZER_FILES):
        problem = f"model directory {path} has no tokenizer files ({', '.join(_TOKENIZER_FILES[:2])})"
    if problem:
        raise ConfigError(f"{what}: {problem}")
    try:
        hf_config = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what}: {config} is not valid JSON ({e})") from e
    if hf_config.get("auto_map"):
        raise ConfigError(f"{what}: {config} names remote code (auto_map), which this engine does not run")
    return ModelDir(path, hf_config, sum(_safetensors_parameters(p) for p in weights))


def _safetensors_parameters(path: Path) -> int:
    """Elements in a safetensors file, from its JSON header (8-byte little-endian length, then the header)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def check_same_tokenizer(tuned: ModelDir, base: ModelDir) -> None:
    differing = [
        name for name in _TOKENIZER_FILES if _file_hash(tuned.path / name) != _file_hash(base.path / name)
    ]
    require_same_tokenizer(tuned, base, differing)


def _file_hash(path: Path) -> str | None:
    return hash_file(path).sha256 if path.is_file() else None


@dataclass
class TunedModel:
    folder: ModelDir  # the merged model: the full fine-tune, or the base with the adapter merged in
    classifier: bool = False  # a sequence classifier (classify.py), not a causal LM
    vision: bool = False  # a vision-language model trained on image + text rows (vision.py)


def tuned_model(
    path: Path, run_dir: Path | None, base_dir: ModelDir | None, train_config: dict
) -> TunedModel:
    """The model folder at `path` (the fine-tune records its run's merged/ folder as the model): a classifier
    when its run trained one, or (a folder this library did not train) when its architecture is one."""
    folder = inspect_model(path, "model")
    trained = (train_config.get("settings") or {}).get("dataset_type")
    architectures = folder.hf_config.get("architectures") or [""]
    classifier = trained == CLASSIFICATION or (
        not trained and architectures[0].endswith("ForSequenceClassification")
    )
    return TunedModel(folder, classifier, vision=trained == MULTIMODAL)


def lm_eval_folder(tuned: TunedModel, run_dir: Path) -> ModelDir:
    task = (
        engines.CLASSIFICATION
        if tuned.classifier
        else engines.IMAGE_TEXT
        if tuned.vision
        else engines.GENERATION
    )
    refusal = engines.lm_eval_refusal(task)
    if refusal:
        raise ConfigError(refusal)
    return tuned.folder


def models_to_score(
    tuned: TunedModel, base_dir: ModelDir | None, device: Any, dtype: Any
) -> Iterator[tuple[str, Any]]:
    """("tuned", model), then ("base", model) when there is a base, one in memory at a time (the caller drops
    each before asking for the next)."""
    if tuned.classifier:
        model = classify.load_classifier(tuned.folder.path, _class_names(tuned.folder), dtype=dtype)
        yield "tuned", model.to(device).eval()
        if base_dir is not None:  # the base with the tuned model's classes (a new head where its own differs)
            model = classify.load_classifier(base_dir.path, _class_names(tuned.folder), dtype=dtype)
            yield "base", model.to(device).eval()
        return
    yield "tuned", load_model(tuned.folder, device, dtype)
    if base_dir is not None:
        yield "base", load_model(base_dir, device, dtype)


def _class_names(folder: ModelDir) -> list[str]:
    id2label = folder.hf_config.get("id2label") or {}
    return [str(id2label.get(str(i), i)) for i in range(len(id2label))]


def load_model(model_dir: ModelDir, device: Any, dtype: Any) -> Any:
    """The folder's model as training loaded it (run_layout.trained_class)."""
    model = trained_class(model_dir.path).from_pretrained(model_dir.path, dtype=dtype, local_files_only=True)
    return model.to(device).eval()


# --- the eval rows --------------------------------------------------------------------------------------------


def training_max_seq_len(train_config: dict) -> int | None:
    return (train_config.get("settings") or {}).get("max_seq_len")


def eval_dataset(
    train_config: dict, eval_data: ArtifactInput, files: list[str], max_seq_len: int | None
) -> SftSettings:
    """The run's settings pointed at the eval files and truncating at `max_seq_len`: dataset type, column map and
    chat loss as training read them; without a training config, from eval_data's metadata."""
    if train_config.get("settings"):
        settings = SftSettings.from_dict(train_config["settings"])
    else:
        meta = contract.DatasetSplit.from_metadata(eval_data.metadata, input_name="eval_data")
        hints = meta.reading_hints()
        dataset_type = hints.get("dataset_type", "instruct")
        if dataset_type not in DATASET_TYPES:
            raise ConfigError(
                f"eval_data has `dataset_type` {dataset_type!r}; expected one of {', '.join(DATASET_TYPES)}"
            )
        # The rows read as a fine-tune with this engine's defaults would read them (plan.py); paths come below.
        settings = plan.sft_settings(
            {}, model_dir="model", data_files=["data.parquet"], run_dir="run", data_hints=hints
        )
    # Eval rows are scored one by one, never packed; bf16 decides nothing about the rows.
    return dataclasses.replace(
        settings,
        data_files=list(files),
        max_seq_len=max_seq_len or settings.max_seq_len,
        packing=False,
        bf16=False,
        gradient_checkpointing=False,
        liger_kernel=False,
    )


def load_tokenizer(model_dir: ModelDir, max_seq_len: int | None, train_config: dict | None = None) -> Any:
    """The folder's tokenizer (eval_dataset's settings carry the length rows are truncated to); a vision-language
    model's processor (its tokenizer, image processor and chat template)."""
    from transformers import AutoTokenizer

    if ((train_config or {}).get("settings") or {}).get("dataset_type") == MULTIMODAL:
        try:
            return vision.load_processor(model_dir.path)
        except ValueError as err:
            raise ConfigError(f"model: {err}") from err
    return AutoTokenizer.from_pretrained(model_dir.path, local_files_only=True)


def build_dataset(settings: SftSettings, tokenizer: Any) -> list[dict]:
    """The eval rows in TRL's format (`prompt`/`completion`, `messages` or `text`) with their `input_ids` and
    `labels` as TRL prepares training rows, and `row`: the row's index in the eval files. TRL drops rows whose
    labels truncation left empty, as it does in training."""
    from trl import SFTTrainer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    with tempfile.TemporaryDirectory(prefix="kfp-finetune-eval-rows-") as scratch:
        # The settings check wants a model folder; the rows need only the tokenizer's, which is the same.
        folder = text_tokenizer(tokenizer).name_or_path
        settings = dataclasses.replace(settings, model_dir=folder, output_dir=scratch)
        # Neither the run's max_seq_len nor evaluate's own: the model's positions at most.
        if settings.max_seq_len == AUTO:
            settings = dataclasses.replace(settings, max_seq_len=seq_len.model_limit(folder))
        if settings.task == CLASSIFICATION:
            try:
                return classify.eval_rows(settings, tokenizer)
            except ValueError as err:
                raise ConfigError(f"eval_data: {err}") from err
        if settings.dataset_type == MULTIMODAL:
            try:
                return vision.eval_rows(settings, tokenizer)
            except ValueError as err:
                raise ConfigError(f"eval_data: {err}") from err
        try:
            sft_config, _, rows = train.formatted_rows(settings, tokenizer)
        except ValueError as err:
            raise ConfigError(f"eval_data: {err}") from err
        rows = rows.add_column("row", list(range(len(rows))))
        # What SFTTrainer.__init__ sets before it prepares a dataset: the template with generation markers when
        # only assistant turns train, whether the completion mask applies, the tokenizer.
        template = None
        if sft_config.assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
            template = get_training_chat_template(tokenizer)
        trainer = SimpleNamespace(
            _tokenizer=tokenizer,
            chat_template=template,
            completion_only_loss=sft_config.completion_only_loss,
        )
        prepared = SFTTrainer._prepare_dataset(
            trainer, rows, tokenizer, sft_config, packing=False, formatting_func=None, dataset_name="eval"
        )
        formatted = rows.to_list()
        examples = prepared.to_list()
    for example in examples:
        example["formatted"] = formatted[example["row"]]
        example["chat_template"] = template
    return examples


def make_examples(dataset: list[dict], tokenizer: Any, rows: Sequence[int]) -> list[Example]:
    """Examples for the chosen rows. Text rows have no prompt/answer split: loss only; classification rows have
    their class."""
    if dataset and "label_name" in dataset[0]:
        return classify.examples(dataset, rows)
    if dataset and "collator" in dataset[0]:
        return vision.examples(dataset, rows)
    examples = []
    for i in rows:
        item = dataset[i]
        tokens, labels = list(item["input_ids"]), list(item["labels"])
        formatted, prompt_tokens = item["formatted"], None
        if "text" in formatted:
            prompt, reference = formatted["text"][:200], ""
        else:
            prompt, reference, blank = _prompt_reference_blank(formatted)
            start = _common_prefix(tokens, _tokenize(tokenizer, blank, item["chat_template"]))
            # A prompt truncated by max_seq_len leaves nothing to generate from.
            if 0 < start < len(tokens):
                prompt_tokens = tokens[:start]
        examples.append(Example(item["row"], tokens, labels, prompt_tokens, prompt, reference))
    return examples


def _prompt_reference_blank(formatted: dict) -> tuple[str, str, str | list]:
    """(the last user turn, the answer, the row with its answer blank) of an instruct or chat row. The blank row
    tokenizes to the training sequence up to where the answer's text begins (after the assistant header and
    anything the template writes before the answer, e.g. Qwen3's empty think block, which training also learns)."""
    if "messages" in formatted:
        messages = formatted["messages"]
        last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
        context, answer = messages[:last], messages[last]
    else:
        context, answer = formatted["prompt"], formatted["completion"]
        if isinstance(answer, str):  # no chat template: the prompt text, then the answer's
            return context.strip(), answer, context
        answer = answer[-1]
    users = [m for m in context if m["role"] == "user"]
    blank = [*context, {**answer, "content": ""}]
    return (users[-1]["content"] if users else ""), answer["content"], blank


def _tokenize(tokenizer: Any, row: str | list, chat_template: str | None) -> list[int]:
    if isinstance(row, str):
        return tokenizer(text=row)["input_ids"]
    return tokenizer.apply_chat_template(row, tokenize=True, return_dict=True, chat_template=chat_template)[
        "input_ids"
    ]


def _common_prefix(tokens: list[int], other: list[int]) -> int:
    start = 0
    while start < min(len(tokens), len(other)) and tokens[start] == other[start]:
        start += 1
    return start


# --- scoring --------------------------------------------------------------------------------------------------


def text_tokenizer(tokenizer: Any) -> Any:
    """The text tokenizer itself: a processor's own tokenizer, else the tokenizer given."""
    return getattr(tokenizer, "tokenizer", tokenizer)


def _pad_id(tokenizer: Any) -> int:
    tokenizer = text_tokenizer(tokenizer)
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def greedy_generate(
    model: Any, tokenizer: Any, batch: Sequence[Example], *, max_new_tokens: int, device: Any
) -> list[str]:
    """Greedy continuations of a batch of examples' prompts (left-padded, their images in), cut at the first
    end-of-sequence token."""
    import torch

    prompts = [e.prompt_tokens for e in batch]
    tokenizer = text_tokenizer(tokenizer)
    pad_id, width = _pad_id(tokenizer), max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    stop = model.generation_config.eos_token_id
    stop = set(stop if isinstance(stop, list) else [stop if stop is not None else tokenizer.eos_token_id])
    inputs = (
        vision.batch_inputs(batch, width, model, prompts=True) if batch[0].model_inputs is not None else {}
    )
    with torch.inference_mode():
        output = model.generate(
            input_ids=ids,
            attention_mask=mask,
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad_id,
            eos_token_id=sorted(stop),
        )
    texts = []
    for row in output[:, width:].tolist():
        cut = next((i for i, token in enumerate(row) if token in stop), len(row))
        texts.append(tokenizer.decode(row[:cut], skip_special_tokens=True))
    return texts


def score_model(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    label: str,
    batch_size: int,
    max_new_tokens: int,
    device: Any,
    dtype: Any,
    seed: int,
    progress: Callable[[str], None] = log.info,
) -> ModelScores:
    """Loss over all examples, then greedy generations for those with a prompt (eval_scoring.py); a classifier's
    loss on each class and its predicted class (classify.py)."""
    if examples and examples[0].class_id is not None:
        return classify.score(
            model, examples, label=label, batch_size=batch_size, pad_id=_pad_id(tokenizer), device=device,
            progress=progress,
        )  # fmt: skip

    def forward(tokens: Any, mask: Any, batch: Sequence[Example]) -> Any:
        if batch[0].model_inputs is not None:
            return vision.forward(model, tokens, mask, batch)
        return model(input_ids=tokens, attention_mask=mask).logits

    return score_examples(
        examples,
        forward=forward,
        generate=lambda batch: greedy_generate(model, tokenizer, batch, max_new_tokens=max_new_tokens, device=device),
        pad_id=_pad_id(tokenizer), label=label, batch_size=batch_size, device=device, seed=seed, progress=progress,
    )  # fmt: skip


# --- lm-eval --------------------------------------------------------------------------------------------------


def check_lm_eval() -> None:
    """lm-eval's own HF model loads the folder: refused before any model is loaded where it does not import with
    this transformers (lm-eval before 0.4.10 beside transformers 5)."""
    try:
        import lm_eval.models.huggingface  # noqa: F401
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"eval_lm_eval_tasks: lm-eval's Hugging Face model does not import here ({err}): {LM_EVAL_MISSING}"
        ) from err


def lm_eval_model(model_dir: ModelDir, settings: Any, device: Any, max_seq_len: int | None) -> Any:
    """lm-eval's HF causal-LM model on the folder (no remote code), in the precision evaluate scores in."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(
        pretrained=str(model_dir.path),
        device=str(device),
        dtype="bfloat16" if device.type == "cuda" else "float32",
        batch_size=settings.batch_size,
        max_length=max_seq_len,
        trust_remote_code=False,
    )
