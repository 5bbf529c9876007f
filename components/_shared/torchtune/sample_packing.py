"""Packs whose labels never cross a sample boundary: the rule, and the dataset builder a resolved YAML names when
torchtune packs the rows itself.

torchtune 0.6.1's recipes shift labels over the whole packed row (`labels[..., 1:]` then one ignored label), so in
a pack holding sample A then sample B, A's last position is trained to predict B's first label. Unpacked, a
sample's first label is never a target; when it is trained (text completion, `train_on_input`) the packed loss
has one cross-sample target per boundary. torchtune main moved the shift into the datasets after 0.6.1 (its PR
2613, never released). Here the label at every sample's first position in a pack is ignored
(`ignore_sample_starts`), so the recipe's shift finds no target across a boundary and its count of trained tokens
(labels not ignored, before the shift) equals the targets it trains.

Both ways a run gets packs follow the rule, and the same plan of which rows share a pack (bin_packing.py:
best-fit decreasing): dataset-initialize's pack writer (_shared/torchtune/packing.py) and, when torchtune packs, `packed`
below: resolve.py names it in place of the torchtune builder (`wrap`), which it calls unpacked and packs into
torchtune's PackedDataset layout (rows that flow across packs, text completion's default, by torchtune's own
loop). Importing this module imports no torch.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from kfp_finetune.components._shared.torchtune import builder_nodes

IGNORE_INDEX = -100  # torchtune.data.CROSS_ENTROPY_IGNORE_IDX
COMPONENT = f"{__name__}.packed"


def sample_starts(seq_lens) -> list[int]:
    """The first position of each sample (and of the padding) in a pack with these `seq_lens`."""
    starts, position = [], 0
    for length in seq_lens:
        starts.append(position)
        position += int(length)
    return starts


def ignore_sample_starts(labels, seq_lens) -> None:
    """Ignore, in place, the label at each sample's first position of a pack (a 1-d tensor or array)."""
    labels[sample_starts(seq_lens)] = IGNORE_INDEX


def wrap(node: dict) -> dict:
    """A packed torchtune dataset node as the node of `packed` over the same builder and arguments; any other node
    (unpacked, dataset-initialize's packs, a builder outside torchtune) unchanged."""
    if not node.get("packed") or not str(node.get("_component_", "")).startswith("torchtune."):
        return node
    return builder_nodes.wrap(node, COMPONENT)


def unwrap(node: dict) -> dict:
    """The torchtune node `wrap` made this from (what evaluation and torchtune's validation read); else `node`."""
    return builder_nodes.unwrap(node, COMPONENT)


def packed(
    tokenizer: Any, *, builder: str, packed: bool = True, split_across_pack: bool | None = None, **kwargs
):
    """torchtune's `builder` (e.g. torchtune.datasets.instruct_dataset) with these arguments, packed in its layout
    (to `tokenizer.max_seq_len`, padding id 0, across packs only where the builder splits by default or
    `split_across_pack` says so; whole rows as bin_packing.py plans), each sample's first label ignored.
    `packed=False`: the builder's unpacked rows."""
    build = builder_nodes.builder(builder)
    rows = build(tokenizer, packed=False, **kwargs)
    if not packed:
        return rows
    if tokenizer.max_seq_len is None:
        raise ValueError("packing needs `tokenizer.max_seq_len` (the pack length): set tune_max_seq_len")
    if split_across_pack is None:
        default = inspect.signature(build).parameters.get("split_across_pack")
        split_across_pack = bool(default.default) if default is not None else False
    return _packed_dataset_class()(
        rows, max_seq_len=tokenizer.max_seq_len, split_across_pack=split_across_pack
    )


@functools.cache
def _packed_dataset_class():
    from torchtune.datasets import PackedDataset

    from kfp_finetune.components._shared.bin_packing import plan_packs

    class SamplePackedDataset(PackedDataset):
        """torchtune's PackedDataset, whole rows packed as bin_packing.py plans; each pack's sample starts
        ignored."""

        def _pack(self) -> None:
            if self.split_across_pack:  # rows flow over pack boundaries: torchtune's loop, in row order
                super()._pack()
                return
            rows = list(self.ds)
            plan = plan_packs([len(row["tokens"]) for row in rows], self.max_seq_len)
            for k in range(len(plan)):
                pack: dict[str, list] = {"tokens": [], "labels": [], "input_pos": [], "seq_lens": []}
                for i in plan.order[plan.bounds[k] : plan.bounds[k + 1]].tolist():
                    size = len(rows[i]["tokens"])
                    pack["tokens"] += rows[i]["tokens"]
                    pack["labels"] += rows[i]["labels"]
                    pack["input_pos"] += range(size)
                    pack["seq_lens"].append(size)
                self._add_pack(pack)

        def _add_pack(self, pack) -> None:
            super()._add_pack(pack)
            ignore_sample_starts(self.packs[-1]["labels"], self.packs[-1]["seq_lens"])

    return SamplePackedDataset
