"""A cosine learning-rate schedule whose warmup never trains a step at lr 0 (the trainer's `lr_scheduler`).

torchtune 0.6.1's `get_cosine_schedule_with_warmup` multiplies the lr by step / warmup during warmup, so its
first optimizer step (step 0) trains at lr 0: on a short run that is a wasted step, and on a one-step run the
whole run. Here warmup step s (0-based) trains at (s + 1) / (warmup + 1) of the peak, and after warmup the same
half-cosine as torchtune's decays it. The signature is torchtune's, so a resolved config names this builder as its
`lr_scheduler._component_` with the same keys, and the recipes instantiate it as they do torchtune's.
"""

from __future__ import annotations

import math
from typing import Any

COMPONENT = "kfp_finetune.components._shared.torchtune.lr_schedule.cosine_with_warmup"


def lr_multiplier(
    step: int, num_warmup_steps: int, num_training_steps: int, num_cycles: float = 0.5
) -> float:
    """The fraction of the peak lr that optimizer step `step` (0-based) trains with; > 0 for every step of the
    run (the last step of a half-cosine included: it stops one step short of 0)."""
    if step < num_warmup_steps:
        return (step + 1) / (num_warmup_steps + 1)
    progress = (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress)))


def cosine_with_warmup(
    optimizer: Any,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> Any:
    """A `torch.optim.lr_scheduler.LambdaLR` over `lr_multiplier` (torchtune's builder signature)."""
    from torch.optim.lr_scheduler import LambdaLR

    def multiplier(step: int) -> float:
        return lr_multiplier(step, num_warmup_steps, num_training_steps, num_cycles)

    return LambdaLR(optimizer, multiplier, last_epoch)
