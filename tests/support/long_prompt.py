"""Instruct rows where one prompt in a hundred is far longer than every other whole row: the 99th percentile of
the lengths alone gives a max_seq_len that cuts that row inside its prompt (seq_len.choose_max_seq_len)."""

from __future__ import annotations

import json
from pathlib import Path

ROWS = 100
LONG_ROW = 37
LONG_WORDS = 150  # about 300 tokens of the tiny tokenizer: over 256, the p99 length of the others


def long_prompt_rows() -> list[dict]:
    rows = [{"input": f"say {i}", "output": f"ok {i}"} for i in range(ROWS)]
    rows[LONG_ROW] = {"input": " ".join(f"word{i}" for i in range(LONG_WORDS)), "output": "fine"}
    return rows


def write_jsonl(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in long_prompt_rows()))
    return path
