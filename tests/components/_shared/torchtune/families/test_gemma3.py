"""Gemma 3 text on torchtune 0.6.1's modules (families/gemma3.py, conversions "GEMMA3"): the logits of transformers'
Gemma3ForCausalLM, both ways through the project's checkpointer, for the layouts the released sizes use, over
sequences longer than the local layers' window; the same with a KV cache, packed (a tensor mask on CPU, a
BlockMask on CUDA), checkpointed, compiled and sharded. Each part of Gemma 3's math, changed on purpose, fails
by far. Tiny random models with non-trivial norm weights; fp32 on CPU.
"""

import json

import pytest
import torch
import transformers
from torch.distributed.tensor import DTensor
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torchtune import modules, training
from torchtune.generation import generate
from torchtune.modules.attention_utils import create_block_causal_mask

from kfp_finetune.components._shared.torchtune import flex_attention as our_flex_attention
from kfp_finetune.components._shared.torchtune.checkpointer import HFCheckpointer
from kfp_finetune.components._shared.torchtune.families import gemma3
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node, instantiate

#: fp32 on CPU; measured: at most 3e-6 (SDPA against transformers' eager attention).
TOLERANCE = 1e-5
#: what each fault below measures at the least (0.1 to 4): far above fp32 noise
FAILS_BY_FAR = 1e-2
VOCAB = 320
WINDOW = 6  # the local layers' sliding_window: the sequences below are three to eight times longer
SLIDING, FULL = "sliding_attention", "full_attention"
# The released layouts (config.json as transformers 4.5x writes it): 1B and 270M multi-query with head_dim 256
# above hidden / heads and a query scale of head_dim; 27B grouped-query, head_dim 128 below hidden / heads, a query
# scale of hidden / heads (168) and linear RoPE scaling of the global layers (as 4B and 12B). Every model has five
# local layers, then one global; two of each kind here.
LAYOUTS = {
    "1B": {"num_key_value_heads": 1, "head_dim": 32, "query_pre_attn_scalar": 32, "rope_scaling": None},
    "27B": {"num_key_value_heads": 2, "head_dim": 8, "query_pre_attn_scalar": 16,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
}  # fmt: skip
LAYER_TYPES = [SLIDING, FULL, SLIDING, FULL]
LORA = {
    "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
    "apply_lora_to_mlp": True,
    "lora_rank": 4,
    "lora_alpha": 8.0,
}


def hf_gemma3(tmp_path, layout="1B", **changes):
    """A random transformers Gemma 3 (every norm weight drawn around 0: Gemma's norms scale by 1 + weight) saved as
    a model folder; (folder, model)."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1e6, rope_local_base_freq=1e4,
        sliding_window=WINDOW, layer_types=LAYER_TYPES, pad_token_id=0, **{**LAYOUTS[layout], **changes},
    )  # fmt: skip
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(0.5 * torch.randn_like(parameter))
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    return folder, model


def checkpointer(model_dir, output_dir):
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    return HFCheckpointer(str(model_dir), files, model_type="GEMMA3", output_dir=str(output_dir))


def torchtune_gemma3(model_dir, output_dir, lora=None):
    """The model a run builds from a model folder: the family's builder with config.json's fields, loaded through
    the project's checkpointer (strict for the full model; LoRA weights are what a LoRA model adds)."""
    config = json.loads((model_dir / "config.json").read_text())
    model = instantiate(builder_node(FAMILIES["gemma3"], config, lora)).eval()
    state_dict = checkpointer(model_dir, output_dir).load_checkpoint()["model"]
    loaded = model.load_state_dict(state_dict, strict=not lora)
    if lora:
        assert not loaded.unexpected_keys and all(".lora_" in key for key in loaded.missing_keys)
    return model


def tokens(batch=2, length=37, seed=1):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def max_difference(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.slow
def test_logits_equal_transformers_both_ways(layout, tmp_path):
    folder, hf_model = hf_gemma3(tmp_path, layout)
    model = torchtune_gemma3(folder, tmp_path / "run")
    x = tokens()
    with torch.no_grad():
        expected = hf_model(x).logits
        assert max_difference(model(x), expected) <= TOLERANCE

    # The other way: our checkpoint of the torchtune model, loaded by transformers.
    checkpointer(folder, tmp_path / "out").save_checkpoint({"model": model.state_dict()}, epoch=0)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "epoch_0").eval()
    assert isinstance(exported, transformers.Gemma3ForCausalLM)
    with torch.no_grad():
        assert max_difference(exported(x).logits, expected) <= TOLERANCE


# --- each part of the math, changed on purpose, fails by far -----------------------------------------------------


class _NormAfterRoPE(gemma3.Gemma3Attention):
    """torchtune 0.6.1's MultiHeadAttention order: RoPE, then the q/k norm."""

    def _normed_rotated_heads(self, projected, norm, input_pos):
        heads = self.pos_embeddings(projected.unflatten(-1, (-1, self.head_dim)), input_pos=input_pos)
        return norm(heads).transpose(1, 2)


def _norm_after_rope(model):
    for layer in model.layers:
        layer.attn.__class__ = _NormAfterRoPE


def _rope_bases_swapped(model):
    local, full = model.layers[0].attn.pos_embeddings, model.layers[1].attn.pos_embeddings
    for layer in model.layers:
        layer.attn.pos_embeddings = full if layer.attn.pos_embeddings is local else local


def _no_window(model):
    for layer in model.layers:
        layer.attn.window = None


def _every_layer_local(model):
    local = model.layers[0].attn
    for layer in model.layers:
        layer.attn.window, layer.attn.pos_embeddings = local.window, local.pos_embeddings


def _window_one_wider(model):
    model.layers[0].attn.window.size = WINDOW + 1


def _head_dim_query_scale(model):
    for layer in model.layers:
        layer.attn.query_scale = 1.0


def _unscaled_global_rope(model):
    rope = model.layers[1].attn.pos_embeddings
    rope.scale_factor = 1.0
    rope.rope_init()


def _embedding_unscaled(model):
    model.tok_embeddings.forward = lambda x: torch.nn.functional.embedding(x, model.tok_embeddings.weight)


@pytest.mark.parametrize(
    ("layout", "fault"),
    [
        ("1B", _norm_after_rope),
        ("1B", _rope_bases_swapped),
        ("1B", _no_window),
        ("1B", _every_layer_local),
        ("1B", _window_one_wider),  # the window's edge: a key `size` positions behind is out
        ("1B", _embedding_unscaled),
        ("27B", _head_dim_query_scale),
        ("27B", _unscaled_global_rope),
    ],
)
def test_each_part_of_gemma3s_math_changed_fails_by_far(layout, fault, tmp_path):
    folder, hf_model = hf_gemma3(tmp_path, layout)
    model = torchtune_gemma3(folder, tmp_path / "run")
    fault(model)
    x = tokens()
    with torch.no_grad():
        assert max_difference(model(x), hf_model(x).logits) > FAILS_BY_FAR


# --- the same model in every way a run computes it -------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kv_cached_greedy_generation_matches_transformers_past_the_window(layout, tmp_path):
    """Generation's mask covers the KV cache: the local layers' window is counted in cache positions."""
    folder, hf_model = hf_gemma3(tmp_path, layout)
    model = torchtune_gemma3(folder, tmp_path / "run")
    prompt = tokens(batch=1, length=9)
    new = 4 * WINDOW
    with torch.no_grad():
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=prompt.shape[1] + new)
        ours, _ = generate(model, prompt, max_generated_tokens=new, pad_id=0, top_k=1)
        # No end token for either (Gemma3TextConfig's <eos> 1 would make min_new_tokens suppress it).
        hf_model.generation_config.eos_token_id = None
        theirs = hf_model.generate(prompt, max_new_tokens=new, do_sample=False)
    assert ours.tolist() == theirs.tolist()


