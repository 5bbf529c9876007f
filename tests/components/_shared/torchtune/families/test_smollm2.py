"""SmolLM2 on torchtune 0.6.1's llama3_2 builders: Llama layers with tied embeddings and plain RoPE, which the
builder computes with its RoPE scale factor at 1 (model_layout carries config.json's: 1 without llama3
scaling). transformers' LlamaForCausalLM's logits and greedy generation; parity.py measures every direction for
the real 135M / 360M / 1.7B layouts (test_parity.py). Tiny random models, fp32 on CPU."""

import json

import pytest
import torch
import transformers
from torchtune.generation import generate
from torchtune.modules import RotaryPositionalEmbeddings

from kfp_finetune.components._shared.torchtune.checkpointer import HFCheckpointer
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node, instantiate

TOLERANCE = 1e-5  # fp32; measured: 7e-7
VOCAB = 320


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """A random transformers Llama with SmolLM2's flags (tied, RoPE base 100000, no scaling), non-trivial norms and
    large q/k weights, a tokenizer.json placeholder and no Meta tokenizer file; (folder, model)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=100000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1 + 0.5 * torch.randn_like(parameter))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):  # sharp attention: positions matter
                parameter.mul_(20)
    folder = tmp_path_factory.mktemp("smollm2") / "hf"
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("")
    return folder, model


def torchtune_smollm2(folder, output_dir, **node_changes):
    config = json.loads((folder / "config.json").read_text())
    node = {**builder_node(FAMILIES["smollm2"], config), **node_changes}
    model = instantiate(node).eval()
    state_dict = HFCheckpointer(
        str(folder), ["model.safetensors"], "LLAMA3_2", str(output_dir)
    ).load_checkpoint()
    model.load_state_dict(state_dict["model"], strict=True)
    return model


def tokens(length=64, seed=1):
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(seed))


def test_the_llama3_2_builder_with_scale_factor_1_computes_plain_rope():
    """Llama3ScaledRoPE at factor 1 divides no frequency: its tables are RotaryPositionalEmbeddings' to fp32
    rounding (the smoothed band computes (1 - s) * f + s * f)."""
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    scaled = Llama3ScaledRoPE(dim=64, max_seq_len=8192, base=130000.0, scale_factor=1.0)
    plain = RotaryPositionalEmbeddings(dim=64, max_seq_len=8192, base=130000.0)
    assert (scaled.cache - plain.cache).abs().max().item() <= 1e-5


@pytest.mark.slow
def test_the_logits_and_greedy_generation_are_transformers_llamas(smollm2, tmp_path):
    folder, hf_model = smollm2
    model = torchtune_smollm2(folder, tmp_path)
    assert (
        builder_node(FAMILIES["smollm2"], json.loads((folder / "config.json").read_text()))["scale_factor"]
        == 1.0
    )
    with torch.no_grad():
        assert (model(tokens()) - hf_model(tokens()).logits).abs().max().item() <= TOLERANCE
        prompt, new = tokens(length=7)[:1], 12
        model.setup_caches(batch_size=1, dtype=torch.float32, decoder_max_seq_len=prompt.shape[1] + new)
        ours, _ = generate(model, prompt, max_generated_tokens=new, pad_id=0, top_k=1)
        theirs = hf_model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    assert ours.tolist() == theirs.tolist()


def test_the_builders_own_scale_factor_would_compute_another_model(smollm2, tmp_path):
    """The trap: torchtune's llama3_2 builders default to Llama 3.2's factor 32, which slows the rotations of
    wavelengths over 8192 positions 32-fold: far apart tokens attend otherwise."""
    folder, hf_model = smollm2
    model = torchtune_smollm2(folder, tmp_path, scale_factor=32)
    with torch.no_grad():
        assert (model(tokens(512)) - hf_model(tokens(512)).logits).abs().max().item() > 0.1  # measured: 0.68
