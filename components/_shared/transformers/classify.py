"""Sequence classification on the transformers engine (dataset_type `classification`): the Training Operator v1
`train` API's Hugging Face path — `AutoModelForSequenceClassification`, transformers' `Trainer` with
`TrainingArguments`, a PEFT `LoraConfig` — whose example fine-tunes BERT on Yelp reviews.

The rows are dataset-initialize's classification shards (dataset_initialize/labels.py): `text`, optionally
`text_pair` (the second sentence of a pair task), and `label`, a class id whose names the `datasets` ClassLabel
feature carries. The model gets a head of that many classes, named by them (config.json's id2label): a base whose
head has another size (or none: a plain encoder, a causal LM) gets a new head, trained in full beside a LoRA
adapter (PEFT's SEQ_CLS task keeps it in the adapter's `modules_to_save`).

The same tokenization serves training and evaluation (evaluation.py scores the eval rows with `examples` and
`score`). torch, transformers and PEFT are imported inside the functions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.eval_examples import Example, ModelScores, batches
from kfp_finetune.components._shared.eval_scoring import right_padded
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.transformers.rows import read_rows
from kfp_finetune.components._shared.transformers.settings import SftSettings
from kfp_finetune.components._shared.transformers.vision import batch_inputs

log = get_logger(__name__)

#: The class names a LoRA run's adapter folder keeps beside it (run_layout.merge_adapter builds the head from them).
LABELS_FILE = "classifier_labels.json"


def class_names(rows: Any, label_column: str) -> list[str]:
    """The class names, index = class id: the ClassLabel feature's (dataset-initialize writes one), else the ids
    as text (0 .. the largest id found)."""
    feature = rows.features[label_column]
    names = getattr(feature, "names", None)
    if names:
        return list(names)
    return [str(i) for i in range(max(rows[label_column]) + 1)]


def tokenized_rows(settings: SftSettings, rows: Any, tokenizer: Any) -> Any:
    """`rows` (the data files, read by rows.read_rows) as model inputs: input ids truncated to max_seq_len, and
    `labels`, the class id."""
    from kfp_finetune.components._shared.transformers.seq_len import require_chosen

    require_chosen(settings)
    label = settings.column("label")

    def tokenize(batch: dict) -> dict:
        encoded = _encode(settings, rows, batch, tokenizer, truncation=True, max_length=settings.max_seq_len)
        return {**encoded, "labels": batch[label]}

    return rows.map(
        tokenize, batched=True, remove_columns=rows.column_names, desc="Tokenizing classification rows"
    )


def token_lengths(settings: SftSettings, rows: Any, tokenizer: Any) -> list[int]:
    """The token lengths of `rows` (read by rows.read_rows), uncut, as tokenized_rows tokenizes them."""
    return [len(ids) for ids in _encode(settings, rows, rows[:], tokenizer)["input_ids"]]


def _encode(settings: SftSettings, rows: Any, batch: dict, tokenizer: Any, **cut: Any) -> Any:
    """A batch of `rows`' text (and text pair, where the rows have one) through the tokenizer."""
    pair = settings.column("text_pair")
    pairs = batch[pair] if pair in rows.column_names else None
    return tokenizer(batch[settings.column("text")], pairs, **cut)


def prepare_tokenizer(tokenizer: Any) -> Any:
    """A tokenizer that pads: a causal LM's often has no pad token, and then pads with its end-of-text token."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_classifier(model_dir: str | Path, names: Sequence[str], **kwargs: Any) -> Any:
    """The model folder as a sequence classifier with one output per class in `names`. A head of another size is
    replaced by a new one (logged by transformers), as is a missing head."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
        ignore_mismatched_sizes=True,
        local_files_only=True,
        **kwargs,
    )
    if model.config.pad_token_id is None:  # the classifier pools at the last token that is not padding
        # The tokenizer's: the id it pads with (config.json's eos_token_id can be a list, as Llama 3 Instruct's).
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(model_dir, local_files_only=True))
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def build_trainer(settings: SftSettings, trainer_class: Callable[..., Any], callbacks: list[Any]) -> Any:
    """transformers' Trainer (`trainer_class`: it or a subclass) for a classification run."""
    from transformers import AutoTokenizer, DataCollatorWithPadding, set_seed

    from kfp_finetune.components._shared.transformers.train import world_size

    arguments, lora_config = settings.trl_config(world_size())
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(settings.model_dir, local_files_only=True))
    rows = read_rows(settings)
    names = class_names(rows, settings.column("label"))
    log.info("classifier of %d classes: %s", len(names), ", ".join(names[:10]))
    set_seed(settings.seed)  # a new head is drawn at random: the same seed, the same head
    model = load_classifier(settings.model_dir, names, **settings.model_init_kwargs(arguments.bf16, False))
    # Its loss is the batch's mean, whatever the batch's label count: the Trainer must divide it over the
    # accumulation steps itself (a forward with **kwargs would make it assume the loss is a sum over
    # num_items_in_batch, and multiply it by the processes).
    model.accepts_loss_kwargs = False
    if lora_config is not None:
        from peft import get_peft_model, prepare_model_for_kbit_training

        if settings.method == "qlora":
            model = prepare_model_for_kbit_training(model, arguments.gradient_checkpointing)
        model = get_peft_model(model, lora_config)
        # The new head trains in full (modules_to_save: a copy in the base's dtype, bf16 beside a bf16 base): in
        # fp32, as the adapter's weights, so small updates are not rounded away.
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.data = parameter.data.float()
    return trainer_class(
        model=model,
        args=arguments,
        train_dataset=tokenized_rows(settings, rows, tokenizer),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        callbacks=callbacks,
    )


