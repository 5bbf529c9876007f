"""How many training rows that keep no trained token a run may leave out, on every engine: a row whose masked
prompt fills max_seq_len trains nothing once cut (torchtune: _shared/torchtune/seq_len.py; TRL drops it:
_shared/transformers/train.py). A few are counted and said; more than MAX_UNFIT_SHARE of the rows is refused with
the numbers and the fix."""

from __future__ import annotations

#: The share of rows whose prompt may leave no trained token within max_seq_len (left out, counted) before the
#: run is refused: the 99th percentile rule itself lets at most this share be longer than max_seq_len.
MAX_UNFIT_SHARE = 0.01


def too_many_unfit(unfit: int, rows: int) -> str:
    """Why `unfit` rows of `rows` that keep no trained token are too many to leave out (see MAX_UNFIT_SHARE);
    empty when they are not."""
    if unfit > max(1, MAX_UNFIT_SHARE * rows):
        return f"more than {MAX_UNFIT_SHARE:.0%} of the rows"
    return ""
