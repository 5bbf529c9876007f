"""A synthetic instruct dataset a tiny model can learn on CPU in about a minute.

Task: upper-case a random four-letter code. The letters are separated by spaces so that every letter is
one token (" c", " a", ...), and the fixed length puts every answer letter at the same distance from its
source letter, which one attention head of a two-layer model learns within a few hundred steps:

    input:  "Uppercase: c a t s"
    output: "C A T S"

A randomly initialised model gets no exact match; after a short fine-tune it upper-cases held-out codes
exactly, so "tuned exact-match > base exact-match" is a meaningful check. Columns are `input` and `output`
(the defaults of torchtune's `instruct_dataset`). Held-out words never occur in the training split.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

NUM_LETTERS = 4
PROMPT_PREFIX = "Uppercase:"

DEFAULT_TRAIN_ROWS = 20000
DEFAULT_EVAL_ROWS = 100


def make_example(rng: random.Random) -> tuple[str, str]:
    """One (input, output) pair drawn from `rng`."""
    letters = [rng.choice(string.ascii_lowercase) for _ in range(NUM_LETTERS)]
    return f"{PROMPT_PREFIX} {' '.join(letters)}", " ".join(letters).upper()


def make_rows(seed: int, train_rows: int, eval_rows: int) -> tuple[list[dict], list[dict]]:
    """Distinct rows for both splits; the held-out split is drawn first so its size never changes train."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: list[list[dict]] = []
    for size in (eval_rows, train_rows):
        rows = []
        while len(rows) < size:
            prompt, answer = make_example(rng)
            if prompt not in seen:
                seen.add(prompt)
                rows.append({"input": prompt, "output": answer})
        splits.append(rows)
    eval_split, train_split = splits
    return train_split, eval_split


def build_tiny_dataset(
    out_dir: str | Path,
    seed: int = 0,
    train_rows: int = DEFAULT_TRAIN_ROWS,
    eval_rows: int = DEFAULT_EVAL_ROWS,
) -> dict[str, Path]:
    """Write `train`/`eval` splits as JSON Lines and Parquet; returns {"train.jsonl": path, ...}."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, held_out = make_rows(seed, train_rows, eval_rows)
    paths: dict[str, Path] = {}
    for split, rows in (("train", train), ("eval", held_out)):
        jsonl = out / f"{split}.jsonl"
        jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        parquet = out / f"{split}.parquet"
        table = pa.Table.from_pylist(
            rows, schema=pa.schema([("input", pa.string()), ("output", pa.string())])
        )
        # No creator/version metadata and fixed options, so the bytes only depend on the rows.
        pq.write_table(table, parquet, compression="snappy", store_schema=False, write_statistics=False)
        paths[jsonl.name], paths[parquet.name] = jsonl, parquet
    return paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-rows", type=int, default=DEFAULT_TRAIN_ROWS)
    parser.add_argument("--eval-rows", type=int, default=DEFAULT_EVAL_ROWS)


def run(args: argparse.Namespace) -> int:
    paths = build_tiny_dataset(args.out, seed=args.seed, train_rows=args.train_rows, eval_rows=args.eval_rows)
    for path in paths.values():
        print(path)
    return 0
