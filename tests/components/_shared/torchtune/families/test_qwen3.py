"""Qwen3 dense on torchtune 0.6.1's modules (families/qwen3.py, conversions "QWEN3"): the logits of transformers'
Qwen3ForCausalLM, both ways through the project's checkpointer, for every layout flag the released sizes use; the
same with a KV cache, packed, LoRA'd (the PEFT adapter onto transformers' model), checkpointed, compiled and
sharded. Tiny random models with non-trivial norm weights; fp32 on CPU.
"""

import json

import peft
import pytest
import torch
import transformers
from torch.distributed.tensor import DTensor
from torchtune import modules, training
from torchtune.generation import generate
from torchtune.modules.attention_utils import create_block_causal_mask
from torchtune.modules.peft import get_adapter_state_dict, get_lora_module_names

from kfp_finetune.components._shared.torchtune.checkpointer import HFCheckpointer
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node, instantiate

#: fp32 on CPU; measured: 0.0 (the same operations in the same order as transformers').
TOLERANCE = 1e-5
VOCAB = 320
# The flags the released sizes differ in: tied embeddings (0.6B, 1.7B, 4B) or not (8B+); head_dim 128 unequal to
# hidden / heads (0.6B: 1024 / 16, 4B: 2560 / 32, 32B: 5120 / 64) or equal (1.7B, 8B, 14B). All use GQA.
LAYOUTS = {
    "tied, head_dim != hidden / heads (0.6B, 4B)": {"tie_word_embeddings": True, "head_dim": 32},
    "untied, head_dim != hidden / heads (32B)": {"tie_word_embeddings": False, "head_dim": 32},
    "tied, head_dim == hidden / heads (1.7B)": {"tie_word_embeddings": True, "head_dim": 16},
    "untied, head_dim == hidden / heads (8B, 14B)": {"tie_word_embeddings": False, "head_dim": 16},
}
LORA = {
    "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
    "apply_lora_to_mlp": True,
    "lora_rank": 4,
    "lora_alpha": 8.0,
}


def hf_qwen3(tmp_path, **layout):
    """A random transformers Qwen3 (every norm weight drawn around 1) saved as a model folder; (folder, model)."""
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1e6, **layout,
    )  # fmt: skip
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
    folder = tmp_path / "hf"
    model.save_pretrained(folder)
    return folder, model


def checkpointer(model_dir, output_dir):
    files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    return HFCheckpointer(str(model_dir), files, model_type="QWEN3", output_dir=str(output_dir))


def torchtune_qwen3(model_dir, output_dir, lora=None):
    """The model a run builds from a model folder: the family's builder with config.json's dims, loaded through
    the project's checkpointer (strict for the full model; LoRA weights are what a LoRA model adds)."""
    config = json.loads((model_dir / "config.json").read_text())
    model = instantiate(builder_node(FAMILIES["qwen3"], config, lora)).eval()
    state_dict = checkpointer(model_dir, output_dir).load_checkpoint()["model"]
    loaded = model.load_state_dict(state_dict, strict=not lora)
    if lora:
        assert not loaded.unexpected_keys and all(".lora_" in key for key in loaded.missing_keys)
    return model


def tokens(batch=2, length=19, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def max_difference(a, b):
    return (a - b).abs().max().item()


@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_logits_equal_transformers_both_ways(layout, tmp_path):
    folder, hf_model = hf_qwen3(tmp_path, **layout)
    model = torchtune_qwen3(folder, tmp_path / "run")
    x = tokens()
    with torch.no_grad():
        expected = hf_model(x).logits
        assert max_difference(model(x), expected) <= TOLERANCE

    # The other way: our checkpoint of the torchtune model, loaded by transformers.
    checkpointer(folder, tmp_path / "out").save_checkpoint({"model": model.state_dict()}, epoch=0)
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "epoch_0").eval()
    with torch.no_grad():
        assert max_difference(exported(x).logits, expected) <= TOLERANCE


