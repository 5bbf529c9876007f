"""Tokenize and pack a training split once, on CPU, into memory-mappable Arrow; read the packs back in training.

dataset-initialize writes the packs (`pack_split`) in pack_file.py's format, which the fine-tune step's dataset
builder (torchtune_finetune/packed_data.py) memory-maps (`pack_file.ArrowPacks`).

Exactness: rows are tokenized by torchtune's own dataset builder (instruct / chat / text, built from the same
node the fine-tune step would resolve), so tokenizer, prompt template and masking are training's. Whole rows
(instruct, chat) go into packs as bin_packing.py plans them (best-fit decreasing, packs in a seeded order), the
plan the fine-tune step's own packing follows too; text rows, which flow across pack boundaries, are cut by
torchtune's own `PackedDataset` algorithm (a subclass that writes each pack instead of keeping it). Each pack is
laid out as torchtune lays it out, and each sample's first label in a pack is ignored as when torchtune packs in
the fine-tune step (torchtune/sample_packing.py: no target crosses a sample boundary), so tokens, labels,
input_pos and seq_lens are identical to `packed: True` in the recipe. Only the work is moved: rows are tokenized by several processes
(forked, sharing the memory-mapped parquet), once, before any rank starts.

max_seq_len: rows are first tokenized without a limit (their true lengths give the statistics and, unless one is
given, `seq_len.choose_max_seq_len` of them); the few rows longer than the chosen limit are tokenized again by a
builder whose tokenizer has that limit, so they are cut exactly as torchtune cuts them, and rows whose masked prompt
fills it (they would train nothing: seq_len's module docstring) are left out of the packs and reported by index.

The fingerprint (`pack_fingerprint`) covers the pack format, the tokenizer (its component, files' sha256, every
other argument), max_seq_len and the dataset node without its data location (template, masking, columns): the
fine-tune step uses the packs only when its resolved config gives the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len, percentile
from kfp_finetune.components._shared.torchtune.dataset_node import dataset_builder_node
from kfp_finetune.components._shared.torchtune.pack_file import PACK_COLUMNS, PACKS_FILE, pack_writer
from kfp_finetune.components._shared.torchtune.sample_packing import IGNORE_INDEX, ignore_sample_starts
from kfp_finetune.components._shared.torchtune.seq_len import fits

log = get_logger(__name__)

_BATCH_PACKS = 1024
# Dataset-node keys that say where the rows are, not how they are tokenized.
_LOCATION_KEYS = ("source", "data_files", "split", "packed")


# --- the torchtune dataset node and the fingerprint -----------------------------------------------------------


def sft_node(
    hints: dict, data_files: list[str], train_on_input: bool = False, new_system_prompt: str | None = None
) -> dict:
    """The torchtune dataset node for parquet shards written by dataset-initialize, with the masking and system
    prompt given (default: torchtune's, no input training and no new system prompt): the node the fine-tune
    step resolves from the same settings (dataset_node.py)."""
    return dataset_builder_node(
        hints.get("dataset_type", "instruct"),
        source="parquet",
        data_files=data_files,
        data_style=hints.get("data_style", ""),
        text_column=hints.get("text_column") or "",
        conversation_column=hints.get("conversation_column") or "",
        conversation_style=hints.get("conversation_style") or "",
        train_on_input=train_on_input,
        new_system_prompt=new_system_prompt,
    )


def template_of(dataset_node: dict) -> dict:
    """How a dataset node tokenizes (builder, template, masking, columns), without where its rows are."""
    return {k: v for k, v in sorted(dataset_node.items()) if k not in _LOCATION_KEYS}


def tokenizer_fingerprint(tokenizer_node: dict) -> str:
    """sha256 over the tokenizer's component, the sha256 of each file it reads and its other arguments
    (max_seq_len excepted): equal fingerprints tokenize identically."""
    from kfp_finetune.components._shared.storage import hash_file

    described = {}
    for key, value in sorted(tokenizer_node.items()):
        if key == "max_seq_len":
            continue
        if isinstance(value, str) and key.endswith(("path", "file")) and Path(value).is_file():
            value = {"sha256": hash_file(Path(value)).sha256}
        described[key] = value
    return _sha256(described)


def pack_fingerprint(tokenizer_node: dict, dataset_node: dict, max_seq_len: int) -> str:
    """The fingerprint packs carry: same pack format, same tokenizer, same template and masking, same pack
    length."""
    return _sha256(
        {
            "format": PACK_FORMAT,
            "tokenizer": tokenizer_fingerprint(tokenizer_node),
            "template": template_of(dataset_node),
            "max_seq_len": max_seq_len,
        }
    )


#: Bumped when what a pack folder holds changes for the same inputs (2: `prompt_max` counts the tokens before the
#: first trained one; 3: the length is the percentile rule's, rows whose prompt fills it are left out; 4: each
#: sample's first label is ignored; 5: whole rows packed best-fit decreasing, bin_packing.py), so older folders are
#: not reused, nor their packs trained on (the fingerprint).
PACK_FORMAT = 5


def pack_key(tokenizer_fp: str, dataset_node: dict, max_seq_len: int | None) -> str:
    """The folder name of packs (16 hex digits): the pack format, the tokenizer's fingerprint, the node's template
    and masking (`template_of`: train_on_input, new_system_prompt, columns) and the max_seq_len asked for (None:
    from the data). Packs made any other way live in another folder."""
    return _sha256([PACK_FORMAT, tokenizer_fp, template_of(dataset_node), max_seq_len])[:16]


def _sha256(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# --- tokenizing (several processes) ------------------------------------------------------------------------

_DATASET = None  # the unpacked torchtune dataset, set in the parent before forking workers


def _instantiate(node: dict):
    from kfp_finetune.components._shared.torchtune.model_inspection import instantiate

    return instantiate(node)


def _tokenize_range(bounds: tuple[int, int]):
    """Tokens, labels (flat int32) and row lengths of rows [start, end) of the forked dataset."""
    import numpy as np

    start, end = bounds
    tokens, labels, lengths = [], [], []
    for sample in _samples(_DATASET, start, end):
        tokens.extend(sample["tokens"])
        labels.extend(sample["labels"])
        lengths.append(len(sample["tokens"]))
    return (
        np.asarray(tokens, dtype=np.int32),
        np.asarray(labels, dtype=np.int32),
        np.asarray(lengths, dtype=np.int64),
    )


def _samples(ds, start: int, end: int, batch: int = 512):
    """`ds[i]` for i in [start, end): through the builder's own `_prepare_sample` on rows read from Arrow a
    batch at a time (torchtune 0.6's SFTDataset and TextCompletionDataset: `ds[i]` is exactly
    `_prepare_sample(_data[i])`), else one `ds[i]` at a time."""
    data, prepare = getattr(ds, "_data", None), getattr(ds, "_prepare_sample", None)
    if data is None or prepare is None or not hasattr(data, "iter"):
        yield from (ds[i] for i in range(start, end))
        return
    for first in range(start, end, batch):
        columns = data[first : min(first + batch, end)]
        names = list(columns)
        for values in zip(*(columns[n] for n in names), strict=True):
            yield prepare(dict(zip(names, values, strict=True)))


@dataclass
class Tokenized:
    tokens: object  # np.ndarray int32, all rows back to back
    labels: object
    offsets: object  # np.ndarray int64, len(rows) + 1
    seconds: float

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self):
        import numpy as np

        return np.diff(self.offsets)

    def row(self, i: int) -> dict:
        a, b = self.offsets[i], self.offsets[i + 1]
        return {"tokens": self.tokens[a:b].tolist(), "labels": self.labels[a:b].tolist()}


def tokenize(tokenizer_node: dict, dataset_node: dict, num_proc: int = 1) -> Tokenized:
    """Every row of the dataset tokenized by torchtune's builder, without a length limit, by `num_proc`
    forked processes (contiguous chunks, results in row order)."""
    import multiprocessing

    import numpy as np

    global _DATASET
    started = time.monotonic()
    tokenizer = _instantiate({**tokenizer_node, "max_seq_len": None})
    _DATASET = _instantiate({**dataset_node, "packed": False, "tokenizer": tokenizer})
    try:
        rows = len(_DATASET)
        procs = max(1, min(num_proc, rows // 1000 or 1))
        step = max(1, -(-rows // (procs * 8)))
        chunks = [(s, min(s + step, rows)) for s in range(0, rows, step)]
        if procs == 1:
            parts = [_tokenize_range(c) for c in chunks]
        else:
            with multiprocessing.get_context("fork").Pool(procs) as pool:
                parts = pool.map(_tokenize_range, chunks)
    finally:
        _DATASET = None
    lengths = np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = lambda k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int32)  # noqa: E731
    return Tokenized(flat(0), flat(1), offsets, time.monotonic() - started)


def prompt_lengths(tokenized: Tokenized):
    """Each row's masked prompt: the tokens before its first trained one, template included (a row with none
    trained counts whole), as an int64 array in row order."""
    import numpy as np

    sizes = tokenized.lengths()
    if not len(sizes):
        return sizes
    local = np.arange(len(tokenized.labels)) - np.repeat(tokenized.offsets[:-1], sizes)
    untrained = np.where(tokenized.labels != IGNORE_INDEX, local, np.iinfo(np.int64).max)
    first = np.minimum.reduceat(untrained, tokenized.offsets[:-1])
    return np.where(sizes > 0, np.minimum(first, sizes), 0)


def length_stats(tokenized: Tokenized) -> dict:
    """count, p50, p90, p99, max of row lengths and the longest prompt (`prompt_max`, see prompt_lengths)."""
    lengths = tokenized.lengths().tolist()
    return {
        "count": len(lengths),
        "p50": percentile(lengths, 50),
        "p90": percentile(lengths, 90),
        "p99": percentile(lengths, 99),
        "max": max(lengths),
        "prompt_max": int(prompt_lengths(tokenized).max()) if lengths else 0,
    }


# --- packing -----------------------------------------------------------------------------------------------


class _Rows:
    """Tokenized rows as torchtune samples, rows longer than max_seq_len replaced by their truncated form."""

    def __init__(self, tokenized: Tokenized, truncated: dict[int, dict], left_out: set[int]):
        self.tokenized, self.truncated, self.left_out = tokenized, truncated, left_out

    def __len__(self) -> int:
        return len(self.tokenized) - len(self.left_out)

    def __iter__(self):
        for i in range(len(self.tokenized)):
            if i not in self.left_out:
                yield self.truncated.get(i) or self.tokenized.row(i)


def _packer_class():
    from torchtune.datasets import PackedDataset

    class StreamingPacker(PackedDataset):
        """torchtune's PackedDataset, writing each finished pack to Arrow instead of keeping it in memory."""

        def __init__(self, ds, *, max_seq_len: int, split_across_pack: bool, path: Path):
            self._writer, self._schema = pack_writer(path, max_seq_len)
            self._pending: list[dict] = []
            self.num_packs = 0
            super().__init__(ds, max_seq_len=max_seq_len, split_across_pack=split_across_pack)
            self._flush()
            self._writer.close()

        def _add_pack(self, pack) -> None:
            pack = self._pad_pack(self._convert_to_tensors(pack), padding_idx=self.padding_idx)
            ignore_sample_starts(pack["labels"], pack["seq_lens"])
            self._pending.append(pack)
            self.num_packs += 1
            if len(self._pending) >= _BATCH_PACKS:
                self._flush()

        def _flush(self) -> None:
            import pyarrow as pa
            import torch

            if not self._pending:
                return
            columns = []
            for name in PACK_COLUMNS:
                if name == "seq_lens":
                    values = [p[name].to(torch.int32).numpy() for p in self._pending]
                    columns.append(pa.array(values, type=pa.list_(pa.int32())))
                else:
                    flat = torch.stack([p[name] for p in self._pending]).to(torch.int32).reshape(-1).numpy()
                    columns.append(pa.FixedSizeListArray.from_arrays(pa.array(flat), self.max_seq_len))
            self._writer.write_batch(pa.record_batch(columns, schema=self._schema))
            self._pending = []

    return StreamingPacker


