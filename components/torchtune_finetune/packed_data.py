"""The dataset builder the resolved YAML names when dataset-initialize packed the data: torchtune instantiates
`kfp_finetune.components.torchtune_finetune.packed_data.packed_dataset` with the recipe's tokenizer, and it
memory-maps the packs (no tokenization on any rank). The file format is _shared/torchtune/packing.py's."""

from __future__ import annotations

from kfp_finetune.components._shared.torchtune.pack_file import ArrowPacks

COMPONENT = f"{__name__}.packed_dataset"


def packed_dataset(
    tokenizer, *, files: list[str], max_seq_len: int, packed: bool = True, **_ignored
) -> ArrowPacks:
    """The packs in `files` (written for `max_seq_len`); refuses a tokenizer with another max_seq_len.

    `packed` is read by the recipe (it picks the packed collate function) and must stay true; other keys
    (the fingerprint, kept in the YAML for the record; the torchtune node the packs stand for, which evaluation
    reads: packs.py) are ignored."""
    if not packed:
        raise ValueError("packed_dataset holds packs: leave dataset.packed true")
    if tokenizer is not None and getattr(tokenizer, "max_seq_len", max_seq_len) != max_seq_len:
        raise ValueError(
            f"the packs were made for a `tokenizer.max_seq_len` of {max_seq_len} but the tokenizer has {tokenizer.max_seq_len}"
        )
    packs = ArrowPacks(files)
    if packs.max_seq_len != max_seq_len:
        raise ValueError(f"{files} hold packs of {packs.max_seq_len} tokens, not {max_seq_len}")
    return packs
