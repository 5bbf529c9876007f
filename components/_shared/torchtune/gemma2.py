"""Gemma 2 builders that soft-cap the logits, as Gemma 2 does: torchtune 0.6.1's, with its final cap moved.

torchtune 0.6.1's gemma2 / lora_gemma2 end in `Gemma2FinalNorm`, which applies `final_capping_value` to the
normalized hidden state *before* the output projection (torchtune/models/gemma2/_component_builders.py), while
Gemma 2 caps the logits after it (transformers' Gemma2ForCausalLM: `tanh(logits / cap) * cap`). Capping a hidden
state of unit scale at 30 does almost nothing, so torchtune's model computes uncapped logits: on a tiny model
whose logits reach 8 they differ from transformers' by 0.19 (tests/components/_shared/torchtune/test_parity.py).
These builders build torchtune's model and move the cap onto the logits; the state dict is unchanged.

The arguments are torchtune's own (installed reads a builder's parameters from its source).
"""

from __future__ import annotations

from torch import nn
from torchtune.models.gemma2 import _component_builders as torchtune_gemma2
from torchtune.modules import TransformerDecoder


class SoftCappedOutput(nn.Module):
    """The output projection, then tanh soft-capping of the logits."""

    def __init__(self, projection, capping_value: float) -> None:
        super().__init__()
        # A TiedLinear (no module, no weights of its own): the state dict keeps only the embedding.
        self.projection = projection
        self.capping = torchtune_gemma2.TanhSoftCapping(capping_value)

    def forward(self, hidden):
        return self.capping(self.projection(hidden))


def _cap_logits(model: TransformerDecoder, final_capping_value: float) -> TransformerDecoder:
    model.norm.logit_capping = (
        nn.Identity()
    )  # the final norm stays (its weights keep their key): no cap there
    model.output = SoftCappedOutput(model.output, final_capping_value)
    return model


def gemma2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: int = 10_000,
    hidden_capping_value: float = 50.0,
    final_capping_value: float = 30.0,
    sliding_window_size: int = 4096,
    query_pre_attn_scalar: int | None = None,
) -> TransformerDecoder:
    """torchtune's gemma2 with the final soft-capping on the logits."""
    model = torchtune_gemma2.gemma2(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        hidden_capping_value=hidden_capping_value,
        final_capping_value=final_capping_value,
        sliding_window_size=sliding_window_size,
        query_pre_attn_scalar=query_pre_attn_scalar,
    )
    return _cap_logits(model, final_capping_value)


def lora_gemma2(
    lora_attn_modules: list[str],
    apply_lora_to_mlp: bool = False,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: int = 10_000,
    hidden_capping_value: float = 50.0,
    final_capping_value: float = 30.0,
    sliding_window_size: int = 4096,
    query_pre_attn_scalar: int | None = None,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """torchtune's lora_gemma2 with the final soft-capping on the logits."""
    model = torchtune_gemma2.lora_gemma2(
        lora_attn_modules=lora_attn_modules,
        apply_lora_to_mlp=apply_lora_to_mlp,
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        hidden_capping_value=hidden_capping_value,
        final_capping_value=final_capping_value,
        sliding_window_size=sliding_window_size,
        query_pre_attn_scalar=query_pre_attn_scalar,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )
    return _cap_logits(model, final_capping_value)