def write_labels(model: Any, folder: Path) -> None:
    """The classifier's class names into a LoRA run's adapter folder (merge_adapter reads them)."""
    id2label = model.config.id2label
    (folder / LABELS_FILE).write_text(json.dumps([id2label[i] for i in range(len(id2label))]) + "\n")


def read_labels(adapter_dir: str | Path) -> list[str] | None:
    """The class names of the adapter folder's classifier; None for an adapter that is not a classifier's."""
    path = Path(adapter_dir) / LABELS_FILE
    return json.loads(path.read_text()) if path.is_file() else None


# --- evaluation ------------------------------------------------------------------------------------------------


def eval_rows(settings: SftSettings, tokenizer: Any) -> list[dict]:
    """The eval files' rows tokenized as training tokenized them, each with its `row` index, its `text` and its
    class's name (`label_name`)."""
    rows = read_rows(settings)
    names = class_names(rows, settings.column("label"))
    texts = rows[settings.column("text")]
    tokenized = tokenized_rows(settings, rows, prepare_tokenizer(tokenizer)).to_list()
    for i, item in enumerate(tokenized):
        item.update(row=i, text=texts[i], label_name=names[item["labels"]])
    return tokenized


def examples(dataset: list[dict], rows: Sequence[int]) -> list[Example]:
    """Examples for the chosen rows: the class id is the one label; nothing is generated."""
    return [
        Example(
            item["row"],
            list(item["input_ids"]),
            [item["labels"]],
            None,
            item["text"][:200],
            item["label_name"],
            class_id=item["labels"],
            # BERT-style segment ids (a text_pair's tokens are 1), as training collated them.
            model_inputs={"token_type_ids": list(item["token_type_ids"])}
            if "token_type_ids" in item
            else None,
        )
        for item in (dataset[i] for i in rows)
    ]


def score(
    model: Any,
    examples: Sequence[Example],
    *,
    label: str,
    batch_size: int,
    pad_id: int,
    device: Any,
    progress: Callable[[str], None] = log.info,
) -> ModelScores:
    """Each example's cross-entropy on its class (its eval loss, one "token" each) and the predicted class, its
    name as the example's generation (the samples show it beside the reference)."""
    import torch
    import torch.nn.functional as F

    started = time.monotonic()
    losses: list[float | None] = []
    predictions: list[int] = []
    with torch.inference_mode():
        for batch in batches(examples, batch_size):
            tokens, mask = right_padded(batch, pad_id, device)
            extra = batch_inputs(batch, tokens.shape[1], model) if batch[0].model_inputs is not None else {}
            logits = model(input_ids=tokens, attention_mask=mask, **extra).logits.float()
            classes = torch.tensor([e.class_id for e in batch], device=device)
            losses += F.cross_entropy(logits, classes, reduction="none").tolist()
            predictions += logits.argmax(dim=-1).tolist()
    names = model.config.id2label
    correct = sum(p == e.class_id for p, e in zip(predictions, examples, strict=True))
    progress(
        f"{label}: accuracy {correct / max(len(examples), 1):.4f} on {len(examples)} examples "
        f"({time.monotonic() - started:.1f}s)"
    )
    return ModelScores(
        loss_sum=sum(losses),
        loss_tokens=len(losses),
        example_losses=losses,
        example_tokens=[1] * len(losses),
        generations=[str(names.get(p, p)) for p in predictions],
        seconds=time.monotonic() - started,
        predictions=predictions,
    )
