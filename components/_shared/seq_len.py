"""How long a training sequence is by default: long enough for almost every row, never longer than the model.

Used where the tokenized lengths of the training data are known (dataset-initialize, which tokenizes once with
the training tokenizer, and the fine-tune step, which reads what it recorded): `max_seq_len` is the 99th
percentile of prompt + response tokens, rounded up to a multiple of 256 (kernel- and packing-friendly), capped by
the model's `max_position_embeddings`. Rows longer than that are cut (and counted in the step log), so memory is
bounded by the data, not by its longest outlier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILE = 99.0
MULTIPLE = 256


def percentile(lengths: Sequence[int], q: float = PERCENTILE) -> int:
    """The `q`-th percentile of `lengths` (nearest rank: a length some row really has)."""
    if not lengths:
        raise ValueError("no lengths: the training data is empty")
    ordered = sorted(lengths)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def choose_max_seq_len(lengths: Sequence[int], max_position_embeddings: int | None) -> int:
    """The default max_seq_len for rows of these token lengths (see the module docstring)."""
    wanted = math.ceil(percentile(lengths) / MULTIPLE) * MULTIPLE
    return min(wanted, max_position_embeddings) if max_position_embeddings else wanted