def _packed(first_length=13, second_length=19):
    """Two samples longer than the window packed into one sequence: (samples, packed, positions, seq_lens)."""
    samples = tokens(batch=1, length=first_length, seed=2), tokens(batch=1, length=second_length, seed=3)
    packed = torch.cat(samples, dim=1)
    positions = torch.cat([torch.arange(first_length), torch.arange(second_length)]).unsqueeze(0)
    return samples, packed, positions, [torch.tensor([first_length, second_length])]


def test_a_packed_sequence_computes_each_sample_as_alone(tmp_path):
    """Packing on CPU passes a block-causal tensor mask, which the local layers narrow to their window."""
    folder, _ = hf_gemma3(tmp_path)
    model = torchtune_gemma3(folder, tmp_path / "run")
    samples, packed, positions, seq_lens = _packed()
    with torch.no_grad():
        logits = model(packed, mask=create_block_causal_mask(seq_lens=seq_lens), input_pos=positions)
        alone = torch.cat([model(sample) for sample in samples], dim=1)
    assert max_difference(logits, alone) <= TOLERANCE


@pytest.mark.slow
def test_a_packed_blockmask_is_narrowed_to_the_window_once_per_batch(tmp_path):
    """On CUDA packed batches arrive as a BlockMask for flex attention: the local layers narrow it to their
    window (one BlockMask for all of them) and compute what the tensor mask computes. Flex attention eager here
    (compiled: test_flex_attention.py's path, slow on CPU)."""
    folder, _ = hf_gemma3(tmp_path)
    model = torchtune_gemma3(folder, tmp_path / "run")
    flex = our_flex_attention.attention_call  # what flex_attention_model installs, with flex attention eager
    for layer in model.layers:
        layer.attn._attention_call = flex(
            layer.attn._attention_call, lambda q, k, v, m: flex_attention(q, k, v, block_mask=m)
        )
    samples, packed, positions, seq_lens = _packed(61, 67)  # past flex attention's 128-token blocks
    document = torch.repeat_interleave(torch.arange(2), seq_lens[0])[None]

    def same_document_causal(b, h, q, kv):
        return (q >= kv) & (document[b, q] == document[b, kv])

    block_mask = create_block_mask(same_document_causal, 1, None, 128, 128, device="cpu")
    narrowed = []
    window = model.layers[0].attn.window
    original = window._narrow_block_mask
    window._narrow_block_mask = lambda mask: narrowed.append(original(mask)) or narrowed[-1]
    with torch.no_grad():
        logits = model(packed, mask=block_mask, input_pos=positions)
        dense = model(packed, mask=create_block_causal_mask(seq_lens=seq_lens), input_pos=positions)
    assert len(narrowed) == 2 and narrowed[0] is narrowed[1] is not block_mask  # two local layers, one mask
    assert max_difference(logits, dense) <= TOLERANCE


