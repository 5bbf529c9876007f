"""The training rows, read from dataset-initialize's files and put in TRL's dataset formats so that the loss covers
what the torchtune engine trains on:
- instruct: `prompt` (the input column) and `completion` (the output column), as one user and one assistant turn
  where the tokenizer has a chat template (torchtune formats instruct rows with the model's template too); TRL's
  completion-only loss then masks the prompt, as torchtune's train_on_input false does;
- chat: the `messages` column as a conversation, with assistant-only loss;
- text: the `text` column, every token trained;
- classification: `text` (+ `text_pair`) and a class id (classify.py tokenizes them);
- multimodal: instruct or chat rows as above, their turns cut into text and image parts, and the row's `images`
  (vision.py): TRL's vision collator makes the pixel values batch by batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.transformers.settings import IMAGES, MULTIMODAL, SftSettings, data_format

log = get_logger(__name__)

# `datasets`' Arrow cache of the formatted and tokenized rows, shared by the ranks; removed after training.
DATASETS_CACHE = ".datasets-cache"
ASSISTANT_TURNS, LAST_ASSISTANT_TURN = "assistant_turns", "last_assistant_turn"


def count_rows(settings: SftSettings) -> int:
    """How many rows the data files hold, read as training reads them; nothing is left in the run folder."""
    import tempfile

    with tempfile.TemporaryDirectory() as cache:
        return len(read_rows(settings, cache_dir=cache))


def read_rows(settings: SftSettings, cache_dir: str | None = None) -> Any:
    """The data files as a `datasets.Dataset`, checked for the columns the settings' dataset type reads (`datasets`'
    cache: the run folder's unless given)."""
    import datasets

    builders = {data_format(path) for path in settings.data_files}
    if len(builders) != 1:
        raise ValueError(
            f"the training data files mix formats ({', '.join(sorted(map(str, builders)))}): use one format"
        )
    rows = datasets.load_dataset(
        builders.pop(),
        data_files=[str(p) for p in settings.data_files],
        split="train",
        cache_dir=cache_dir or str(Path(settings.output_dir) / DATASETS_CACHE),
    )
    wanted = {name: settings.column(name) for name in settings.columns()}
    missing = sorted(column for column in wanted.values() if column not in rows.column_names)
    if missing:
        raise ValueError(
            f"the {settings.dataset_type} data has no column {', '.join(missing)} (it has "
            f"{', '.join(rows.column_names)}): set data_column_map to the columns to read"
        )
    return rows


def trained_rows(settings: SftSettings, tokenizer: Any) -> tuple[Any, str | None]:
    """The training rows in TRL's format for this tokenizer (load_rows), and how chat rows' loss is masked
    (chat_loss_mode; None for other rows)."""
    chat_loss = chat_loss_mode(tokenizer) if settings.row_kind == "chat" else None
    has_chat_template = bool(getattr(tokenizer, "chat_template", None))
    return load_rows(settings, has_chat_template, chat_loss or ASSISTANT_TURNS), chat_loss


def load_rows(settings: SftSettings, has_chat_template: bool, chat_loss: str = ASSISTANT_TURNS) -> Any:
    """The data files as a `datasets.Dataset` in TRL's format for the settings' dataset type (multimodal rows:
    also their `images`)."""
    rows = read_rows(settings)
    wanted = {name: settings.column(name) for name in settings.columns() if name != IMAGES}
    convert = _CONVERSIONS[settings.row_kind]
    if settings.row_kind == "chat" and chat_loss == LAST_ASSISTANT_TURN:
        convert = _chat_last_turn
    if settings.dataset_type != MULTIMODAL:
        return rows.map(
            convert,
            fn_kwargs={"columns": wanted, "chat": has_chat_template},
            remove_columns=rows.column_names,
            desc=f"Formatting {settings.dataset_type} rows for TRL",
        )
    from kfp_finetune.components._shared.transformers.vision import with_image_parts

    images = settings.column(IMAGES)
    formatted = rows.map(
        lambda row: with_image_parts(convert(row, wanted, True), settings.image_tag),
        remove_columns=[column for column in rows.column_names if column != images],
        desc="Formatting image + text rows for TRL",
    )
    return formatted.rename_column(images, IMAGES) if images != IMAGES else formatted


def _instruct(row: dict, columns: dict[str, str], chat: bool) -> dict:
    prompt, completion = str(row[columns["input"]] or ""), str(row[columns["output"]])
    if "instruction" in columns:  # alpaca: the input follows the instruction after a blank line, as
        # dataset-initialize writes alpaca rows as messages
        extra = prompt.strip()
        prompt = str(row[columns["instruction"]]) + (f"\n\n{prompt}" if extra else "")
    if chat:
        return {
            "prompt": [{"role": "user", "content": prompt}],
            "completion": [{"role": "assistant", "content": completion}],
        }
    # Without a template the prompt and answer are joined by a newline; TRL appends the EOS token to the completion.
    return {"prompt": prompt + "\n", "completion": completion}


def _chat(row: dict, columns: dict[str, str], chat: bool) -> dict:
    return {"messages": _openai_turns(row[columns["messages"]])}


def _openai_turns(turns: list[dict]) -> list[dict]:
    """Chat turns with OpenAI's role/content keys; ShareGPT's from/value turns are renamed."""
    return [
        {"role": _SHAREGPT_ROLES.get(m["from"], m["from"]), "content": m["value"]} if "from" in m else m
        for m in turns
    ]


_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def _chat_last_turn(row: dict, columns: dict[str, str], chat: bool) -> dict:
    messages = _openai_turns(row[columns["messages"]])
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        raise ValueError(f"a chat row has no assistant turn to train on: {messages!r:.200}")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def chat_loss_mode(tokenizer: Any) -> str:
    """How chat rows are masked: every assistant turn where TRL can mark them in the tokenizer's chat template
    (its `{% generation %}` markers, or a template TRL knows how to patch), else only the last assistant turn,
    as a prompt/completion pair (torchtune trains every assistant turn; the earlier ones are then context only)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = getattr(tokenizer, "chat_template", None)
    if template and has_generation_markers(template):
        return ASSISTANT_TURNS
    try:
        get_training_chat_template(tokenizer)
    except ValueError:
        log.warning(
            "the chat template has no {% generation %} markers and TRL cannot add them: training on the last "
            "assistant turn of each conversation only (earlier turns are context)"
        )
        return LAST_ASSISTANT_TURN
    return ASSISTANT_TURNS


def _text(row: dict, columns: dict[str, str], chat: bool) -> dict:
    return {"text": str(row[columns["text"]])}


_CONVERSIONS = {"instruct": _instruct, "chat": _chat, "text": _text}
