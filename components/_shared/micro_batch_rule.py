"""How many tokens a micro-batch holds by default on a GPU, on either engine (DESIGN.md §7): enough to keep the
GPU's matmuls busy, no more than memory allows, and activation checkpointing only where nothing smaller that
still keeps the GPU busy fits without it (recomputing every layer's forward costs ~30 % of each step). Each engine's
wing applies it with its own memory model (torchtune/defaults.py, transformers/fast.py).

Where that makes the global batch (per optimizer step, over all devices) more than GLOBAL_GROWTH_ACCEPTED times
what the default learning rate was set for, an Adam-type optimizer's default rate grows with the square root of the
ratio, at most LR_SCALE_CAP times (the square-root rule for adaptive optimizers: Malladi et al., "On the SDEs and
Scaling Rules for Adaptive Gradient Algorithms", NeurIPS 2022).
"""

from __future__ import annotations

import math

#: Tokens per micro-batch, most first: big enough to keep an H100 busy, small enough for activations.
MICRO_BATCH_TOKENS = (16384, 8192)
#: The smallest micro-batch that still keeps a GPU's matmuls busy scales inversely with the model's width: tokens x
#: hidden size of 2^23 (4096 tokens for a 1B model's 2048, 2048 for 8B's 4096, 1024 for 70B's 8192), within
#: [1024, 8192]. Micro-batches down to it are tried without activation checkpointing before checkpointing is turned
#: on, and a small global batch shrinks the micro-batch down to it rather than being outgrown by a fixed 8k.
BUSY_TOKENS_X_WIDTH = 2**23
BUSY_FLOOR_RANGE = (1024, 8192)


def busy_floor(hidden_size: int) -> int:
    """The fewest tokens per micro-batch that keep a `hidden_size`-wide model's matmuls busy (BUSY_TOKENS_X_WIDTH)."""
    low, high = BUSY_FLOOR_RANGE
    return max(low, min(high, BUSY_TOKENS_X_WIDTH // int(hidden_size)))


def busy_sequences(seq_len: int) -> list[int]:
    """Whole sequences of `seq_len` per micro-batch for each of MICRO_BATCH_TOKENS, rounded down (at least one): a
    micro-batch never grows past the busy sizes to fill a sequence."""
    return [max(1, tokens // seq_len) for tokens in MICRO_BATCH_TOKENS]


#: How much larger the global batch may grow before the learning rate follows it.
GLOBAL_GROWTH_ACCEPTED = 1.5
#: The most the square-root rule raises a default learning rate.
LR_SCALE_CAP = 2.0


def square_root_rate(rate: float, ratio: float) -> float | None:
    """`rate` for a global batch `ratio` times the one it was set for (the square-root rule, at most LR_SCALE_CAP
    times, 3 significant digits); None where the batch grew no more than GLOBAL_GROWTH_ACCEPTED."""
    if ratio <= GLOBAL_GROWTH_ACCEPTED:
        return None
    return float(f"{rate * min(math.sqrt(ratio), LR_SCALE_CAP):.3g}")
