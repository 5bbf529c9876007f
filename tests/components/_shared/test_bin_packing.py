"""Which rows share a pack (bin_packing.py): every row once, no pack over its length, packs nearly full on
long-tailed lengths, the same plan for the same lengths, and no run of packs holding the longest rows."""

from __future__ import annotations

import numpy as np
import pytest

from kfp_finetune.components._shared.bin_packing import plan_packs


def _long_tailed(rows: int, max_seq_len: int, seed: int = 0) -> np.ndarray:
    """Token lengths shaped as the GPU suite's rows (log-normal, median about 200 tokens, sigma 0.8), the rows
    longer than the pack cut to it as dataset-initialize cuts them."""
    lengths = np.random.default_rng(seed).lognormal(np.log(200), 0.8, rows).astype(np.int64)
    return np.clip(lengths, 1, max_seq_len)


def _packs(plan) -> list[list[int]]:
    return [plan.order[a:b].tolist() for a, b in zip(plan.bounds[:-1], plan.bounds[1:], strict=True)]


def _best_fit_decreasing(lengths: list[int], max_seq_len: int) -> list[int]:
    """The free space left in each pack by the textbook algorithm, one row at a time (sorted)."""
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        fits = [p for p, space in enumerate(free) if space >= lengths[i]]
        if fits:
            free[min(fits, key=lambda p: free[p])] -= lengths[i]
        else:
            free.append(max_seq_len - lengths[i])
    return sorted(free)


@pytest.mark.parametrize("max_seq_len", [2048, 4096, 8192])
def test_every_row_once_no_pack_over_its_length_and_packs_nearly_full(max_seq_len):
    lengths = _long_tailed(20_000, max_seq_len)
    plan = plan_packs(lengths, max_seq_len)
    packs = _packs(plan)
    assert sorted(r for p in packs for r in p) == list(range(len(lengths)))
    filled = np.array([lengths[p].sum() for p in packs])
    assert filled.max() <= max_seq_len
    assert filled.sum() / (len(packs) * max_seq_len) >= 0.98


def test_the_plan_is_best_fit_decreasing():
    rng = np.random.default_rng(1)
    for _ in range(100):
        max_seq_len = int(rng.integers(8, 64))
        lengths = rng.integers(1, max_seq_len + 1, int(rng.integers(0, 80)))
        plan = plan_packs(lengths, max_seq_len)
        free = sorted(max_seq_len - int(lengths[p].sum()) for p in _packs(plan))
        assert free == _best_fit_decreasing(lengths.tolist(), max_seq_len)


def test_the_same_lengths_give_the_same_packs_and_ties_go_by_row_index():
    lengths = _long_tailed(5_000, 2048, seed=3)
    first, again = plan_packs(lengths, 2048), plan_packs(lengths.copy(), 2048)
    assert np.array_equal(first.order, again.order) and np.array_equal(first.bounds, again.bounds)
    # four rows of one length, two to a pack: the first two rows share one
    assert sorted(_packs(plan_packs([5, 5, 5, 5], 10))) == [[0, 1], [2, 3]]


def test_packs_are_in_no_order_of_length_and_rows_in_a_pack_in_data_order():
    """Best-fit decreasing opens packs longest row first; shuffled, the packs' longest rows do not trend over an
    epoch (rank correlation with the pack's place near 0)."""
    lengths = _long_tailed(20_000, 2048, seed=5)
    packs = _packs(plan_packs(lengths, 2048))
    longest = np.array([lengths[p].max() for p in packs])
    ranks = np.argsort(np.argsort(longest, kind="stable"))
    assert abs(np.corrcoef(ranks, np.arange(len(packs)))[0, 1]) < 0.05
    assert all(p == sorted(p) for p in packs)


def test_a_row_longer_than_the_pack_is_refused_and_empty_rows_are_kept():
    with pytest.raises(ValueError, match="a row of 11 tokens does not fit a pack of 10"):
        plan_packs([3, 11], 10)
    assert sorted(r for p in _packs(plan_packs([0, 10, 0, 4], 10)) for r in p) == [0, 1, 2, 3]
    assert len(plan_packs([], 10)) == 0
