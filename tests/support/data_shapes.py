"""The tiny dataset's rows (kfp_finetune.tiny.dataset: "Uppercase: c a t s" -> "C A T S") written in every data
shape dataset-initialize accepts, for end-to-end tests. Nothing is committed: each test writes its own files."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kfp_finetune.tiny.dataset import PROMPT_PREFIX, make_rows

SYSTEM_PROMPT = "You upper-case codes."


@dataclass(frozen=True)
class Shape:
    """One data shape: how to write it, the dataset-initialize parameters it needs, and what it becomes."""

    name: str
    write: Callable[[list[dict], Path], Path]  # (tiny rows, an existing folder) -> the data_uri to pass
    data_type: str = "instruct"
    column_map: dict = field(default_factory=dict)
    written_style: str = "input_output"  # dataset-initialize's data_style for it
    generates: bool = True  # whether evaluate has a prompt to generate from (not for text)


def letters(row: dict) -> str:
    return row["input"].removeprefix(PROMPT_PREFIX).strip()


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def alpaca_csv(rows: list[dict], folder: Path) -> Path:
    path = folder / "alpaca.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["instruction", "input", "output"])
        writer.writeheader()
        writer.writerows(
            {"instruction": PROMPT_PREFIX, "input": letters(r), "output": r["output"]} for r in rows
        )
    return path


def renamed_json_array(rows: list[dict], folder: Path) -> Path:
    """input/output under other names, as one JSON array, with a column the type does not use."""
    path = folder / "qa.json"
    records = [{"id": i, "question": r["input"], "answer": r["output"]} for i, r in enumerate(rows)]
    path.write_text(json.dumps(records))
    return path


def alpaca_system_jsonl(rows: list[dict], folder: Path) -> Path:
    """Alpaca rows with a per-row system prompt under another name."""
    records = [
        {"persona": SYSTEM_PROMPT, "instruction": PROMPT_PREFIX, "input": letters(r), "output": r["output"]}
        for r in rows
    ]
    return _jsonl(folder / "with-system.jsonl", records)


def openai_parquet(rows: list[dict], folder: Path) -> Path:
    path = folder / "messages.parquet"
    messages = [
        {"messages": [{"role": "user", "content": r["input"]}, {"role": "assistant", "content": r["output"]}]}
        for r in rows
    ]
    pq.write_table(pa.Table.from_pylist(messages), path)
    return path


def sharegpt_folder(rows: list[dict], folder: Path) -> Path:
    """Two JSON Lines files in a folder; both form the `train` split (datasets' file-name conventions)."""
    records = [
        {"conversations": [{"from": "human", "value": r["input"]}, {"from": "gpt", "value": r["output"]}]}
        for r in rows
    ]
    half = len(records) // 2
    _jsonl(folder / "sharegpt" / "train-00000.jsonl", records[:half])
    _jsonl(folder / "sharegpt" / "train-00001.jsonl", records[half:])
    return folder / "sharegpt"


def text_folder(rows: list[dict], folder: Path) -> Path:
    """A corpus of .txt files, one example a line, with blank lines between groups (skipped)."""
    lines = [f"{r['input']} = {r['output']}" for r in rows]
    corpus = folder / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    half = len(lines) // 2
    (corpus / "part-a.txt").write_text("\n\n".join(lines[:half]) + "\n")
    (corpus / "part-b.txt").write_text("\n".join(lines[half:]) + "\n")
    return corpus


SHAPES = {
    shape.name: shape
    for shape in (
        Shape("alpaca-csv", alpaca_csv, written_style="alpaca"),
        Shape(
            "column-map-json-array", renamed_json_array, column_map={"input": "question", "output": "answer"}
        ),
        # With a system prompt, instruct rows are written (and trained) as OpenAI messages.
        Shape(
            "system-prompt-jsonl",
            alpaca_system_jsonl,
            column_map={"system": "persona"},
            written_style="openai",
        ),
        Shape("openai-parquet", openai_parquet, data_type="chat", written_style="openai"),
        Shape("sharegpt-folder", sharegpt_folder, data_type="chat", written_style="sharegpt"),
        Shape("text-txt-folder", text_folder, data_type="text", written_style="text", generates=False),
    )
}


def tiny_rows(count: int) -> list[dict]:
    """`count` rows of the tiny task (distinct prompts, seeded)."""
    train, _ = make_rows(seed=0, train_rows=count, eval_rows=0)
    return train
