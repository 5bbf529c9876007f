"""Qwen3 dense (0.6B-32B) on torchtune 0.6.1's modules: the `qwen3` and `lora_qwen3` component builders.

A Qwen3 dense decoder is Qwen2's (same MLP, RMSNorms, half-split RoPE, tied embeddings up to 4B) with three
changes, as transformers' `modeling_qwen3.py` computes them:

- q/k/v projections have no biases;
- `head_dim` is a setting of its own (128 in every size), not hidden_size / num_attention_heads (0.6B: 1024 / 16);
- q and k pass an RMSNorm over each head (`q_norm`, `k_norm`, weights of head_dim) *before* RoPE.

torchtune 0.6.1's MultiHeadAttention takes `q_norm` / `k_norm` but applies them *after* the positional embeddings.
RMSNorm's scaling is rotation-invariant but its per-channel weight is not: with trained weights norm-then-rotate
and rotate-then-norm are different models. `Qwen3Attention` keeps MultiHeadAttention's construction, module names
(so LoRA keys stay `attn.q_proj.lora_a.weight`, as torchtune's recipes and PEFT expect), KV cache and attention
call (SDPA, or flex attention for packed masks) and computes only its forward in Qwen3's order.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.modules import (
    FeedForward,
    MultiHeadAttention,
    RMSNorm,
    TiedLinear,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)
from torchtune.modules.attention_utils import _MaskType
from torchtune.modules.common_utils import reparametrize_as_dtype_state_dict_post_hook
from torchtune.modules.peft import LORA_ATTN_MODULES, DoRALinear, LoRALinear


class Qwen3Attention(MultiHeadAttention):
    """MultiHeadAttention with Qwen3's order: project, RMSNorm each q/k head, then RoPE (module docstring).

    Self-attention only (the decoder layer passes its input as both `x` and `y`); `q_norm`, `k_norm` and
    `pos_embeddings` are required."""

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        mask: _MaskType | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self._heads(x, y, input_pos)
        if self.kv_cache is not None and self.cache_enabled:
            k, v = self.kv_cache.update(k, v)
        return self._attend(q, k, v, mask)

    def _heads(
        self, x: torch.Tensor, y: torch.Tensor | None, input_pos: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [b, heads, s, head_dim]: q and k normed per head, then rotated."""
        if y is None:
            raise ValueError(f"{type(self).__name__} is self-attention: pass the layer's input as y as well")
        q = self._normed_rotated_heads(self.q_proj(x), self.q_norm, input_pos)
        k = self._normed_rotated_heads(self.k_proj(y), self.k_norm, input_pos)
        v = self.v_proj(y).unflatten(-1, (-1, self.head_dim)).transpose(1, 2)
        return q, k, v

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: _MaskType | None
    ) -> torch.Tensor:
        """The attention call (SDPA, or flex attention for a BlockMask) and the output projection."""
        # Grouped-query attention: each k/v head serves a group of q heads.
        if self.num_heads != self.num_kv_heads:
            group = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = self._attention_call(
            q,
            k,
            v,
            mask=mask,
            dropout_p=self.attn_dropout if self.training else 0.0,
            # As MultiHeadAttention: causal by default only without a cache (generation passes its own mask).
            is_causal=self.kv_cache is None and mask is None and self.is_causal,
        )
        return self.output_proj(out.transpose(1, 2).flatten(2))

    def _normed_rotated_heads(
        self, projected: torch.Tensor, norm: nn.Module, input_pos: torch.Tensor | None
    ) -> torch.Tensor:
        """[b, s, heads * head_dim] -> [b, heads, s, head_dim]: RMSNorm over each head, then RoPE."""
        heads = norm(projected.unflatten(-1, (-1, self.head_dim)))
        return self.pos_embeddings(heads, input_pos=input_pos).transpose(1, 2)


def qwen3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
) -> TransformerDecoder:
    """A Qwen3 dense decoder with every dimension given (config.json's, through model_inspection.builder_node).

    Args are torchtune's `qwen2` builder's, plus `head_dim` (config.json `head_dim`: q/k/v width of each head,
    independent of embed_dim / num_heads)."""
    return _decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        head_dim=head_dim,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        tie_word_embeddings=tie_word_embeddings,
    )


