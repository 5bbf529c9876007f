import json

import pytest


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Rows of ~1500 characters (~500 tokens estimated), as a real instruction set: what the real sizes' tests
    resolve with."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"input": "word " * (100 + i % 150), "output": "answer " * 120} for i in range(500)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
