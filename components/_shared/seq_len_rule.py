"""How long a training sequence is by default, on either engine: long enough for almost every row, never set by
one outlier.

`max_seq_len` is the 99th percentile of the rows' token lengths as they train (template included; nearest rank,
and never the single longest row: with fewer than 100 rows that is the longest but one), rounded up to a multiple
of 256 (kernel- and packing-friendly), capped by the model's positions. Rows longer than it are cut, so memory
and the pack length follow the data, not its longest outlier. Each engine's wing measures the lengths its own way
(torchtune/seq_len.py, transformers/seq_len.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

PERCENTILE = 99.0
MULTIPLE = 256
#: Rows a sample of the training data holds where lengths are measured on a sample.
SAMPLE_ROWS = 2000
SAMPLE_SEED = 0


def percentile(lengths: Sequence[int], q: float = PERCENTILE) -> int:
    """The `q`-th percentile of `lengths` (nearest rank: a length some row really has). Below the 100th it is
    never the single longest of two or more rows: one outlier does not set it."""
    if not lengths:
        raise ValueError("no lengths: the training data is empty")
    ordered = sorted(lengths)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    if q < 100 and len(ordered) > 1:
        rank = min(rank, len(ordered) - 1)
    return ordered[rank - 1]


def choose_max_seq_len(lengths: Sequence[int], max_position_embeddings: int | None) -> int:
    """The default max_seq_len for rows of these token lengths (see the module docstring)."""
    wanted = math.ceil(percentile(lengths) / MULTIPLE) * MULTIPLE
    return min(wanted, max_position_embeddings) if max_position_embeddings else wanted


def sample_indices(total: int, rows: int = SAMPLE_ROWS, seed: int = SAMPLE_SEED) -> list[int]:
    """A seeded random sample of `rows` of `total` row indices, in order (every index where there are fewer):
    the same on every process that draws it."""
    return sorted(random.Random(seed).sample(range(total), rows)) if total > rows else list(range(total))
