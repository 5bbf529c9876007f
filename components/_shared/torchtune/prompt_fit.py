"""Rows whose prompt leaves no trained token within `max_seq_len`, found before any training starts.

torchtune cuts every row at `tokenizer.max_seq_len`. When the prompt alone (template included) fills that length
and prompts are masked (`train_on_input: False`), the row keeps no trained token (the cut also replaces its
last kept token by a masked EOS, so a prompt of P tokens needs max_seq_len >= P + 2): it trains nothing, and a
micro-batch of only such rows has a loss of 0/0, NaN, which poisons the run. The rule is seq_len.py's, as for
dataset-initialize's packs (which leave such rows out): a few are counted and reported; more than
unfit_rows.MAX_UNFIT_SHARE of the rows, or as many as one micro-batch holds (then a micro-batch of only them can
happen: torchtune drops only the last, incomplete batch), are refused with the numbers and the fix.

Here the rows are tokenized exactly as training will (the resolved dataset and tokenizer nodes, through
torchtune), but only the longest by UTF-8 bytes: the tokens of byte-level BPE and byte-fallback tokenizers grow
with bytes, not characters (300 emoji are 1,200 bytes and ~1,200 tokens), and tokenizing every row would cost
minutes on a large dataset. dataset-initialize, which tokenizes every row for its packs, finds them all.
"""

from __future__ import annotations

from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune import seq_len
from kfp_finetune.components._shared.unfit_rows import too_many_unfit

log = get_logger(__name__)

#: How many of the longest rows (by UTF-8 bytes) are tokenized.
CANDIDATE_ROWS = 64
MAX_NAMED_ROWS = 10
_IGNORE = -100  # torchtune.data.CROSS_ENTROPY_IGNORE_IDX


class PromptTooLong(ConfigError):
    """Some training rows' prompts fill max_seq_len; the message names them and the fix."""


def check_prompts_fit(config: dict[str, Any]) -> None:
    """Raise PromptTooLong when too many training rows would keep no trained token after truncation (see the
    module docstring); log the few that are only counted.

    Checked only where it can happen and is cheap to know: a max_seq_len is set, prompts are masked, and the data
    are local files (an HF dataset source is loaded by training itself; dataset-initialize's packs hold none)."""
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
    unfit = []
    for index in candidate_rows(dataset):
        labels = dataset[index]["labels"]
        if not seq_len.fits(prompt_tokens(labels), max_seq_len):
            unfit.append((index, len(labels)))
    if not unfit:
        return
    unfit.sort()
    batch_size = int(config.get("batch_size") or 1)
    refused = too_many_unfit(len(unfit), len(dataset))
    if not refused and len(unfit) >= batch_size:
        refused = f"enough to fill a micro-batch of {batch_size}, whose loss would be NaN"
    named = [f"train_data row {index} (counted from 0)" for index, _ in unfit[:MAX_NAMED_ROWS]]
    needed = max(total for _, total in unfit)
    message = seq_len.unfit_message(len(unfit), len(dataset), max_seq_len, needed, named, refused)
    if refused:
        raise PromptTooLong(message)
    log.warning("%s", message)


def candidate_rows(dataset: Any) -> list[int]:
    """Indices of the rows whose prompts may be the longest: the CANDIDATE_ROWS longest in UTF-8 bytes."""
    rows = dataset._data  # the HF dataset torchtune's SFTDataset reads rows from
    return sorted(range(len(rows)), key=lambda i: _utf8_bytes(rows[i]), reverse=True)[:CANDIDATE_ROWS]


def prompt_tokens(labels: Any) -> int:
    """Tokens before a row's first trained one (its masked prompt, template included): the index of the first
    label that is not ignored; the whole row when none is trained."""
    return next((pos for pos, label in enumerate(labels) if label != _IGNORE), len(labels))


def _utf8_bytes(row: dict[str, Any]) -> int:
    return sum(len(str(value).encode()) for value in row.values() if value is not None)


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
