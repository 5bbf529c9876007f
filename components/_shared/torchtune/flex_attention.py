"""Flex attention for packed batches compiled as torchtune main compiles it, not with 0.6.1's `dynamic=False`.

On CUDA (compute capability 7.5 or newer) torchtune 0.6.1 gives packed batches a BlockMask, and every attention
layer then calls `flex_attention_compiled`, built once at import as `torch.compile(flex_attention,
dynamic=False)` (torchtune/modules/attention_utils.py), whatever the run's `compile` says; with `compile: True`
the compiled layers graph-break around it. That is the path torchtune main changed after 0.6.1 in "[compile] Fix
compile producing NaNs" (its PR 2765): flex attention compiled without `dynamic=False` (automatic dynamic shapes,
torch.compile's default), together with keeping the MoE experts (Llama 4) out of compilation, whose unbacked
sizes had corrupted memory in flex attention and produced the NaNs.

Our fix, for the dense families this project trains: resolve.py names `flex_attention_model` as the `model`
builder of a packed CUDA run (`wrap`, recorded as a defaults Choice). It builds the model with the family's
torchtune builder and points each attention layer's call at `attention_call`, which sends BlockMask batches to
flex attention compiled with torch.compile's defaults (`compiled_flex_attention`, behind `torch.compiler.disable`
as torchtune's is) and everything else to the layer's own call. No torchtune
file or module global is changed. benchmarks/gpu_checks/flex_compile_nan.py compares both settings on a GPU.
Importing this module imports no torch.
"""

from __future__ import annotations

import functools
from typing import Any

from kfp_finetune.components._shared.torchtune import builder_nodes

COMPONENT = f"{__name__}.flex_attention_model"
SETTING = "flex_attention"
#: The value the Choice records: how this run's flex attention is compiled.
COMPILED = "torch.compile(flex_attention) without dynamic=False"
REASON = (
    "packed batches on CUDA attend through flex attention, which torchtune 0.6.1 compiles with dynamic=False, the "
    "setting its main branch dropped when fixing NaNs under compile (its PR 2765); the attention layers here call "
    "flex attention compiled with torch.compile's defaults, as main does (_shared/torchtune/flex_attention.py)"
)


def wrap(node: dict) -> dict:
    """The model node as the node of `flex_attention_model` over the same builder and arguments."""
    return builder_nodes.wrap(node, COMPONENT)


def unwrap(node: dict) -> dict:
    """The family builder's node `wrap` made this from (what torchtune's validation binds); else `node`."""
    return builder_nodes.unwrap(node, COMPONENT)


def flex_attention_model(*, builder: str, **kwargs: Any) -> Any:
    """torchtune's model `builder` with these arguments, its attention layers calling `attention_call`."""
    model = builder_nodes.builder(builder)(**kwargs)
    flex = compiled_flex_attention()  # here, not on the first call: that is inside compiled layers
    for layer in model.modules():
        if hasattr(layer, "_attention_call"):  # torchtune.modules.MultiHeadAttention
            layer._attention_call = attention_call(layer._attention_call, flex)
    return model


def attention_call(own_call, flex):
    """An attention layer's call (q, k, v, mask, dropout_p, is_causal) that computes BlockMask batches with `flex`
    (compiled_flex_attention) and leaves every other mask (a tensor, None) to `own_call`."""
    from torch.nn.attention.flex_attention import BlockMask

    def call(q, k, v, mask, dropout_p, is_causal):
        if isinstance(mask, BlockMask):
            if dropout_p > 0.0:
                raise ValueError(
                    "flex attention (packed batches) has no attention dropout: set attn_dropout 0"
                )
            return flex(q, k, v, mask)
        return own_call(q, k, v, mask=mask, dropout_p=dropout_p, is_causal=is_causal)

    return call


@functools.cache
def compiled_flex_attention():
    """flex_attention compiled once per process with torch.compile's defaults (dynamic shapes detected on
    recompile), behind `torch.compiler.disable` so that compiled layers call it without nesting compilation."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    compiled = torch.compile(flex_attention)

    @torch.compiler.disable(recursive=False)
    def flex(q, k, v, block_mask):
        return compiled(q, k, v, block_mask=block_mask)

    return flex
