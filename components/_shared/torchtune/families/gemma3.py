"""Gemma 3 (text) on torchtune 0.6.1's modules: the `gemma3` and `lora_gemma3` component builders.

A Gemma 3 text decoder (transformers' `modeling_gemma3.py`, `Gemma3ForCausalLM`) is Gemma 2's layer — Gemma's
RMSNorm scaling by 1 + weight, a norm before and after both attention and MLP, the tanh GELU MLP, embeddings
scaled by sqrt(hidden_size) in the weights' dtype, the output tied to them — with these changes:

- q and k pass a Gemma RMSNorm over each head (`q_norm`, `k_norm`) *before* RoPE, as Qwen3's do (families/qwen3.py:
  torchtune 0.6.1's MultiHeadAttention would apply them after);
- two kinds of layer, listed per layer in `layer_types` (released models: five `sliding_attention` layers, then
  one `full_attention`): a local layer attends to the last `sliding_window` positions (its own included) and
  rotates with base `rope_local_base_freq` (10 000); a global layer attends to every earlier position and rotates
  with base `rope_theta` (1 000 000), positions divided by a linear `rope_scaling` factor where there is one (8
  in the 4B-27B models);
- no soft-capping (attention and final logits are uncapped); scores scaled by `query_pre_attn_scalar ** -0.5`.

`Gemma3Attention` is Qwen3's attention (families/qwen3.py: MultiHeadAttention's construction, module names, so
LoRA keys are `attn.q_proj.lora_a.weight`, KV cache and attention call, which is SDPA, or flex attention for a
packed batch's BlockMask, flex_attention.py; the q/k norms before RoPE) with Gemma 3's query scale and window. SDPA
and flex attention scale by head_dim ** -0.5, so q is multiplied by sqrt(head_dim / query_pre_attn_scalar) first
(1 in every size but 27B: 128 against 168). RoPE is half-split, as transformers' `rotate_half`: the weights need
no reordering (conversions.py "GEMMA3").

A local layer narrows whatever mask it gets to its window (`SlidingWindow`): none (a causal band), a tensor (a
packed batch on CPU, or generation's mask over the KV cache, both in the positions keys are stored at) or a
BlockMask (a packed batch on CUDA: its mask_mod and the window, built once per batch for all local layers).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, and_masks, create_block_mask
from torchtune.models.gemma.gemma_norm_embedding import GemmaNormEmbeddings
from torchtune.models.gemma.rms_norm import GemmaRMSNorm
from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
from torchtune.modules import (
    FeedForward,
    TiedLinear,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
)
from torchtune.modules.attention_utils import _MaskType
from torchtune.modules.common_utils import reparametrize_as_dtype_state_dict_post_hook
from torchtune.modules.peft import LORA_ATTN_MODULES, DoRALinear, LoRALinear

from kfp_finetune.components._shared.torchtune.families.qwen3 import Qwen3Attention

SLIDING, FULL = "sliding_attention", "full_attention"  # config.json's layer_types values


class LinearScaledRotaryEmbeddings(Qwen2RotaryPositionalEmbeddings):
    """Half-split RoPE whose positions are divided by `scale_factor` (transformers' "linear" rope_type: the
    inverse frequencies divided by the factor); factor 1 is plain half-split RoPE."""

    def __init__(self, dim: int, max_seq_len: int, base: float, scale_factor: float = 1.0) -> None:
        self.scale_factor = scale_factor  # read by rope_init, which the parent's __init__ calls
        super().__init__(dim=dim, max_seq_len=max_seq_len, base=base)

    def rope_init(self) -> None:
        # Recipes call rope_init again after materializing a model built on the meta device: the parent registers
        # a fresh theta each time, so the factor divides it once.
        super().rope_init()
        if self.scale_factor != 1.0:
            self.theta.div_(self.scale_factor)
            self.build_rope_cache(self.max_seq_len)


class SlidingWindow:
    """The window of a model's local layers, applied to the mask each one gets (module docstring). One object is
    shared by the local layers, so a packed batch's BlockMask is narrowed once, not once per layer."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._narrowed: tuple[BlockMask, BlockMask] | None = None  # (the batch's mask, narrowed)

    def narrow(self, mask: _MaskType | None, queries: torch.Tensor, kv_len: int) -> _MaskType | None:
        """`mask` allowing only keys fewer than `size` positions behind each query; `queries`: the positions of
        the queries among the `kv_len` keys (0..s-1 without a KV cache). Unchanged where there are no more keys
        than the window holds (None: plain causal)."""
        if isinstance(mask, BlockMask):
            return self._narrow_block_mask(mask)
        if kv_len <= self.size:
            return mask
        keys = torch.arange(kv_len, device=queries.device)
        behind = queries[:, None] - keys[None, :]
        window = behind < self.size
        if mask is None:  # no mask: causal
            return (window & (behind >= 0))[None]
        return mask & window

    @torch.compiler.disable
    def _narrow_block_mask(self, mask: BlockMask) -> BlockMask:
        """The BlockMask's own rule and the window, as a BlockMask (outside torch.compile: it is built eagerly)."""
        if self._narrowed is not None and self._narrowed[0] is mask:
            return self._narrowed[1]
        q_len, kv_len = mask.seq_lengths
        narrowed = mask
        if kv_len > self.size:
            size = self.size

            def within_window(b, h, q_idx, kv_idx):
                return q_idx - kv_idx < size

            narrowed = create_block_mask(
                and_masks(mask.mask_mod, within_window),
                B=mask.shape[0],
                H=mask.shape[1],
                Q_LEN=q_len,
                KV_LEN=kv_len,
                device=mask.kv_num_blocks.device,
                BLOCK_SIZE=mask.BLOCK_SIZE,
            )
        self._narrowed = (mask, narrowed)
        return narrowed


