"""3. Dataset initialize throughput: rows/s for an N-row JSONL file (default 1M rows) → validated parquet shards,
vs plain `datasets.load_dataset("json", ...).to_parquet(...)` on the same file.

Both sides run in this process (so neither pays an import), each with a fresh Arrow cache folder on the same
disk, alternating which goes first. Ours: `initialize_dataset(file, workspace, dataset_type="instruct")` with its
defaults (single process, 100k rows per shard): load, canonical columns, every row validated, shards written,
sha256 of every shard, manifest. Baseline: load + one parquet file, nothing checked.
"""

from __future__ import annotations

import json
import random
import shutil
import string
from pathlib import Path

from benchmarks.common import Settings, Timer, fresh_dir, median, spread

NAME = "dataset_init"
TITLE = "3. Dataset initialize throughput (JSONL → validated parquet shards)"


def big_jsonl(workdir: Path, rows: int) -> Path:
    """Instruct rows like the tiny kit's task (input/output strings, ~60 bytes per row), deterministic."""
    path = workdir / "data" / f"instruct-{rows}.jsonl"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for _ in range(rows):
            letters = [rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8))]
            f.write(
                json.dumps({"input": "Uppercase: " + " ".join(letters), "output": " ".join(letters).upper()})
            )
            f.write("\n")
    tmp.replace(path)
    return path


def ours(source: Path, base: Path, num_proc: int) -> float:
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset

    workspace = fresh_dir(base / "ours")
    with Timer() as t:
        result = initialize_dataset(
            str(source), str(workspace), "big", dataset_type="instruct", num_proc=num_proc
        )
    assert not result.skipped
    return t.seconds


def baseline(source: Path, base: Path, num_proc: int) -> float:
    import datasets

    out = fresh_dir(base / "baseline")
    with Timer() as t:
        ds = datasets.load_dataset(
            "json",
            data_files=str(source),
            split="train",
            cache_dir=str(out / "cache"),
            num_proc=num_proc if num_proc > 1 else None,
        )
        ds.to_parquet(str(out / "train.parquet"))
    return t.seconds


def run(s: Settings, echo=print) -> dict:
    import datasets

    datasets.disable_progress_bars()
    base = fresh_dir(s.workdir / NAME)
    rows = s.dataset_rows
    num_proc = int(s.extra.get("num_proc", 1))
    source = big_jsonl(s.workdir, rows)
    ours_t, base_t = [], []
    for repeat in range(s.repeats):
        order = (("ours", ours), ("baseline", baseline))
        for side, fn in order if repeat % 2 == 0 else order[::-1]:
            seconds = fn(source, base, num_proc)
            (ours_t if side == "ours" else base_t).append(seconds)
            echo(f"  {side}: {seconds:.2f}s, {rows / seconds:,.0f} rows/s")
    shutil.rmtree(base, ignore_errors=True)
    ratio = median(base_t) / median(ours_t)
    return {
        "name": NAME,
        "title": TITLE,
        "target": "rows/s ratio (ours / plain datasets) >= 1.0",
        "met": ratio >= 1.0,
        "headline": f"ours {rows / median(ours_t):,.0f} rows/s vs plain {rows / median(base_t):,.0f} rows/s: ratio {ratio:.3f}",
        "results": {
            "rows_per_second_ratio": round(ratio, 4),
            "ours_rows_per_second": spread([rows / t for t in ours_t]),
            "baseline_rows_per_second": spread([rows / t for t in base_t]),
            "ours_seconds": spread(ours_t),
            "baseline_seconds": spread(base_t),
        },
        "settings": {
            "rows": rows,
            "file_bytes": source.stat().st_size,
            "num_proc": num_proc,
            "rows_per_shard": 100_000,
            "repeats": s.repeats,
        },  # fmt: skip
    }
