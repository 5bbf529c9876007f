"""Real Qwen3 dense sizes through `kfp-finetune resolve-config`: Qwen2.5's recipe configs of the nearest size, the
model node with every dimension of the released config.json, the memory model's figures with head_dim 128 unequal
to hidden / heads, on one and eight GPUs, LoRA and full. No weights, no torch: config.json and placeholder files."""

import json

import pytest
import yaml

from kfp_finetune.cli import main
from kfp_finetune.components._shared.torchtune import flex_attention
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.memory_model import estimate_memory
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
from kfp_finetune.components._shared.torchtune.resolve import resolve_run

# The released config.json of each dense size (Qwen/Qwen3-*): what differs between them.
_SHARED = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "head_dim": 128,
    "num_key_value_heads": 8, "rope_theta": 1000000.0, "rope_scaling": None, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "attention_bias": False, "hidden_act": "silu", "use_sliding_window": False,
    "sliding_window": None, "torch_dtype": "bfloat16",
}  # fmt: skip
SIZES = {  # hidden_size, num_hidden_layers, num_attention_heads, intermediate_size, tie_word_embeddings
    "0.6B": (1024, 28, 16, 3072, True),
    "1.7B": (2048, 28, 16, 6144, True),
    "4B": (2560, 36, 32, 9728, True),
    "8B": (4096, 36, 32, 12288, False),
    "14B": (5120, 40, 40, 17408, False),
    "32B": (5120, 64, 64, 25600, False),
}
# size -> Qwen2.5 base config per (method, GPUs): the nearest size with a config for the recipe
BASE_CONFIGS = {
    ("8B", "lora", 1): "qwen2_5/7B_lora_single_device",
    ("8B", "lora", 8): "qwen2_5/7B_lora",
    ("8B", "full", 1): "qwen2_5/7B_full_single_device",
    ("8B", "full", 8): "qwen2_5/7B_full",
    ("32B", "lora", 1): "qwen2_5/14B_lora_single_device",
    ("32B", "lora", 8): "qwen2_5/32B_lora",
    ("32B", "full", 1): "qwen2_5/7B_full_single_device",  # Qwen2.5 has no full config above 7B
    ("32B", "full", 8): "qwen2_5/7B_full",
}


