"""Little data in a user's shape: `count` alpaca rows ("Write the number 123 backwards." -> "321."), for the runs
that show what every default does with the least data a run learns from (issue 23)."""

import json
from pathlib import Path


def alpaca_rows(path: Path, count: int) -> Path:
    rows = [
        {"instruction": f"Write the number {i} backwards.", "input": "", "output": str(i)[::-1] + "."}
        for i in range(100, 100 + count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
