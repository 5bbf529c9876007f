"""Qwen2's LoRA builder with DoRA computed as DoRA is defined: torchtune 0.6.1's, its biased DoRA layers fixed.

Qwen2 is the one layout with biases (q/k/v) in the layers LoRA adapts, where torchtune 0.6.1's DoRA also scales
the bias (dora.py). The arguments are torchtune's own (installed reads a builder's parameters from its
source).
"""

from __future__ import annotations

from torchtune.models.qwen2 import lora_qwen2 as torchtune_lora_qwen2
from torchtune.modules import TransformerDecoder

from kfp_finetune.components._shared.torchtune.dora import unscale_dora_biases


def lora_qwen2(
    lora_attn_modules: list[str],
    apply_lora_to_mlp: bool = False,
    apply_lora_to_output: bool = False,
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """torchtune's lora_qwen2; with use_dora, its biased DoRA layers leave the bias unscaled."""
    model = torchtune_lora_qwen2(
        lora_attn_modules=lora_attn_modules,
        apply_lora_to_mlp=apply_lora_to_mlp,
        apply_lora_to_output=apply_lora_to_output,
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        tie_word_embeddings=tie_word_embeddings,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        use_dora=use_dora,
        quantize_base=quantize_base,
    )
    return unscale_dora_biases(model)
