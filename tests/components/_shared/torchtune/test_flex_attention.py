"""The model builder a packed CUDA run names (flex_attention.py): its attention layers compute packed batches given
as a BlockMask with our compiled flex attention, the same as torchtune's dense block-causal mask, and leave every
other mask to torchtune. Here on CPU (flex attention compiles for CPU too); benchmarks/gpu_checks/
flex_compile_nan.py compares the compile settings on a GPU."""

from __future__ import annotations

import pytest

pytest.importorskip("torchtune")

import torch  # noqa: E402

from kfp_finetune.components._shared.torchtune import builder_nodes, flex_attention  # noqa: E402
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir  # noqa: E402

pytestmark = pytest.mark.slow  # compiling for CPU takes most of a minute on two cores


def test_packed_batches_attend_through_our_flex_attention_as_through_torchtunes_mask(tiny_llama):
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtune import training
    from torchtune.modules.attention_utils import create_block_causal_mask

    node = inspect_model_dir(tiny_llama).model_node()
    theirs = builder_nodes.builder(node["_component_"])(
        **{k: v for k, v in node.items() if k != "_component_"}
    )
    ours = flex_attention.flex_attention_model(
        **{k: v for k, v in flex_attention.wrap(node).items() if k != "_component_"}
    )
    ours.load_state_dict(theirs.state_dict())
    layers = [m for m in ours.modules() if hasattr(m, "_attention_call")]
    assert layers and all(m._attention_call.__qualname__ == "attention_call.<locals>.call" for m in layers)

    seq_lens = [torch.tensor([5, 7, 4]), torch.tensor([10, 6])]  # two packs of 16 tokens
    document = torch.stack([torch.repeat_interleave(torch.arange(len(s)), s) for s in seq_lens])
    input_pos = torch.stack([torch.cat([torch.arange(int(n)) for n in s]) for s in seq_lens])
    tokens = torch.randint(0, 400, (2, 16), generator=torch.Generator().manual_seed(0))

    def same_document_causal(b, h, q, kv):
        return (q >= kv) & (document[b, q] == document[b, kv])

    block_mask = create_block_mask(same_document_causal, 2, None, 16, 16, device="cpu")
    dense = create_block_causal_mask(seq_lens)
    with torch.no_grad():
        expected = theirs(tokens, mask=dense, input_pos=input_pos)
        torch.testing.assert_close(ours(tokens, mask=block_mask, input_pos=input_pos), expected)
        torch.testing.assert_close(ours(tokens, mask=dense, input_pos=input_pos), expected)  # torchtune's own
        torch.testing.assert_close(ours(tokens), theirs(tokens))
        training.compile_model(ours, verbose=False)  # compile: True, whose layers call flex attention
        torch.testing.assert_close(ours(tokens, mask=block_mask, input_pos=input_pos), expected)
