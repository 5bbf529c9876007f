"""How long a training sequence is by default: long enough for almost every row, never longer than the model.

Used where the tokenized lengths of the training data are known (dataset-initialize, which tokenizes once with
the training tokenizer, and the fine-tune step, which reads what it recorded): `max_seq_len` is the 99th
percentile of prompt + response tokens, rounded up to a multiple of 256 (kernel- and packing-friendly), raised
where needed so the longest masked prompt keeps a trained token, capped by the model's `max_position_embeddings`.
With `train_on_input: False` a row cut inside its prompt has nothing to learn from (prompt_fit refuses the run),
and torchtune ends a cut instruct or chat row in a masked EOS: a prompt of P tokens needs P + 2 (prompt, one
trained token, EOS), rounded up to 256. Rows longer than that are cut (and counted in the step
log), so memory is bounded by the data, not by its longest outlier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

PERCENTILE = 99.0
MULTIPLE = 256
#: Tokens a cut row needs beyond its prompt: one trained token and the masked EOS torchtune ends the cut with.
CUT_EXTRA = 2


def percentile(lengths: Sequence[int], q: float = PERCENTILE) -> int:
    """The `q`-th percentile of `lengths` (nearest rank: a length some row really has)."""
    if not lengths:
        raise ValueError("no lengths: the training data is empty")
    ordered = sorted(lengths)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _round_up(tokens: int) -> int:
    return math.ceil(tokens / MULTIPLE) * MULTIPLE


def choose_max_seq_len(
    lengths: Sequence[int], max_position_embeddings: int | None, longest_prompt: int = 0
) -> int:
    """The default max_seq_len for rows of these token lengths whose longest masked prompt (tokens before a row's
    first trained one) is `longest_prompt` tokens (0: unknown or none; see the module docstring)."""
    wanted = _round_up(percentile(lengths))
    if longest_prompt > 0:
        wanted = max(wanted, _round_up(longest_prompt + CUT_EXTRA))
    return min(wanted, max_position_embeddings) if max_position_embeddings else wanted