def test_torchtune_0_6_1s_attention_would_norm_q_and_k_after_rope(tmp_path):
    """The trap the builder avoids: 0.6.1's MultiHeadAttention.forward with the same modules and weights."""
    folder, hf_model = hf_qwen3(tmp_path, **LAYOUTS["tied, head_dim != hidden / heads (0.6B, 4B)"])
    model = torchtune_qwen3(folder, tmp_path / "run")
    for layer in model.layers:
        layer.attn.__class__ = modules.MultiHeadAttention
    x = tokens()
    with torch.no_grad():
        assert max_difference(model(x), hf_model(x).logits) > 1e-2


@pytest.mark.slow
def test_kv_cached_greedy_generation_matches_transformers(tmp_path):
    folder, hf_model = hf_qwen3(tmp_path, **LAYOUTS["untied, head_dim != hidden / heads (32B)"])
    model = torchtune_qwen3(folder, tmp_path / "run")
    prompt = tokens(batch=1, length=7)
    new = 12
    with torch.no_grad():
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=prompt.shape[1] + new)
        ours, _ = generate(model, prompt, max_generated_tokens=new, pad_id=0, top_k=1)
        theirs = hf_model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    assert ours.tolist() == theirs.tolist()


def test_a_packed_sequence_computes_each_sample_as_alone(tmp_path):
    """Packing passes a block-causal mask (and positions restarting per sample, which RoPE's relative angles make
    equivalent to running on): each sample computes as if alone. The KV-cache test is the one that needs
    input_pos to reach RoPE."""
    folder, _ = hf_qwen3(tmp_path, **LAYOUTS["tied, head_dim != hidden / heads (0.6B, 4B)"])
    model = torchtune_qwen3(folder, tmp_path / "run")
    first, second = tokens(batch=1, length=5, seed=2), tokens(batch=1, length=8, seed=3)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(5), torch.arange(8)]).unsqueeze(0)
    mask = create_block_causal_mask(seq_lens=[torch.tensor([5, 8])])
    with torch.no_grad():
        logits = model(packed, mask=mask, input_pos=positions)
        alone = torch.cat([model(first), model(second)], dim=1)
    assert max_difference(logits, alone) <= TOLERANCE


@pytest.mark.parametrize(
    "layout", ["tied, head_dim != hidden / heads (0.6B, 4B)", "untied, head_dim != hidden / heads (32B)"]
)
def test_the_peft_adapter_loads_onto_transformers_qwen3_with_the_lora_models_logits(layout, tmp_path):
    folder, hf_model = hf_qwen3(tmp_path, **LAYOUTS[layout])
    untied = not LAYOUTS[layout]["tie_word_embeddings"]
    lora = {**LORA, "apply_lora_to_output": untied}  # the output layer too, where there is one
    model = torchtune_qwen3(folder, tmp_path / "run", lora=lora)
    with torch.no_grad():  # a trained adapter: B is zero only at the start
        for name, parameter in model.named_parameters():
            if ".lora_" in name:
                parameter.copy_(0.1 * torch.randn_like(parameter))
    adapter_config = {
        "r": lora["lora_rank"],
        "lora_alpha": lora["lora_alpha"],
        "target_modules": get_lora_module_names(LORA["lora_attn_modules"], True, untied),
        "peft_type": "LORA",
    }
    state = {"adapter": get_adapter_state_dict(model.state_dict()), "adapter_config": adapter_config}
    checkpointer(folder, tmp_path / "out").save_checkpoint(state, epoch=0, adapter_only=True)
    tuned = peft.PeftModel.from_pretrained(hf_model, tmp_path / "out" / "epoch_0").eval()
    x = tokens()
    with torch.no_grad():
        assert max_difference(tuned(x).logits, model(x)) <= TOLERANCE


@pytest.mark.slow
def test_activation_checkpointing_fsdp2_and_per_layer_compile_keep_the_logits_and_gradients(tmp_path):
    """What the recipes wrap each layer in: torchtune's activation checkpointing and FSDP2 sharding (one-process
    gloo group), and torch.compile per layer (aot_eager: the graph dynamo captures, without a C++ compiler;
    fullgraph: Qwen3Attention's forward traces without a break)."""
    folder, _ = hf_qwen3(tmp_path, **LAYOUTS["untied, head_dim != hidden / heads (32B)"])
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
        return torchtune_qwen3(folder, tmp_path / run, lora={**LORA, "apply_lora_to_output": True})

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