class Gemma3Attention(Qwen3Attention):
    """Qwen3's attention order (project, norm each q/k head, RoPE: families/qwen3.py) with Gemma 3's query scale,
    and for a local layer its `window` (module docstring).

    Self-attention only (the decoder layer passes its input as both `x` and `y`); `q_norm`, `k_norm` and
    `pos_embeddings` are required."""

    def __init__(self, *, window: SlidingWindow | None, query_pre_attn_scalar: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.window = window
        # SDPA / flex attention multiply the scores by head_dim ** -0.5; Gemma 3 by query_pre_attn_scalar ** -0.5.
        self.query_scale = (self.head_dim / query_pre_attn_scalar) ** 0.5

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        mask: _MaskType | None = None,
        input_pos: torch.Tensor | None = None,
    ) -> torch.Tensor:
        q, k, v = self._heads(x, y, input_pos)
        if self.query_scale != 1.0:
            q = q * self.query_scale
        cached = self.kv_cache is not None and self.cache_enabled
        # Where the queries sit among the keys: after those cached so far (a copy: the update advances the
        # cache's positions in place), or from 0.
        queries = (
            self.kv_cache.cache_pos[: x.shape[1]].clone()
            if cached
            else torch.arange(x.shape[1], device=x.device)
        )
        if cached:
            k, v = self.kv_cache.update(k, v)
        if self.window is not None:
            mask = self.window.narrow(mask, queries, kv_len=k.shape[2])
        return self._attend(q, k, v, mask)


def gemma3(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    layer_types: list[str],
    sliding_window_size: int | None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    local_rope_base: float = 10_000.0,
    scale_factor: float = 1.0,
    query_pre_attn_scalar: float = 256,
) -> TransformerDecoder:
    """A Gemma 3 text decoder with every dimension given (config.json's, through model_inspection.builder_node).

    Args are torchtune's `gemma2` builder's without soft-capping, plus: `layer_types` (config.json's, one
    "sliding_attention" or "full_attention" per layer), `local_rope_base` (`rope_local_base_freq`: the local
    layers' RoPE base; `rope_base` is the global layers'), `scale_factor` (the global layers' linear RoPE
    scaling factor). `sliding_window_size` None: local layers attend as global ones do."""
    return _decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        layer_types=layer_types,
        sliding_window_size=sliding_window_size,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        local_rope_base=local_rope_base,
        scale_factor=scale_factor,
        query_pre_attn_scalar=query_pre_attn_scalar,
    )


