"""Real SmolLM2 and Mistral-Nemo sizes through `kfp-finetune resolve-config`: the base configs of the nearest size
(Qwen2.5's for SmolLM2, Mistral 7B's for Mistral-Nemo), the model node with every dimension of the released
config.json, the tokenizer.json tokenizer, the memory model's figures with Nemo's head_dim (128, not 5120 / 32), on
one and eight GPUs. No weights, no torch: config.json and placeholder files."""

import json

import pytest
import yaml

from kfp_finetune.cli import main
from kfp_finetune.components._shared.torchtune import flex_attention
from kfp_finetune.components._shared.torchtune.memory_model import estimate_memory
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
from kfp_finetune.components._shared.torchtune.parity_cases import FAMILY_CASES

# name -> released config.json's math fields (the parity cases'), and what every repo adds
MODELS = {
    "SmolLM2-135M": FAMILY_CASES["smollm2"].cases()[0].config,
    "SmolLM2-360M": FAMILY_CASES["smollm2"].cases()[1].config,
    "SmolLM2-1.7B": FAMILY_CASES["smollm2"].cases()[2].config,
    "Mistral-Nemo-Instruct-2407": FAMILY_CASES["mistral_nemo"].cases()[1].config,
}
_REPO = {"torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2}
# (model, method, GPUs) -> base config
BASE_CONFIGS = {
    ("SmolLM2-135M", "lora", 1): "qwen2_5/0.5B_lora_single_device",
    ("SmolLM2-360M", "full", 1): "qwen2_5/0.5B_full_single_device",
    ("SmolLM2-1.7B", "lora", 8): "qwen2_5/1.5B_lora",
    ("SmolLM2-1.7B", "full", 1): "qwen2_5/1.5B_full_single_device",
    ("Mistral-Nemo-Instruct-2407", "lora", 1): "mistral/7B_lora_single_device",
    ("Mistral-Nemo-Instruct-2407", "lora", 8): "mistral/7B_lora",
    ("Mistral-Nemo-Instruct-2407", "full", 1): "mistral/7B_full_low_memory",
    ("Mistral-Nemo-Instruct-2407", "full", 8): "mistral/7B_full",
    ("Mistral-Nemo-Instruct-2407", "qlora", 1): "mistral/7B_qlora_single_device",
}
_OURS = "kfp_finetune.components._shared.torchtune"


def model_folder(root, name):
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**MODELS[name], **_REPO}))
    for placeholder in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / placeholder).write_text("")
    return folder


@pytest.mark.parametrize(
    ("name", "method", "devices"), BASE_CONFIGS, ids=["-".join(map(str, k)) for k in BASE_CONFIGS]
)
def test_resolve_config_resolves_the_released_layouts(name, method, devices, data, tmp_path, capsys):
    code = main([
        "resolve-config", "--model-dir", str(model_folder(tmp_path, name)), "--data", str(data), "--method", method,
        "--devices", str(devices), "--device", "cuda", "--gpu-memory-gib", "80", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"base config: {BASE_CONFIGS[name, method, devices]}\n" in out
    config, real = yaml.safe_load(out), MODELS[name]
    # A packed CUDA run's model node is flex_attention_model over the family's builder and its arguments.
    model = flex_attention.unwrap(config["model"])
    builder = model["_component_"]
    assert (model["embed_dim"], model["num_layers"], model["num_heads"], model["num_kv_heads"]) == (
        real["hidden_size"], real["num_hidden_layers"], real["num_attention_heads"], real["num_key_value_heads"],
    )  # fmt: skip
    assert (model["intermediate_dim"], model["vocab_size"], model["rope_base"]) == (
        real["intermediate_size"], real["vocab_size"], real["rope_theta"],
    )  # fmt: skip
    tokenizer = config["tokenizer"]
    assert tokenizer["path"].endswith("/tokenizer.json") and set(tokenizer) == {
        "_component_",
        "path",
        "max_seq_len",
    }
    if name.startswith("SmolLM2"):
        assert builder.startswith("torchtune.models.llama3_2.")
        assert (model["scale_factor"], model["tie_word_embeddings"]) == (1.0, True)  # plain RoPE, tied
        assert model.get("apply_lora_to_output", False) is False
        assert tokenizer["_component_"] == f"{_OURS}.hf_tokenizer.smollm2_tokenizer"
        assert config["checkpointer"]["model_type"] == "LLAMA3_2"
    else:
        assert builder.startswith(f"{_OURS}.families.mistral_nemo.")
        assert (model["head_dim"], model["max_seq_len"]) == (128, 1024000)
        assert model.get("quantize_base", False) is (method == "qlora")
        assert tokenizer["_component_"] == f"{_OURS}.hf_tokenizer.mistral_nemo_tokenizer"
        assert config["checkpointer"]["model_type"] == "MISTRAL"
    memory = next(
        line for line in out.splitlines() if line.startswith("# default enable_activation_checkpointing")
    )
    # Only Nemo's full fine-tune on one 80 GiB GPU cannot fit (12B: bf16 weights, gradients, AdamW states).
    assert ("OVER" in memory) == (name.startswith("Mistral") and method == "full" and devices == 1), memory


@pytest.mark.parametrize(
    ("name", "published"),
    [("SmolLM2-135M", 0.135e9), ("SmolLM2-360M", 0.362e9), ("SmolLM2-1.7B", 1.71e9),
     ("Mistral-Nemo-Instruct-2407", 12.2e9)],
)  # fmt: skip
def test_parameter_counts_match_the_published_sizes(name, published, tmp_path):
    """SmolLM2 ties its output layer (counted once); Nemo's head_dim 128 counts, not 5120 / 32 (13.3B)."""
    assert inspect_model_dir(model_folder(tmp_path, name)).num_parameters == pytest.approx(
        published, rel=0.03
    )


def test_the_memory_model_counts_nemos_head_dim(tmp_path):
    model = inspect_model_dir(model_folder(tmp_path, "Mistral-Nemo-Instruct-2407"))
    gib = 1024**3
    # Mistral-Nemo: dim 5120, 40 layers, q 32x128=4096, kv 8x128=1024, intermediate 14336, vocab 131072, untied.
    params = 40 * (5120 * 128 * (2 * 32 + 2 * 8) + 3 * 5120 * 14336) + 131072 * 5120 * 2
    assert model.num_parameters == params
    per_token_layer = 4 * 5120 + 3 * 4096 + 2 * 1024 + 4 * 14336
    run = estimate_memory(model, "full", None, "bf16", "torch.optim.AdamW", world=8, tokens=8192)
    assert run.parameters == pytest.approx(params * 2 / 8 / gib)
    assert run.activations == pytest.approx(8192 * (40 * per_token_layer * 2 + 131072 * 6) / gib)
