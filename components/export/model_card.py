"""The model card (README.md) shipped with an export: what the model is, how it was made, how well it did.

Deterministic: the same inputs give the same bytes (no timestamps), so re-exporting unchanged content is
recognised as already present at the destination.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import yaml

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.contract import TunedModel
from kfp_finetune.components._shared.engines import CLASSIFICATION, IMAGE_TEXT

_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HF_DATASET = re.compile(r"^hf://(?:datasets/)?([\w.-]+/[\w.-]+)")


@dataclass
class CardInputs:
    """Everything the card shows. `layout` maps a folder in the export ("" = root) to what it holds."""

    title: str
    model: TunedModel
    format: str
    dtype: str
    layout: dict[str, str]
    training_config: dict = field(default_factory=dict)
    eval_metrics: dict = field(default_factory=dict)
    run_name: str = ""
    run_id: str = ""
    task_name: str = ""


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def _table(rows: list[tuple[str, object]]) -> list[str]:
    lines = ["| | |", "|---|---|"]
    lines += [
        f"| {label} | {_fmt(value).replace('|', '/')} |" for label, value in rows if value not in (None, "")
    ]
    return lines


def render_card(card: CardInputs) -> str:
    meta = card.model
    base = meta.base_model
    face = engines.face(meta.engine)
    front: dict = {
        "library_name": "peft" if card.format == "adapter" else "transformers",
        "pipeline_tag": _PIPELINE_TAGS.get(meta.task, "text-generation"),
        "tags": ["kfp-finetune", face.NAME, meta.method or "finetuned"],
    }
    if _HF_REPO_ID.match(base):  # only hub ids: a workspace path means nothing to a reader of the card
        front["base_model"] = base
    dataset = _HF_DATASET.match(meta.dataset_source)
    if dataset:
        front["datasets"] = [dataset.group(1)]
    lines = ["---", yaml.safe_dump(front, sort_keys=True).strip(), "---", "", f"# {card.title}", ""]
    lines += [
        f"Fine-tuned from **{base or 'an unnamed base model'}** with {face.TRAINED_WITH} ({meta.method or '?'}, "
        f"recipe `{meta.recipe or '?'}`) by a kfp-finetune pipeline.",
        "",
        "## Contents",
        "",
        "| folder | content |",
        "|---|---|",
    ]
    lines += [f"| `{folder or '.'}` | {what} |" for folder, what in card.layout.items()]
    lines += [
        "",
        f"Weights dtype: {card.dtype or 'as trained'}. `checksums.sha256` lists every file's sha256",
    ]
    lines += [
        "(`sha256sum -c checksums.sha256`); its first line names the export that wrote these files, and a later",
        "export replaces or deletes only the files it lists.",
    ]
    lines += ["", "## Usage", "", "```python"]
    adapter_folder = next((f for f, what in card.layout.items() if what.startswith("PEFT")), None)
    merged_folder = next((f for f, what in card.layout.items() if what.startswith("merged")), None)
    # The class the model loads with: a sequence classifier's config.json names its classes (id2label); a
    # vision-language model loads whole, its vision tower included.
    auto = _AUTO_CLASSES.get(meta.task, "AutoModelForCausalLM")
    if merged_folder is not None:
        lines += [
            f"from transformers import {auto}, AutoTokenizer",
            "",
            f'model = {auto}.from_pretrained("<this repo or folder>"{_subfolder(merged_folder)})',
        ]
    if adapter_folder is not None:
        lines += [""] if merged_folder is not None else []
        lines += [
            "from peft import PeftModel",
            f"from transformers import {auto}",
            "",
            f'base = {auto}.from_pretrained("{base or "<base model>"}")',
            f'model = PeftModel.from_pretrained(base, "<this repo or folder>"{_subfolder(adapter_folder)})',
        ]
    lines += ["```", "", "## Training", ""]
    lines += _table(
        [
            ("base model", base),
            ("base model revision", meta.base_model_revision),
            ("dataset", meta.dataset_source),
            ("method", meta.method),
            ("recipe", meta.recipe),
            ("base config", meta.config),
            ("steps", meta.steps),
            ("final training loss", meta.final_loss),
            ("min training loss", meta.min_loss),
            ("tokens/s", meta.tokens_per_second),
        ]
    )
    hyper = face.hyperparameters(card.training_config)
    if any(value is not None for _, value in hyper):
        lines += ["", "### Hyperparameters", ""] + _table(hyper)
    lines += ["", "## Evaluation", ""]
    if card.eval_metrics:
        lines += ["| metric | value |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in card.eval_metrics.items()]
    else:
        lines.append("No evaluation metrics were passed to the export.")
    lines += ["", "## Provenance", ""]
    lines += _table(
        [
            ("pipeline run", card.run_name),
            ("run id", card.run_id),
            ("export task", card.task_name),
            ("training run folder", meta.run_dir),
        ]
    )
    return "\n".join(lines) + "\n"


#: The Hub's pipeline tag by what the model learned (text generation where none is recorded).
_PIPELINE_TAGS = {CLASSIFICATION: "text-classification", IMAGE_TEXT: "image-text-to-text"}
_AUTO_CLASSES = {
    CLASSIFICATION: "AutoModelForSequenceClassification",
    IMAGE_TEXT: "AutoModelForImageTextToText",
}


def _subfolder(folder: str) -> str:
    return f', subfolder="{folder}"' if folder else ""