@pytest.mark.slow
def test_activation_checkpointing_fsdp2_and_per_layer_compile_keep_the_logits_and_gradients(tmp_path):
    """What the recipes wrap each layer in: torchtune's activation checkpointing and FSDP2 sharding (one-process
    gloo group), and torch.compile per layer (aot_eager: the graph dynamo captures, without a C++ compiler;
    fullgraph: Gemma3Attention's forward, its window included, traces without a break)."""
    folder, _ = hf_gemma3(tmp_path, "27B")
    x = tokens()

    def loss_and_gradients(model):
        model.train()
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        gradients = {}
        for name, parameter in model.named_parameters():
            grad = parameter.grad
            if grad is not None:  # the adapters': the base weights are frozen
                full = grad.full_tensor() if isinstance(grad, DTensor) else grad  # FSDP2's shard of one
                gradients[name.replace("._checkpoint_wrapped_module", "")] = full
        return loss.item(), gradients

    def lora_model(run):
        torch.manual_seed(0)  # the same LoRA A initialisation in each
        return torchtune_gemma3(folder, tmp_path / run, lora=LORA)

    reference = loss_and_gradients(lora_model("plain"))
    compiled = lora_model("compiled")
    for layer in compiled.layers:
        layer.compile(backend="aot_eager", fullgraph=True)
    sharded = lora_model("sharded")
    training.set_activation_checkpointing(sharded, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    store = f"file://{tmp_path / 'process-group'}"
    torch.distributed.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        training.shard_model(
            sharded, [lambda name, module: isinstance(module, modules.TransformerSelfAttentionLayer)],
            cpu_offload=False, reshard_after_forward=True,
        )  # fmt: skip
        for model in (compiled, sharded):
            loss, gradients = loss_and_gradients(model)
            assert loss == pytest.approx(reference[0], abs=TOLERANCE)
            assert gradients.keys() == reference[1].keys()
            assert max(max_difference(g, reference[1][n]) for n, g in gradients.items()) <= TOLERANCE
    finally:
        torch.distributed.destroy_process_group()


def test_rope_init_again_after_meta_materialization_keeps_the_scaling(tmp_path):
    """The distributed recipes build on the meta device, then call every module's rope_init: the global layers'
    positions stay divided by the factor once."""
    folder, _ = hf_gemma3(tmp_path, "27B")
    model = torchtune_gemma3(folder, tmp_path / "run")
    x = tokens()
    with torch.no_grad():
        before = model(x)
        for module in model.modules():
            if hasattr(module, "rope_init"):
                module.rope_init()
        assert max_difference(model(x), before) == 0.0


def test_the_lora_builder_takes_no_output_adapter_and_refuses_empty_modules():
    config = {**json.loads(json.dumps(LAYOUTS["1B"])), "model_type": "gemma3_text", "hidden_size": 64,
              "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": VOCAB,
              "max_position_embeddings": 128, "layer_types": LAYER_TYPES, "sliding_window": WINDOW}  # fmt: skip
    node = builder_node(FAMILIES["gemma3"], config, {**LORA, "apply_lora_to_output": True})
    assert "apply_lora_to_output" not in node  # the output layer is the embedding
    with pytest.raises(ValueError, match="lora_attn_modules is empty"):
        instantiate({**node, "lora_attn_modules": []})


@pytest.mark.slow  # compiling flex attention for CPU takes most of a minute on two cores
def test_a_packed_cuda_run_s_model_computes_packs_through_compiled_flex_attention(tmp_path):
    """What a packed CUDA run builds (flex_attention.flex_attention_model over the gemma3 builder), compiled per
    layer as with `compile: True`: the narrowed BlockMask is built outside the compiled graphs, the packed logits
    are each sample's alone."""
    folder, _ = hf_gemma3(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    node = our_flex_attention.wrap(builder_node(FAMILIES["gemma3"], config))
    model = instantiate(node).eval()
    model.load_state_dict(checkpointer(folder, tmp_path / "run").load_checkpoint()["model"])
    samples, packed, positions, seq_lens = _packed(61, 67)
    document = torch.repeat_interleave(torch.arange(2), seq_lens[0])[None]

    def same_document_causal(b, h, q, kv):
        return (q >= kv) & (document[b, q] == document[b, kv])

    block_mask = create_block_mask(same_document_causal, 1, None, 128, 128, device="cpu")
    with torch.no_grad():
        alone = torch.cat([model(sample) for sample in samples], dim=1)
        training.compile_model(model, verbose=False)
        assert max_difference(model(packed, mask=block_mask, input_pos=positions), alone) <= TOLERANCE


@pytest.mark.parametrize("hidden_size", [640, 1152, 5376])  # 270M, 1B, 27B
def test_the_embedding_scale_rounds_to_the_weights_dtype_as_transformers_does(hidden_size):
    """sqrt(hidden_size) in bf16 (1B: 33.94 -> 34.0) on both sides: what a bf16 run computes, not a reference in
    fp32."""
    from torchtune.models.gemma.gemma_norm_embedding import GemmaNormEmbeddings
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    ours = GemmaNormEmbeddings(16, hidden_size).to(torch.bfloat16)
    theirs = Gemma3TextScaledWordEmbedding(16, hidden_size, 0, embed_scale=hidden_size**0.5).to(
        torch.bfloat16
    )
    theirs.load_state_dict(ours.state_dict())
    ids = torch.arange(16)[None]
    assert torch.equal(ours(ids), theirs(ids))
    assert not torch.equal(ours(ids), (ours.weight[ids].float() * hidden_size**0.5).to(torch.bfloat16))