def lora_qwen3(
    lora_attn_modules: list[LORA_ATTN_MODULES],
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
    head_dim: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    tie_word_embeddings: bool = False,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """`qwen3` with LoRA (DoRA with `use_dora`, NF4 base weights with `quantize_base`) on the chosen projections.

    Args are torchtune's `lora_qwen2` builder's, plus `head_dim`. As there, the output projection is never
    quantized, and `apply_lora_to_output` with tied embeddings is refused (there is no output weight)."""
    if not lora_attn_modules:
        raise ValueError("model.lora_attn_modules is empty: name q_proj, k_proj, v_proj or output_proj")
    if apply_lora_to_output and tie_word_embeddings:
        raise ValueError(
            "model.apply_lora_to_output with model.tie_word_embeddings: there is no output weight to adapt"
        )
    adapter = partial(
        DoRALinear if use_dora else LoRALinear, rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout
    )
    model = _decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        head_dim=head_dim,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        tie_word_embeddings=tie_word_embeddings,
        adapted=set(lora_attn_modules) | ({"w1", "w2", "w3"} if apply_lora_to_mlp else set()),
        adapter=partial(adapter, quantize_base=quantize_base),
        output_adapter=adapter if apply_lora_to_output else None,
    )
    if quantize_base:
        # As torchtune's LoRA builders: NF4 weights are saved in the model's dtype, offloaded to CPU one by one.
        model._register_state_dict_hook(
            partial(
                reparametrize_as_dtype_state_dict_post_hook,
                dtype=model.tok_embeddings.weight.dtype,
                offload_to_cpu=True,
            )
        )
    return model


def _decoder(
    *,
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: int,
    attn_dropout: float,
    norm_eps: float,
    rope_base: float,
    tie_word_embeddings: bool,
    adapted: set[str] = frozenset(),
    adapter: partial | None = None,
    output_adapter: partial | None = None,
) -> TransformerDecoder:
    """The decoder; the projections named in `adapted` (attention: q_proj ... output_proj; MLP: w1, w2, w3) are
    built by `adapter(in_dim, out_dim)`, the others as bias-free nn.Linear."""

    def linear(name: str, in_dim: int, out_dim: int) -> nn.Module:
        if name in adapted:
            return adapter(in_dim, out_dim)
        return nn.Linear(in_dim, out_dim, bias=False)

    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    rope = Qwen2RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base)
    layers = nn.ModuleList()
    for _ in range(num_layers):
        attention = Qwen3Attention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=linear("q_proj", embed_dim, q_dim),
            k_proj=linear("k_proj", embed_dim, kv_dim),
            v_proj=linear("v_proj", embed_dim, kv_dim),
            output_proj=linear("output_proj", q_dim, embed_dim),
            pos_embeddings=rope,
            q_norm=RMSNorm(dim=head_dim, eps=norm_eps),
            k_norm=RMSNorm(dim=head_dim, eps=norm_eps),
            max_seq_len=max_seq_len,
            attn_dropout=attn_dropout,
        )
        mlp = FeedForward(
            gate_proj=linear("w1", embed_dim, intermediate_dim),
            down_proj=linear("w2", intermediate_dim, embed_dim),
            up_proj=linear("w3", embed_dim, intermediate_dim),
        )
        layers.append(
            TransformerSelfAttentionLayer(
                attn=attention,
                mlp=mlp,
                sa_norm=RMSNorm(dim=embed_dim, eps=norm_eps),
                mlp_norm=RMSNorm(dim=embed_dim, eps=norm_eps),
            )
        )
    tok_embeddings = nn.Embedding(vocab_size, embed_dim)
    if tie_word_embeddings:
        output = TiedLinear(tok_embeddings)
    elif output_adapter is not None:
        output = output_adapter(embed_dim, vocab_size)
    else:
        output = nn.Linear(embed_dim, vocab_size, bias=False)
    return TransformerDecoder(
        tok_embeddings=tok_embeddings,
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=RMSNorm(embed_dim, eps=norm_eps),
        output=output,
    )
