"""Mistral-Nemo on torchtune 0.6.1's modules (families/mistral_nemo.py, conversions "MISTRAL"): head_dim of its own
(below hidden / heads, as Nemo's 128 with 5120 / 32), transformers' MistralForCausalLM's logits both ways (parity.py
measures every direction for the real layouts: test_parity.py); here what parity does not travel: generation with a
KV cache, packed batches, QLoRA's NF4 base, and the trap the builder avoids. Tiny random models, fp32 on CPU."""

import json

import pytest
import torch
import transformers
from torchao.dtypes.nf4tensor import NF4Tensor
from torchtune.generation import generate
from torchtune.modules.attention_utils import create_block_causal_mask
from torchtune.modules.peft import DoRALinear, LoRALinear

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune.checkpointer import HFCheckpointer
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node, instantiate

TOLERANCE = 1e-5  # fp32; measured: 3e-7
VOCAB = 320


@pytest.fixture(scope="module")
def nemo(tmp_path_factory):
    """A random transformers Mistral with Nemo's kind of head_dim (12, not 64 / 4 = 16), non-trivial norms, saved
    with a tokenizer.json placeholder (the family's file); (folder, model)."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=12, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=1e6,
        sliding_window=None, tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
    folder = tmp_path_factory.mktemp("nemo") / "hf"
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("")
    return folder, model


def torchtune_nemo(folder, output_dir, lora=None):
    """The model a run builds: the family's builder with config.json's dims, loaded through the checkpointer."""
    config = json.loads((folder / "config.json").read_text())
    model = instantiate(builder_node(FAMILIES["mistral_nemo"], config, lora)).eval()
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    state_dict = HFCheckpointer(str(folder), files, "MISTRAL", str(output_dir)).load_checkpoint()["model"]
    loaded = model.load_state_dict(state_dict, strict=not lora)
    if lora:
        assert not loaded.unexpected_keys and all(
            ".lora_" in key or "magnitude" in key for key in loaded.missing_keys
        )
    return model


def tokens(batch=2, length=19, seed=1):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_logits_are_transformers_mistrals(nemo, tmp_path):
    folder, hf_model = nemo
    model = torchtune_nemo(folder, tmp_path)
    assert model.layers[0].attn.q_proj.weight.shape == (4 * 12, 64)
    with torch.no_grad():
        assert (model(tokens()) - hf_model(tokens()).logits).abs().max().item() <= TOLERANCE


def test_torchtune_0_6_1s_mistral_builder_computes_head_dim_from_hidden_size_and_cannot_load_nemo(
    nemo, tmp_path
):
    """The trap: torchtune's `mistral` builds 64 / 4 = 16-wide heads and a 64-wide output projection input."""
    folder, _ = nemo
    config = json.loads((folder / "config.json").read_text())
    node = {
        **builder_node(FAMILIES["mistral_nemo"], config),
        "_component_": "torchtune.models.mistral.mistral",
    }
    del node["head_dim"]
    model = instantiate(node)
    state_dict = HFCheckpointer(
        str(folder), ["model.safetensors"], "MISTRAL", str(tmp_path)
    ).load_checkpoint()
    with pytest.raises(RuntimeError, match="size mismatch for layers.0.attn.q_proj.weight"):
        model.load_state_dict(state_dict["model"])
    # And Mistral 7B's family refuses the layout rather than build it.
    with pytest.raises(ConfigError, match=r"head_dim = 12 .*= 16 and takes no head_dim"):
        builder_node(FAMILIES["mistral"], config)


def test_kv_cached_greedy_generation_matches_transformers(nemo, tmp_path):
    folder, hf_model = nemo
    model = torchtune_nemo(folder, tmp_path)
    prompt, new = tokens(batch=1, length=7), 12
    with torch.no_grad():
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=prompt.shape[1] + new)
        ours, _ = generate(model, prompt, max_generated_tokens=new, pad_id=0, top_k=1)
        theirs = hf_model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    assert ours.tolist() == theirs.tolist()


@pytest.mark.slow
def test_a_packed_sequence_computes_each_sample_as_alone(nemo, tmp_path):
    folder, _ = nemo
    model = torchtune_nemo(folder, tmp_path)
    first, second = tokens(batch=1, length=5, seed=2), tokens(batch=1, length=8, seed=3)
    positions = torch.cat([torch.arange(5), torch.arange(8)]).unsqueeze(0)
    mask = create_block_causal_mask(seq_lens=[torch.tensor([5, 8])])
    with torch.no_grad():
        packed = model(torch.cat([first, second], dim=1), mask=mask, input_pos=positions)
        alone = torch.cat([model(first), model(second)], dim=1)
    assert (packed - alone).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("use_dora", [False, True])
def test_qlora_quantizes_every_frozen_base_projection_as_torchtunes_lora_builders_do(use_dora, nemo):
    """NF4 for the adapted projections' base weights and the others alike (q, v, output adapted; k and the MLP
    frozen), never the output layer; a LoRA output layer where asked (Nemo's is untied). NF4 needs 256-wide layers."""
    folder, _ = nemo
    config = {**json.loads((folder / "config.json").read_text()), "hidden_size": 256, "head_dim": 32,
              "intermediate_size": 512}  # fmt: skip
    lora = {"lora_attn_modules": ["q_proj", "v_proj", "output_proj"], "apply_lora_to_mlp": False,
            "apply_lora_to_output": True, "lora_rank": 4, "lora_alpha": 8.0, "use_dora": use_dora,
            "quantize_base": True}  # fmt: skip
    model = instantiate(builder_node(FAMILIES["mistral_nemo"], config, lora))
    adapter = DoRALinear if use_dora else LoRALinear
    attention, mlp = model.layers[0].attn, model.layers[0].mlp
    for projection in (attention.q_proj, attention.v_proj, attention.output_proj):
        assert isinstance(projection, adapter) and isinstance(projection.weight, NF4Tensor)
    for frozen in (attention.k_proj, mlp.w1, mlp.w2, mlp.w3):
        assert isinstance(frozen.weight, NF4Tensor)
    assert isinstance(model.output, adapter) and not isinstance(model.output.weight, NF4Tensor)
    assert attention.q_proj.weight.shape == (4 * 32, 256) and attention.output_proj.weight.shape == (
        256,
        4 * 32,
    )
