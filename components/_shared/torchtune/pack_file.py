"""The packs' file format, which both sides depend on: dataset-initialize writes it (packing.pack_split), the
fine-tune step's dataset builder (torchtune_finetune/packed_data.py) memory-maps it (`ArrowPacks`).

One Arrow IPC file of record batches; each row is a pack laid out as torchtune's PackedDataset lays one out:
tokens, labels and input_pos as fixed-size lists of max_seq_len int32, seq_lens as a list of int32; the schema's
metadata holds max_seq_len.
"""

from __future__ import annotations

import bisect
import os
from pathlib import Path

PACKS_FILE = "packs.arrow"
PACK_COLUMNS = ("tokens", "labels", "input_pos", "seq_lens")


def pack_writer(path: Path, max_seq_len: int):
    """An Arrow file writer for packs of `max_seq_len` tokens at `path`, and its schema."""
    import pyarrow as pa

    fixed = pa.list_(pa.int32(), max_seq_len)
    schema = pa.schema(
        [("tokens", fixed), ("labels", fixed), ("input_pos", fixed), ("seq_lens", pa.list_(pa.int32()))],
        metadata={"max_seq_len": str(max_seq_len)},
    )
    return pa.ipc.new_file(str(path), schema), schema


class ArrowPacks:
    """Packs memory-mapped from Arrow files: a map-style dataset of dicts of int64 tensors, as PackedDataset's."""

    def __init__(self, paths: list[str | os.PathLike]):
        import pyarrow as pa

        self._batches = []
        self._starts = []
        total = 0
        self.max_seq_len = None
        for path in paths:
            reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
            self.max_seq_len = int(reader.schema.metadata[b"max_seq_len"])
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                self._starts.append(total)
                self._batches.append(batch)
                total += batch.num_rows
        self._len = total

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, idx: int) -> dict:
        import numpy as np
        import torch

        if not -self._len <= idx < self._len:
            raise IndexError(idx)
        idx %= self._len
        b = bisect.bisect_right(self._starts, idx) - 1
        batch, row = self._batches[b], idx - self._starts[b]
        out = {}
        for name in PACK_COLUMNS:
            column = batch.column(name)
            if name == "seq_lens":
                values = np.asarray(column[row].values)
            else:
                n = self.max_seq_len
                values = column.flatten().to_numpy(zero_copy_only=True)[row * n : (row + 1) * n]
            out[name] = torch.from_numpy(values.astype(np.int64))
        return out
