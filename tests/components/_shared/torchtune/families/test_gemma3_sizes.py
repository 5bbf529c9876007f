"""Real Gemma 3 text sizes through `kfp-finetune resolve-config`: Gemma 2's recipe configs of the nearest size, the
model node with every field of the released config.json, the memory model's figures (q/k norms, post norms, the
tied 262k embedding counted once), on one and eight GPUs, LoRA and full. No weights, no torch: config.json and
placeholder files."""

import json

import pytest
import yaml

from kfp_finetune.cli import main
from kfp_finetune.components._shared.torchtune import flex_attention
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.memory_model import estimate_memory
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
from kfp_finetune.components._shared.torchtune.resolve import resolve_run

# The released config.json of each text-only size (transformers 4.50 form): what they share, then what differs.
_SHARED = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 256,
    "query_pre_attn_scalar": 256, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6, "rms_norm_eps": 1e-06, "attention_bias": False,
    "hidden_activation": "gelu_pytorch_tanh", "attn_logit_softcapping": None, "final_logit_softcapping": None,
    "vocab_size": 262144, "max_position_embeddings": 32768, "sliding_window": 512, "rope_scaling": None,
    "num_key_value_heads": 1, "torch_dtype": "bfloat16",
}  # fmt: skip
SIZES = {
    "270M": {"hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18, "num_attention_heads": 4},
    "1B": {"hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4},
    # google/medgemma-27b-text-it: Gemma 3 27B's language model on its own
    "27B": {"hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32,
            "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168, "vocab_size": 262208,
            "max_position_embeddings": 131072, "sliding_window": 1024,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
}  # fmt: skip
# size -> base config per (method, GPUs): Gemma 2's of the nearest size; it has no single-device full config
BASE_CONFIGS = {
    ("1B", "lora", 1): "gemma2/2B_lora_single_device",
    ("1B", "lora", 8): "gemma2/2B_lora",
    ("1B", "full", 1): "llama3_2/1B_full_single_device",
    ("1B", "full", 8): "gemma2/2B_full",
    ("27B", "lora", 1): "gemma2/27B_lora_single_device",
    ("27B", "lora", 8): "gemma2/27B_lora",
    ("27B", "full", 1): "phi4/14B_full_low_memory",
    ("27B", "full", 8): "gemma2/27B_full",
}


def gemma3_folder(root, size):
    folder = root / f"gemma-3-{size}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**_SHARED, **SIZES[size]}))
    for name in ("model.safetensors", "tokenizer.model", "tokenizer.json"):
        (folder / name).write_text("")
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Rows of ~1500 characters (~500 tokens estimated), as a real instruction set."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    rows = [{"input": "word " * (100 + i % 150), "output": "answer " * 120} for i in range(500)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("devices", [1, 8])
@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("size", ["1B", "27B"])
def test_resolve_config_resolves_real_gemma3_1b_and_27b(size, method, devices, data, tmp_path, capsys):
    code = main([
        "resolve-config", "--model-dir", str(gemma3_folder(tmp_path, size)), "--data", str(data), "--method", method,
        "--devices", str(devices), "--device", "cuda", "--gpu-memory-gib", "80", "--run-dir", str(tmp_path / "run"),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert f"base config: {BASE_CONFIGS[size, method, devices]}\n" in out
    config = yaml.safe_load(out)
    released = {**_SHARED, **SIZES[size]}
    # Packed on CUDA: flex_attention_model over the family's builder, whose attention takes the BlockMask.
    assert config["dataset"]["packed"] is True and config["compile"] is True
    model = flex_attention.unwrap(config["model"])
    assert model["_component_"].endswith(
        ".families.gemma3.lora_gemma3" if method == "lora" else ".families.gemma3.gemma3"
    )
    assert {k: model[k] for k in ("embed_dim", "num_layers", "num_heads", "num_kv_heads", "head_dim")} == {
        "embed_dim": released["hidden_size"], "num_layers": released["num_hidden_layers"],
        "num_heads": released["num_attention_heads"], "num_kv_heads": released["num_key_value_heads"],
        "head_dim": released["head_dim"],
    }  # fmt: skip
    assert (model["intermediate_dim"], model["vocab_size"], model["max_seq_len"]) == (
        released["intermediate_size"],
        released["vocab_size"],
        released["max_position_embeddings"],
    )
    assert (model["rope_base"], model["local_rope_base"], model["norm_eps"]) == (1e6, 1e4, 1e-6)
    assert model["scale_factor"] == (8.0 if size == "27B" else 1.0)
    assert model["sliding_window_size"] == released["sliding_window"]
    assert model["query_pre_attn_scalar"] == released["query_pre_attn_scalar"]
    layers = model["layer_types"]
    assert len(layers) == released["num_hidden_layers"]
    assert [i for i, kind in enumerate(layers) if kind == "full_attention"] == list(range(5, len(layers), 6))
    if method == "lora":  # Gemma 2's LoRA settings; the output layer is the embedding: no adapter
        rank = 8 if (size, devices) == ("27B", 1) else 64
        assert (model["lora_rank"], model["apply_lora_to_mlp"]) == (rank, True)
        assert "apply_lora_to_output" not in model
    assert config["checkpointer"]["model_type"] == "GEMMA3"
    assert config["tokenizer"]["_component_"].endswith("tokenizer_builders.gemma3_tokenizer")
    memory = next(
        line for line in out.splitlines() if line.startswith("# default enable_activation_checkpointing")
    )
    # A full fine-tune of 27B cannot fit one 80 GiB GPU (bf16 weights, gradients and AdamW: 300 GiB).
    assert ("OVER" in memory) == (devices == 1 and method == "full" and size == "27B"), memory


@pytest.mark.parametrize(("size", "base_config"), [("270M", "2B"), ("1B", "2B"), ("27B", "27B")])
def test_every_size_takes_gemma2s_lora_config_of_the_nearest_size(size, base_config, data, tmp_path):
    run = resolve_run(TorchtuneConfig(method="lora"), gemma3_folder(tmp_path, size), data, tmp_path / "run")
    assert run.config_name == f"gemma2/{base_config}_lora_single_device"


@pytest.mark.parametrize(("size", "published"), [("270M", 268e6), ("1B", 1.0e9), ("27B", 27.0e9)])
def test_parameter_counts_match_the_published_sizes(size, published, tmp_path):
    """The embedding (a quarter of 1B, 60 % of 270M) counted once: config.json omits tie_word_embeddings, which
    Gemma 3 ties."""
    model = inspect_model_dir(gemma3_folder(tmp_path, size))
    assert model.hf_config["tie_word_embeddings"] is True
    assert model.num_parameters == pytest.approx(published, rel=0.03)


def test_the_memory_model_counts_gemma3s_head_dim_q_k_norms_and_post_norms(tmp_path):
    model = inspect_model_dir(gemma3_folder(tmp_path, "1B"))
    gib = 1024**3
    # Gemma-3-1B: dim 1152, 26 layers, q 4x256=1024, kv 1x256=256, intermediate 6912, vocab 262144, tied.
    params = 26 * (1152 * 256 * (2 * 4 + 2 * 1) + 3 * 1152 * 6912) + 262144 * 1152
    assert model.num_parameters == params
    per_token_layer = (
        4 * 1152 + 3 * 1024 + 2 * 256 + 4 * 6912
        + 2 * (1024 + 256)  # q/k norms
        + 2 * 1152  # the post-attention and post-MLP norms
    )  # fmt: skip
    run = estimate_memory(model, "full", None, "bf16", "torch.optim.AdamW", world=8, tokens=8192)
    assert run.parameters == pytest.approx(params * 2 / 8 / gib)
    assert run.activations == pytest.approx(8192 * (26 * per_token_layer * 2 + 262144 * 6) / gib)
