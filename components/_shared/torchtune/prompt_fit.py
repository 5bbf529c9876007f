"""Refuse a `max_seq_len` that leaves training rows nothing to learn from, before any training starts.

torchtune cuts every row at `tokenizer.max_seq_len`. When the prompt alone (template included) fills that length
and prompts are masked (`train_on_input: False`), the row keeps no trained token (the cut also replaces its
last kept token by a masked EOS, so a prompt of P tokens needs max_seq_len >= P + 2): its loss is 0/0, and a batch of
such rows makes the loss NaN hours into a run. The rows are tokenized here exactly as training will (the resolved
dataset and tokenizer nodes, through torchtune), but only the longest by characters: a prompt that runs past the
limit is among the longest texts, and tokenizing every row would cost minutes on a large dataset.
"""

from __future__ import annotations

from typing import Any

from kfp_finetune.components._shared.errors import ConfigError

#: How many of the longest rows (by characters) are tokenized.
CANDIDATE_ROWS = 64
_IGNORE = -100  # torchtune.data.CROSS_ENTROPY_IGNORE_IDX


class PromptTooLong(ConfigError):
    """Some training rows' prompts fill max_seq_len; the message names them and the fix."""


def check_prompts_fit(config: dict[str, Any]) -> None:
    """Raise PromptTooLong when a training row would keep no trained token after truncation.

    Checked only where it can happen and is cheap to know: a max_seq_len is set, prompts are masked, and the data
    are local files (an HF dataset source is loaded by training itself)."""
    tokenizer_node = config.get("tokenizer") or {}
    dataset_node = config.get("dataset")
    max_seq_len = tokenizer_node.get("max_seq_len")
    if (
        not max_seq_len
        or not isinstance(dataset_node, dict)
        or dataset_node.get("train_on_input", True)
        or not dataset_node.get("data_files")
    ):
        return
    dataset = rows_as_trained(config, uncut_tokenizer(config))
    too_long = []
    for index in candidate_rows(dataset):
        labels = dataset[index]["labels"]
        first_trained = prompt_tokens(labels)
        # A cut row ends in a masked EOS (torchtune's truncate): it keeps a trained token only from prompt + 2 on.
        if first_trained + 1 >= max_seq_len:
            too_long.append((index, first_trained, len(labels)))
    if not too_long:
        return
    index, longest, _ = max(too_long, key=lambda row: row[1])
    needed = max(total for _, _, total in too_long)
    shown = ", ".join(str(i) for i, _, _ in sorted(too_long)[:10])
    raise PromptTooLong(
        f"max_seq_len={max_seq_len} is shorter than the prompt of {len(too_long)} training row(s) "
        f"(row {shown}{' …' if len(too_long) > 10 else ''}, counted from 0 in train_data; the longest prompt is "
        f"{longest} tokens, row {index}): cut there, they keep no trained token and make the loss NaN. "
        f"Fix: set max_seq_len to at least {needed} (their prompt + response), set train_on_input=True, or "
        "remove those rows."
    )


def candidate_rows(dataset: Any) -> list[int]:
    """Indices of the rows whose prompts may be the longest: the CANDIDATE_ROWS longest by characters."""
    rows = dataset._data  # the HF dataset torchtune's SFTDataset reads rows from
    return sorted(range(len(rows)), key=lambda i: _characters(rows[i]), reverse=True)[:CANDIDATE_ROWS]


def prompt_tokens(labels: Any) -> int:
    """Tokens before a row's first trained one (its masked prompt, template included): the index of the first
    label that is not ignored; the whole row when none is trained."""
    return next((pos for pos, label in enumerate(labels) if label != _IGNORE), len(labels))


def _characters(row: dict[str, Any]) -> int:
    return sum(len(str(value)) for value in row.values() if value is not None)


def uncut_tokenizer(config: dict[str, Any]) -> Any:
    """The resolved tokenizer (torchtune), without its max_seq_len: rows come out whole."""
    from omegaconf import OmegaConf
    from torchtune import config as torchtune_config

    return torchtune_config.instantiate(OmegaConf.create({**config["tokenizer"], "max_seq_len": None}))


def rows_as_trained(config: dict[str, Any], tokenizer: Any) -> Any:
    """The resolved dataset node (template, masking, columns) through torchtune, unpacked: row i is tokenized
    exactly as training tokenizes it."""
    from omegaconf import OmegaConf
    from torchtune import config as torchtune_config

    return torchtune_config.instantiate(OmegaConf.create({**config["dataset"], "packed": False}), tokenizer)
