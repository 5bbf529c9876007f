"""Vision-language fine-tuning on the transformers engine (dataset_type `multimodal`, KEP-2401's MultimodalDataset):
instruct or chat rows with a list of images each, as dataset-initialize wrote them (images.py: embedded `datasets`
Image structs in the `images` column, one `image_tag` in the text per image, in order).

TRL trains them with its vision collator (DataCollatorForVisionLanguageModeling): the model's processor applies the
chat template and turns each batch's images into pixel values as the batch is made. The rows go to TRL as
structured turns: each text is cut at its image tags into text parts and `{"type": "image"}` parts, which TRL
fills with the row's images in order (an empty tag: TRL puts the images before the first user turn's text).

Evaluation collates each chosen eval row with the same collator, so its tokens, loss mask and pixel values are
training's; the scoring batches concatenate the rows' images and pad their per-token inputs. torch, transformers
and TRL are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kfp_finetune.components._shared.eval_examples import IGNORE_INDEX, Example

#: The keys of TRL's row formats whose turns may hold image tags.
_TURN_KEYS = ("messages", "prompt", "completion")


def load_processor(model_dir: Any) -> Any:
    """The model folder's processor (image processor + tokenizer + chat template); refused without a chat template,
    which the processor needs to place each image's tokens."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(model_dir), local_files_only=True)
    if not hasattr(processor, "image_processor"):
        raise ValueError(
            f"{model_dir} has no image processor (preprocessor_config.json): multimodal data needs a "
            "vision-language model folder with its processor files"
        )
    if not getattr(processor, "chat_template", None):
        raise ValueError(
            f"{model_dir}'s processor has no chat template (chat_template.jinja or processor_config.json): "
            "multimodal rows are formatted with it"
        )
    return processor


def with_image_parts(row: dict, tag: str) -> dict:
    """A row in TRL's format with each turn's text cut at `tag` into text and image parts ("" tag: unchanged)."""
    if not tag:
        return row
    return {
        key: [{**turn, "content": _parts(turn["content"], tag)} for turn in value]
        if key in _TURN_KEYS and isinstance(value, list)
        else value
        for key, value in row.items()
    }


def _parts(text: Any, tag: str) -> list[dict]:
    parts: list[dict] = []
    for i, piece in enumerate(str(text or "").split(tag)):
        if i:
            parts.append({"type": "image", "text": None})  # one struct type per column: `text` stays, empty
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def training_collator(processor: Any, sft_config: Any) -> Any:
    """TRL's vision collator as SFTTrainer builds it for `sft_config` (with the training chat template when only
    assistant turns train and the processor's own template cannot mark them)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    template = None
    if sft_config.assistant_only_loss and not has_generation_markers(processor.chat_template):
        template = get_training_chat_template(processor)
    return DataCollatorForVisionLanguageModeling(
        processor=processor,
        max_length=sft_config.max_length,
        completion_only_loss=sft_config.completion_only_loss,
        assistant_only_loss=sft_config.assistant_only_loss,
        chat_template=template,
    )


# --- evaluation ------------------------------------------------------------------------------------------------


def eval_rows(settings: Any, processor: Any) -> list[dict]:
    """The eval files' rows in TRL's format (train.formatted_rows, as training formatted them), each with its `row`
    index and the collator that tokenizes it (examples() collates only the rows it is asked for)."""
    from kfp_finetune.components._shared.transformers.train import formatted_rows

    sft_config, _, rows = formatted_rows(settings, processor)
    collator = training_collator(processor, sft_config)
    return [{"row": i, "formatted": row, "collator": collator} for i, row in enumerate(rows)]


def examples(dataset: list[dict], rows: Sequence[int]) -> list[Example]:
    """Examples for the chosen rows, collated as training collates a batch: the tokens, the loss mask, and the
    model inputs beyond the tokens (pixel values per image; per-token lists such as token_type_ids). The prompt to
    generate from is the sequence up to the last trained span (the answer)."""
    found = []
    for i in rows:
        item = dataset[i]
        collated = item["collator"]([dict(item["formatted"])])  # the collator rewrites the rows it is given
        ids, labels = collated.pop("input_ids"), collated.pop("labels")
        collated.pop("attention_mask", None)
        inputs = {
            key: value[0].tolist() if value.shape == ids.shape and not value.is_floating_point() else value
            for key, value in collated.items()
        }
        tokens, trained = ids[0].tolist(), labels[0].tolist()
        start = _last_span_start(trained)
        prompt, reference = _prompt_and_answer(item["formatted"])
        found.append(
            Example(
                item["row"],
                tokens,
                trained,
                tokens[:start] if 0 < start < len(tokens) else None,
                prompt[:200],
                reference,
                model_inputs=inputs,
            )
        )
    return found


def _last_span_start(labels: list[int]) -> int:
    """Where the last run of trained positions begins (0: nothing trained)."""
    end = max((i for i, label in enumerate(labels) if label != IGNORE_INDEX), default=-1)
    start = end
    while start > 0 and labels[start - 1] != IGNORE_INDEX:
        start -= 1
    return max(start, 0)


def _prompt_and_answer(formatted: dict) -> tuple[str, str]:
    """(the last user turn's text, the answer's) of a formatted row, for people."""
    if "messages" in formatted:
        turns = formatted["messages"]
        last = max(i for i, turn in enumerate(turns) if turn["role"] == "assistant")
        context, answer = turns[:last], turns[last]
    else:
        context, answer = formatted["prompt"], formatted["completion"][-1]
    users = [turn for turn in context if turn["role"] == "user"]
    return (_text(users[-1]["content"]) if users else ""), _text(answer["content"])


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part["text"] if part["type"] == "text" else "<image>" for part in content)


def batch_inputs(
    batch: Sequence[Example], width: int, model: Any, *, prompts: bool = False
) -> dict[str, Any]:
    """The batch's model inputs beyond the tokens, on `model`'s device: per-image tensors concatenated in the rows'
    order (pixel values in the model's dtype), per-token lists padded with 0 to `width` (right, as the tokens are
    for the loss; `prompts`: cut to each prompt and padded on the left, as generation pads)."""
    import torch

    found: dict[str, Any] = {}
    keys = dict.fromkeys(key for e in batch for key in e.model_inputs or {})
    for key in keys:
        present = [e.model_inputs[key] for e in batch if key in (e.model_inputs or {})]
        if not isinstance(present[0], list):  # per image: a row without images adds none
            joined = torch.cat(present)
            found[key] = joined.to(model.device, model.dtype if joined.is_floating_point() else None)
            continue
        rows = []
        for e in batch:
            value = (e.model_inputs or {}).get(key) or [0] * len(e.tokens)
            value = value[: len(e.prompt_tokens)] if prompts else value
            padding = [0] * (width - len(value))
            rows.append(padding + value if prompts else value + padding)
        found[key] = torch.tensor(rows, device=model.device)
    return found


def forward(model: Any, tokens: Any, mask: Any, batch: Sequence[Example]) -> Any:
    """The batch's logits, its images in."""
    inputs = batch_inputs(batch, tokens.shape[1], model)
    return model(input_ids=tokens, attention_mask=mask, **inputs).logits
