"""Mistral-Nemo (12B) on torchtune 0.6.1's modules: the `mistral_nemo` and `lora_mistral_nemo` component builders.

A Mistral-Nemo decoder is Mistral 7B's (the same MLP, RMSNorms, RoPE, grouped-query attention without biases,
an untied output layer; transformers computes both with `MistralForCausalLM`) with one change: `head_dim` is a
setting of its own, 128 against hidden_size / num_attention_heads = 5120 / 32 = 160. The q/k/v projections are
heads x 128 wide and the output projection maps 32 x 128 = 4096 back to 5120, where torchtune 0.6.1's `mistral`
builder computes head_dim = 160 and builds every projection 5120 wide: a checkpoint would not even load.

torchtune's MultiHeadAttention and RotaryPositionalEmbeddings take any head_dim, so the builders here are
torchtune's `mistral` / `lora_mistral` with head_dim given: the same module names (LoRA keys stay
`attn.q_proj.lora_a.weight`), and, with `quantize_base`, NF4 for every frozen base projection as there.
"""

from __future__ import annotations

from functools import partial

from torch import nn
from torchtune.modules import (
    FeedForward,
    FrozenNF4Linear,
    MultiHeadAttention,
    RMSNorm,
    RotaryPositionalEmbeddings,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)
from torchtune.modules.common_utils import _register_reparametrize_state_dict_hooks
from torchtune.modules.peft import LORA_ATTN_MODULES, DoRALinear, LoRALinear


def mistral_nemo(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    head_dim: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-5,
    rope_base: float = 1_000_000.0,
) -> TransformerDecoder:
    """A Mistral-Nemo decoder with every dimension given (config.json's, through model_inspection.builder_node).

    Args are torchtune's `mistral` builder's, plus `head_dim` (config.json `head_dim`: the q/k/v width of each
    head, independent of embed_dim / num_heads)."""
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
    )


def lora_mistral_nemo(
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
    norm_eps: float = 1e-5,
    rope_base: float = 1_000_000.0,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """`mistral_nemo` with LoRA (DoRA with `use_dora`) on the chosen projections; with `quantize_base` every frozen
    base projection is NF4 (the adapted ones' base weights and the others alike), the output layer excepted.

    Args are torchtune's `lora_mistral` builder's, plus `head_dim`."""
    if not lora_attn_modules:
        raise ValueError("model.lora_attn_modules is empty: name q_proj, k_proj, v_proj or output_proj")
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
        adapted=set(lora_attn_modules) | ({"w1", "w2", "w3"} if apply_lora_to_mlp else set()),
        adapter=partial(adapter, quantize_base=quantize_base),
        frozen=FrozenNF4Linear if quantize_base else nn.Linear,
        output_adapter=adapter if apply_lora_to_output else None,
    )
    if quantize_base:
        # As torchtune's LoRA builders: NF4 weights are saved in the model's dtype, offloaded to CPU one by one.
        _register_reparametrize_state_dict_hooks(model, dtype=model.tok_embeddings.weight.dtype)
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
    adapted: set[str] = frozenset(),
    adapter: partial | None = None,
    frozen: type[nn.Linear] = nn.Linear,
    output_adapter: partial | None = None,
) -> TransformerDecoder:
    """The decoder; the projections named in `adapted` (attention: q_proj ... output_proj; MLP: w1, w2, w3) are
    built by `adapter(in_dim, out_dim)`, the others as bias-free `frozen` linears (nn.Linear, or NF4 for QLoRA)."""

    def linear(name: str, in_dim: int, out_dim: int) -> nn.Module:
        if name in adapted:
            return adapter(in_dim, out_dim)
        return frozen(in_dim, out_dim, bias=False)

    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    rope = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base)
    layers = nn.ModuleList()
    for _ in range(num_layers):
        attention = MultiHeadAttention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=linear("q_proj", embed_dim, q_dim),
            k_proj=linear("k_proj", embed_dim, kv_dim),
            v_proj=linear("v_proj", embed_dim, kv_dim),
            output_proj=linear("output_proj", q_dim, embed_dim),
            pos_embeddings=rope,
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
    output = (
        output_adapter(embed_dim, vocab_size)
        if output_adapter is not None
        else nn.Linear(embed_dim, vocab_size, bias=False)
    )
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(vocab_size, embed_dim),
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=RMSNorm(embed_dim, eps=norm_eps),
        output=output,
    )