@dataclass
class PackResult:
    path: Path | None  # None: the rows were measured only (pack_split's write_packs)
    num_packs: int
    max_seq_len: int
    stats: dict
    truncated_rows: int
    tokenize_seconds: float
    pack_seconds: float
    #: Rows (0-based, in the split's order) left out: their masked prompt fills max_seq_len (seq_len.fits).
    unfit_rows: list[int]
    #: The longest whole row among them (what max_seq_len would have to hold): 0 when there are none.
    unfit_needed: int = 0


def pack_split(
    tokenizer_node: dict,
    dataset_node: dict,
    out_dir: Path,
    max_seq_len: int | None = None,
    max_position_embeddings: int | None = None,
    num_proc: int = 1,
    write_packs: bool = True,
) -> PackResult:
    """Tokenize the rows `dataset_node` reads and write torchtune's packs of them to `out_dir/packs.arrow`;
    `write_packs=False`: measure them only (lengths, max_seq_len, the rows whose prompt fills it), no packs."""
    tokenized = tokenize(tokenizer_node, dataset_node, num_proc)
    stats = length_stats(tokenized)
    if not max_seq_len:
        max_seq_len = choose_max_seq_len(tokenized.lengths().tolist(), max_position_embeddings)
    started = time.monotonic()
    lengths = tokenized.lengths()
    prompts = prompt_lengths(tokenized)
    unfit = [int(i) for i in ((lengths > max_seq_len) & ~fits(prompts, max_seq_len)).nonzero()[0]]
    unfit_needed = int(lengths[unfit].max()) if unfit else 0
    if not write_packs:
        return PackResult(
            None, 0, max_seq_len, stats, int((lengths > max_seq_len).sum()), tokenized.seconds, 0.0,
            unfit_rows=unfit, unfit_needed=unfit_needed,
        )  # fmt: skip
    # Rows at the limit are tokenized again by a builder whose tokenizer has it, so they are cut exactly as
    # torchtune cuts them (text completion keeps max_seq_len - 1 tokens, chat and instruct end in EOS).
    left_out = set(unfit)
    long_rows = [int(i) for i in (lengths >= max_seq_len - 1).nonzero()[0] if int(i) not in left_out]
    truncated: dict[int, dict] = {}
    if long_rows:
        tokenizer = _instantiate({**tokenizer_node, "max_seq_len": max_seq_len})
        limited = _instantiate({**dataset_node, "packed": False, "tokenizer": tokenizer})
        truncated = {i: limited[i] for i in long_rows}
        long_rows = [i for i in long_rows if len(truncated[i]["tokens"]) < lengths[i]]
        log.info("%d row(s) longer than max_seq_len %d are cut to it", len(long_rows), max_seq_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PACKS_FILE
    split_across = dataset_node["_component_"].endswith("text_completion_dataset")
    split_across = bool(dataset_node.get("split_across_pack", split_across))
    if split_across:  # text: torchtune's own loop (rows flow over pack boundaries)
        rows = _Rows(tokenized, truncated, left_out)
        num_packs = _packer_class()(
            rows, max_seq_len=max_seq_len, split_across_pack=True, path=path
        ).num_packs
    else:
        num_packs = _pack_whole_rows(_replaced(tokenized, truncated, left_out), max_seq_len, path)
    return PackResult(
        path, num_packs, max_seq_len, stats, len(long_rows), tokenized.seconds, time.monotonic() - started,
        unfit_rows=unfit, unfit_needed=unfit_needed,
    )  # fmt: skip


def _replaced(tokenized: Tokenized, rows: dict[int, dict], left_out: set[int]) -> Tokenized:
    """`tokenized` with the given rows replaced (by their truncated form) and the `left_out` ones removed."""
    import numpy as np

    if not rows and not left_out:
        return tokenized
    empty = {"tokens": [], "labels": []}
    parts: dict[str, list] = {"tokens": [], "labels": []}
    lengths = tokenized.lengths().copy()
    previous = 0
    for i in sorted({*rows, *left_out}):
        row = empty if i in left_out else rows[i]
        for key in parts:
            whole = getattr(tokenized, key)
            parts[key].append(whole[tokenized.offsets[previous] : tokenized.offsets[i]])
            parts[key].append(np.asarray(row[key], np.int32))
        lengths[i] = len(row["tokens"])
        previous = i + 1
    for key in parts:
        parts[key].append(getattr(tokenized, key)[tokenized.offsets[previous] :])
    lengths = np.delete(lengths, sorted(left_out))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Tokenized(
        np.concatenate(parts["tokens"]), np.concatenate(parts["labels"]), offsets, tokenized.seconds
    )


def _reordered(tokenized: Tokenized, order) -> Tokenized:
    """`tokenized` with its rows in this order."""
    import numpy as np

    lengths = tokenized.lengths()[order]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # each new token's index in the old arrays: its row's old start plus its place in the row
    index = np.repeat(tokenized.offsets[:-1][order] - offsets[:-1], lengths) + np.arange(offsets[-1])
    return Tokenized(tokenized.tokens[index], tokenized.labels[index], offsets, tokenized.seconds)


def _pack_whole_rows(tokenized: Tokenized, max_seq_len: int, path: Path) -> int:
    """Packs of whole rows as bin_packing.py plans them (best-fit decreasing, packs in a seeded order), each laid
    out as torchtune's PackedDataset lays out a pack: tokens padded with 0 (its padding_idx), labels with -100,
    input_pos counting on past the last row (clamped to max_seq_len - 1), the padding as one more seq_len; each
    row's first label ignored (sample_packing.py). The equality test holds it to the fine-tune step's own packing
    of the rows, which follows the same plan."""
    import numpy as np
    import pyarrow as pa

    from kfp_finetune.components._shared.bin_packing import plan_packs

    plan = plan_packs(tokenized.lengths(), max_seq_len)
    tokenized = _reordered(tokenized, plan.order)
    bounds = plan.bounds.tolist()  # the row each pack starts with, in the reordered rows
    lengths = tokenized.lengths()
    positions = np.arange(tokenized.offsets[-1], dtype=np.int64) - np.repeat(tokenized.offsets[:-1], lengths)
    positions = positions.astype(np.int32)
    writer, schema = pack_writer(path, max_seq_len)
    num_packs = len(bounds) - 1
    with writer:
        for first in range(0, num_packs, _BATCH_PACKS):
            count = min(_BATCH_PACKS, num_packs - first)
            tokens = np.zeros((count, max_seq_len), np.int32)
            labels = np.full((count, max_seq_len), IGNORE_INDEX, np.int32)
            input_pos = np.zeros((count, max_seq_len), np.int32)
            seq_lens = []
            for j in range(count):
                r0, r1 = bounds[first + j], bounds[first + j + 1]
                a, b = tokenized.offsets[r0], tokenized.offsets[r1]
                n, pad = b - a, max_seq_len - (b - a)
                tokens[j, :n] = tokenized.tokens[a:b]
                labels[j, :n] = tokenized.labels[a:b]
                input_pos[j, :n] = positions[a:b]
                after = positions[b - 1] + 1
                input_pos[j, n:] = np.clip(np.arange(after, after + pad), 0, max_seq_len - 1)
                row_lens = lengths[r0:r1].astype(np.int32)
                ignore_sample_starts(labels[j], row_lens)
                seq_lens.append(np.append(row_lens, np.int32(pad)) if pad else row_lens)
            columns = [
                pa.FixedSizeListArray.from_arrays(pa.array(a.reshape(-1)), max_seq_len)
                for a in (tokens, labels, input_pos)
            ]
            columns.append(pa.array(seq_lens, type=pa.list_(pa.int32())))
            writer.write_batch(pa.record_batch(columns, schema=schema))
    return num_packs