def lora_gemma3(
    lora_attn_modules: list[LORA_ATTN_MODULES],
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
    layer_types: list[str],
    sliding_window_size: int | None,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 1_000_000.0,
    local_rope_base: float = 10_000.0,
    scale_factor: float = 1.0,
    query_pre_attn_scalar: float = 256,
    lora_rank: int,
    lora_alpha: float,
    lora_dropout: float = 0.0,
    use_dora: bool = False,
    quantize_base: bool = False,
) -> TransformerDecoder:
    """`gemma3` with LoRA (DoRA with `use_dora`, NF4 base weights with `quantize_base`) on the chosen projections.

    Args are `gemma3`'s plus torchtune's `lora_gemma2` LoRA arguments. As there, the output layer (the tied
    embedding) takes no adapter."""
    if not lora_attn_modules:
        raise ValueError("model.lora_attn_modules is empty: name q_proj, k_proj, v_proj or output_proj")
    adapter = partial(
        DoRALinear if use_dora else LoRALinear,
        rank=lora_rank,
        alpha=lora_alpha,
        dropout=lora_dropout,
        quantize_base=quantize_base,
    )
    model = _decoder(
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        num_kv_heads=num_kv_heads,
        embed_dim=embed_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        layer_types=layer_types,
        sliding_window_size=sliding_window_size,
        attn_dropout=attn_dropout,
        norm_eps=norm_eps,
        rope_base=rope_base,
        local_rope_base=local_rope_base,
        scale_factor=scale_factor,
        query_pre_attn_scalar=query_pre_attn_scalar,
        adapted=set(lora_attn_modules) | ({"w1", "w2", "w3"} if apply_lora_to_mlp else set()),
        adapter=adapter,
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
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    layer_types: list[str],
    sliding_window_size: int | None,
    attn_dropout: float,
    norm_eps: float,
    rope_base: float,
    local_rope_base: float,
    scale_factor: float,
    query_pre_attn_scalar: float,
    adapted: set[str] = frozenset(),
    adapter: partial | None = None,
) -> TransformerDecoder:
    """The decoder; the projections named in `adapted` (attention: q_proj ... output_proj; MLP: w1, w2, w3) are
    built by `adapter(in_dim, out_dim)`, the others as bias-free nn.Linear."""
    if len(layer_types) != num_layers or set(layer_types) - {SLIDING, FULL}:
        raise ValueError(
            f"layer_types must name {SLIDING!r} or {FULL!r} for each of the {num_layers} layers: {layer_types}"
        )

    def linear(name: str, in_dim: int, out_dim: int) -> nn.Module:
        if name in adapted:
            return adapter(in_dim, out_dim)
        return nn.Linear(in_dim, out_dim, bias=False)

    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    ropes = {
        SLIDING: LinearScaledRotaryEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=local_rope_base),
        FULL: LinearScaledRotaryEmbeddings(
            dim=head_dim, max_seq_len=max_seq_len, base=rope_base, scale_factor=scale_factor
        ),
    }
    windows = {
        SLIDING: None if sliding_window_size is None else SlidingWindow(sliding_window_size),
        FULL: None,
    }
    layers = nn.ModuleList()
    for layer_type in layer_types:
        attention = Gemma3Attention(
            embed_dim=embed_dim,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            q_proj=linear("q_proj", embed_dim, q_dim),
            k_proj=linear("k_proj", embed_dim, kv_dim),
            v_proj=linear("v_proj", embed_dim, kv_dim),
            output_proj=linear("output_proj", q_dim, embed_dim),
            pos_embeddings=ropes[layer_type],
            q_norm=GemmaRMSNorm(head_dim, eps=norm_eps),
            k_norm=GemmaRMSNorm(head_dim, eps=norm_eps),
            max_seq_len=max_seq_len,
            attn_dropout=attn_dropout,
            window=windows[layer_type],
            query_pre_attn_scalar=query_pre_attn_scalar,
        )
        mlp = FeedForward(
            gate_proj=linear("w1", embed_dim, intermediate_dim),
            down_proj=linear("w2", intermediate_dim, embed_dim),
            up_proj=linear("w3", embed_dim, intermediate_dim),
            activation=nn.GELU(approximate="tanh"),
        )
        layers.append(
            TransformerSelfAttentionLayer(
                attn=attention,
                mlp=mlp,
                sa_norm=GemmaRMSNorm(embed_dim, eps=norm_eps),  # input_layernorm
                sa_scale=GemmaRMSNorm(embed_dim, eps=norm_eps),  # post_attention_layernorm
                mlp_norm=GemmaRMSNorm(embed_dim, eps=norm_eps),  # pre_feedforward_layernorm
                mlp_scale=GemmaRMSNorm(embed_dim, eps=norm_eps),  # post_feedforward_layernorm
            )
        )
    tok_embeddings = GemmaNormEmbeddings(vocab_size, embed_dim)
    return TransformerDecoder(
        tok_embeddings=tok_embeddings,
        layers=layers,
        max_seq_len=max_seq_len,
        num_heads=num_heads,
        head_dim=head_dim,
        norm=GemmaRMSNorm(embed_dim, eps=norm_eps),
        output=TiedLinear(tok_embeddings),
    )
