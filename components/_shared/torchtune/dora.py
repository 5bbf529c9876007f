"""DoRA that leaves a linear layer's bias unscaled, as DoRA is defined and PEFT computes it.

DoRA rescales a weight: W' = m * (W + s B A) / ||W + s B A||, the bias staying as it is (the DoRA paper; PEFT's
DoraLinearLayer takes the bias out before scaling). torchtune 0.6.1's DoRALinear.forward scales the whole base
output, bias included: `m / ||W + s B A|| * (x W^T + b)`. Without biases the two agree; with them (Qwen2's q/k/v
projections) the model trained is not the one `get_merged_lora_ckpt` merges nor the one PEFT loads: logits differ
by 0.6 on a tiny Qwen2 model once the magnitudes move (tests/components/_shared/torchtune/test_parity.py).
"""

from __future__ import annotations

import torch
from torch import nn
from torchtune.modules.peft import DoRALinear


class BiasedDoRALinear(DoRALinear):
    """torchtune's DoRALinear, with the bias taken back out of the magnitude's scaling."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)  # scale * (x W^T + b) + scale * s * B A x
        if self.disabled:
            return out
        return out - (self._magnitude_scale(x.dtype) - 1) * self.bias

    def _magnitude_scale(self, dtype: torch.dtype) -> torch.Tensor:
        """m / ||W + s B A|| per output row, as the parent computes it (its norm detached, as there)."""
        # Through the modules' __call__, as the parent does: FSDP's hooks gather the sharded LoRA weights there.
        eye = torch.eye(self.lora_a.weight.shape[1], device=self.lora_a.weight.device, dtype=dtype)
        lora_weight = self.lora_b(self.lora_a(eye)).T
        weight_norm = self._get_weight_norm(self.weight.to(dtype), lora_weight.detach()).detach()
        return self.magnitude / weight_norm


def unscale_dora_biases(model: nn.Module) -> nn.Module:
    """Every DoRALinear with a bias becomes a BiasedDoRALinear (same parameters and state-dict keys); the
    builders create their adapter layers inside, so the class is exchanged after building."""
    for module in model.modules():
        if type(module) is DoRALinear and module.use_bias:
            module.__class__ = BiasedDoRALinear
    return model