def qwen3_folder(root, size):
    hidden, layers, heads, intermediate, tied = SIZES[size]
    folder = root / f"Qwen3-{size}"
    folder.mkdir()
    config = {**_SHARED, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "intermediate_size": intermediate, "tie_word_embeddings": tied}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("model.safetensors", "vocab.json", "merges.txt", "tokenizer.json"):
        (folder / name).write_text("")
    return folder


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("size", ["8B", "32B"])
def test_resolve_config_resolves_real_qwen3_8b_and_32b(size, method, devices, data, tmp_path, capsys):
    code = main([
        "resolve-config", "--model-dir", str(qwen3_folder(tmp_path, size)), "--data", str(data), "--method", method,
        "--devices", str(devices), "--device", "cuda", "--gpu-memory-gib", "80", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"base config: {BASE_CONFIGS[size, method, devices]}\n" in out
    config = yaml.safe_load(out)
    hidden, layers, heads, intermediate, _ = SIZES[size]
    # A packed CUDA run's model node is flex_attention_model over the family's builder and its arguments.
    model = flex_attention.unwrap(config["model"])
    assert model["_component_"].endswith(
        ".families.qwen3.lora_qwen3" if method == "lora" else ".families.qwen3.qwen3"
    )
    assert {k: model[k] for k in ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim")} == {
        "embed_dim": hidden, "num_layers": layers, "num_heads": heads, "num_kv_heads": 8, "head_dim": 128,
    }  # fmt: skip
    assert (model["intermediate_dim"], model["vocab_size"], model["max_seq_len"]) == (
        intermediate,
        151936,
        40960,
    )
    assert (model["rope_base"], model["norm_eps"], model["tie_word_embeddings"]) == (1e6, 1e-6, False)
    if method == "lora":  # Qwen2.5's LoRA settings; the untied output layer stays as trained
        assert (model["lora_rank"], model["apply_lora_to_mlp"], model["apply_lora_to_output"]) == (
            8,
            True,
            False,
        )
    assert config["checkpointer"]["model_type"] == "QWEN3"
    assert config["tokenizer"]["_component_"].endswith("tokenizer_builders.qwen3_tokenizer")
    assert config["compile"] is True and config["dataset"]["packed"] is True
    memory = next(
        line for line in out.splitlines() if line.startswith("# default enable_activation_checkpointing")
    )
    assert "GiB per GPU" in memory
    # On one 80 GiB GPU a full fine-tune cannot fit (the step log says so); 32B's bf16 weights (61 GiB) with LoRA fit
    # only with activation checkpointing (the logits of torchtune's chunked cross-entropy: issue 27).
    assert ("OVER" in memory) == (devices == 1 and method == "full"), memory
    if (size, method, devices) == ("32B", "lora", 1):
        assert config["enable_activation_checkpointing"] is True, memory


def test_qwen3_32b_qlora_fits_one_gpu(data, tmp_path, capsys):
    """QLoRA's NF4 blocks fit every projection of head_dim 128 (numel a multiple of 64 x 256)."""
    code = main([
        "resolve-config", "--model-dir", str(qwen3_folder(tmp_path, "32B")), "--data", str(data), "--method", "qlora",
        "--device", "cuda", "--gpu-memory-gib", "80", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "base config: qwen2_5/14B_lora_single_device\n" in out
    assert yaml.safe_load(out)["model"]["quantize_base"] is True
    memory = next(
        line for line in out.splitlines() if line.startswith("# default enable_activation_checkpointing")
    )
    assert "params 17.5" in memory and "OVER" not in memory, memory


@pytest.mark.parametrize(
    ("size", "base_config"),
    [("0.6B", "0.5B"), ("1.7B", "1.5B"), ("4B", "3B"), ("8B", "7B"), ("14B", "14B"), ("32B", "14B")],
)
def test_every_size_takes_qwen2_5s_lora_config_of_the_nearest_size(size, base_config, data, tmp_path):
    run = resolve_run(TorchtuneConfig(method="lora"), qwen3_folder(tmp_path, size), data, tmp_path / "run")
    assert run.config_name == f"qwen2_5/{base_config}_lora_single_device"
    tied = SIZES[size][4]  # 0.6B-4B: the output layer is the embedding, so LoRA leaves it alone
    assert run.config["model"]["tie_word_embeddings"] is tied
    assert run.config["model"].get("apply_lora_to_output", False) is False


@pytest.mark.parametrize(
    ("size", "published"),
    [("0.6B", 0.6e9), ("1.7B", 1.7e9), ("4B", 4.0e9), ("8B", 8.2e9), ("14B", 14.8e9), ("32B", 32.8e9)],
)
def test_parameter_counts_match_the_published_sizes(size, published, tmp_path):
    """head_dim 128 counts, not hidden / heads: Qwen3-32B would count 30.5B, Qwen3-0.6B 0.44B."""
    model = inspect_model_dir(qwen3_folder(tmp_path, size))
    assert model.num_parameters == pytest.approx(published, rel=0.03)


def test_the_memory_model_counts_qwen3s_head_dim_and_its_q_k_norms(tmp_path):
    model = inspect_model_dir(qwen3_folder(tmp_path, "32B"))
    gib = 1024**3
    # Qwen3-32B: dim 5120, 64 layers, q 64x128=8192, kv 8x128=1024, intermediate 25600, vocab 151936, untied.
    params = 64 * (5120 * 128 * (2 * 64 + 2 * 8) + 3 * 5120 * 25600) + 151936 * 5120 * 2
    assert model.num_parameters == params
    per_token_layer = 4 * 5120 + 3 * 8192 + 2 * 1024 + 4 * 25600 + 2 * (8192 + 1024)  # the last: q/k norms
    run = estimate_memory(model, "full", None, "bf16", "torch.optim.AdamW", world=8, tokens=8192)
    assert run.parameters == pytest.approx(params * 2 / 8 / gib)
    assert run.activations == pytest.approx(8192 * (64 * per_token_layer * 2 + 151936 * 6) / gib)
