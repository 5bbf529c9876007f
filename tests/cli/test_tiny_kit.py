"""The tiny offline model kit and synthetic dataset: what every other test and the demo build on."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_finetune import cli
from kfp_finetune.tiny.dataset import build_tiny_dataset
from kfp_finetune.tiny.model import build_tiny_model, build_torchtune_model, checkpointer_model_type

torch = pytest.importorskip("torch")

FAMILIES = ["llama3_2", "qwen2_5", "qwen3", "gemma3", "smollm2", "mistral_nemo"]
# The tokenizer files each family's torchtune tokenizer reads (Gemma 3: only its SentencePiece model; SmolLM2 and
# Mistral-Nemo: only their tokenizer.json).
TOKENIZER_FILES = {
    "llama3_2": {"original/tokenizer.model", "tokenizer.json"},
    "qwen2_5": {"vocab.json", "merges.txt", "tokenizer.json"},
    "qwen3": {"vocab.json", "merges.txt", "tokenizer.json"},
    "gemma3": {"tokenizer.model"},
    "smollm2": {"tokenizer.json"},
    "mistral_nemo": {"tokenizer.json"},
}
MODEL_TYPES = {
    "llama3_2": "llama",
    "qwen2_5": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3_text",
    "smollm2": "llama",
    "mistral_nemo": "mistral",
}
# Their special tokens take the first ids, as in the real tokenizer.json; the others' follow the base vocabulary.
SPECIALS_FIRST = {"smollm2", "mistral_nemo"}
COMMON_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer_config.json",
    "special_tokens_map.json",
}
# Norm weights that apply a scale of 1 + weight (Gemma's), and those drawn off their neutral value so that a norm
# applied on the wrong side of RoPE changes the logits.
QK_NORMS = {"qwen3": 1.0, "gemma3": 0.0}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {family: build_tiny_model(root / family, family=family) for family in FAMILIES}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict[str, Path]:
    return build_tiny_dataset(tmp_path_factory.mktemp("tiny-dataset"), train_rows=200, eval_rows=20)


def read_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def file_hashes(model_dir: Path) -> dict[str, str]:
    return {
        str(path.relative_to(model_dir)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(model_dir.rglob("*"))
        if path.is_file()
    }


def torchtune_tokenizer(family: str, model_dir: Path):
    """The family's tokenizer as a run builds it (torchtune's, or ours where the family has one)."""
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir, instantiate

    return instantiate(inspect_model_dir(model_dir).tokenizer_node(None))


def load_torchtune_state_dict(family: str, model_dir: Path, output_dir: Path, files=("model.safetensors",)):
    from kfp_finetune.components._shared.torchtune.checkpointer import HFCheckpointer

    checkpointer = HFCheckpointer(
        checkpoint_dir=str(model_dir),
        checkpoint_files=list(files),
        model_type=checkpointer_model_type(family),
        output_dir=str(output_dir),
    )
    return checkpointer.load_checkpoint()["model"]


@pytest.mark.parametrize("family", FAMILIES)
def test_files_present(models, family):
    present = set(file_hashes(models[family]))
    assert present == COMMON_FILES | TOKENIZER_FILES[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_config_matches_weights(models, family):
    from safetensors import safe_open

    config = read_config(models[family])
    assert config["model_type"] == MODEL_TYPES[family]
    tied = family != "mistral_nemo"  # Mistral-Nemo's output layer is its own, as in the real checkpoint
    assert config["tie_word_embeddings"] is tied and config["torch_dtype"] == "float32"
    dim, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", dim // heads)
    with safe_open(models[family] / "model.safetensors", framework="pt") as weights:
        shapes = {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}  # noqa: SIM118
    assert shapes["model.embed_tokens.weight"] == (config["vocab_size"], dim)
    # tied, as in the real small Llama-3.2 / Qwen2.5 / Qwen3 / Gemma 3 / SmolLM2 checkpoints
    assert ("lm_head.weight" in shapes) is not tied
    layers = {int(m.group(1)) for key in shapes if (m := re.match(r"model\.layers\.(\d+)\.", key))}
    assert layers == set(range(config["num_hidden_layers"]))
    for layer in layers:
        prefix = f"model.layers.{layer}."
        assert shapes[prefix + "self_attn.q_proj.weight"] == (heads * head_dim, dim)
        assert shapes[prefix + "self_attn.k_proj.weight"] == (kv_heads * head_dim, dim)
        assert shapes[prefix + "self_attn.o_proj.weight"] == (dim, heads * head_dim)
        assert shapes[prefix + "mlp.gate_proj.weight"] == (config["intermediate_size"], dim)
        assert shapes[prefix + "mlp.down_proj.weight"] == (dim, config["intermediate_size"])
        assert (prefix + "self_attn.q_proj.bias" in shapes) == config.get("attention_bias", False)
        if family in QK_NORMS:
            assert (
                shapes[prefix + "self_attn.q_norm.weight"]
                == shapes[prefix + "self_attn.k_norm.weight"]
                == (head_dim,)
            )
    if (
        family in QK_NORMS
    ):  # its own head_dim, as Qwen3-0.6B's 128 with 1024 / 16, Gemma-3-1B's 256 with 1152 / 4
        assert head_dim != dim // heads
    if family == "mistral_nemo":  # its own head_dim, as Mistral-Nemo's 128 with 5120 / 32
        assert head_dim < dim // heads
    if family == "gemma3":  # local and global layers, a window shorter than the task's examples
        assert config["layer_types"] == ["sliding_attention", "full_attention"]
        assert config["sliding_window"] < 24 and config["query_pre_attn_scalar"] == head_dim

    added = special_tokens(family, models[family])
    assert max(added.values()) < config["vocab_size"]
    eos_ids = config["eos_token_id"] if isinstance(config["eos_token_id"], list) else [config["eos_token_id"]]
    assert {config["bos_token_id"], *eos_ids} <= set(added.values())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_transformers_loads_it_with_torchtunes_logits(models, family, tmp_path):
    """The kit's weights are what transformers computes with: fp32, within 1e-5 of the torchtune model's logits."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    config = read_config(models[family])
    model = build_torchtune_model(family, config).eval()
    model.load_state_dict(load_torchtune_state_dict(family, models[family], tmp_path), strict=True)
    hf_model = AutoModelForCausalLM.from_pretrained(models[family], dtype=torch.float32).eval()
    tokens = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(tokens) - hf_model(tokens).logits).abs().max().item() <= 1e-5
    if family in QK_NORMS:  # non-trivial, so that a norm applied on the wrong side of RoPE changes the logits
        with safe_open(models[family] / "model.safetensors", framework="pt") as weights:
            q_norm = weights.get_tensor("model.layers.0.self_attn.q_norm.weight")
            assert q_norm.std() > 0.1 and abs(q_norm.mean() - QK_NORMS[family]) < 0.2


@pytest.mark.parametrize("family", FAMILIES)
def test_build_is_deterministic(models, family, tmp_path):
    again = build_tiny_model(tmp_path / "again", family=family)
    assert file_hashes(again) == file_hashes(models[family])
    other_seed = file_hashes(build_tiny_model(tmp_path / "seed1", family=family, seed=1))
    assert other_seed["model.safetensors"] != file_hashes(again)["model.safetensors"]
    # The tokenizer depends only on the family, so models of one family share it whatever the seed.
    for name in TOKENIZER_FILES[family]:
        assert other_seed[name] == file_hashes(again)[name]


@pytest.mark.parametrize("family", FAMILIES)
def test_torchtune_loads_weights_strictly(models, family, tmp_path):
    from torchtune.data import Message

    config = read_config(models[family])
    state_dict = load_torchtune_state_dict(family, models[family], tmp_path)
    model = build_torchtune_model(family, config)
    model.load_state_dict(state_dict, strict=True)

    lora = {
        "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True,
        "lora_rank": 8,
        "lora_alpha": 16,
    }
    lora_model = build_torchtune_model(family, config, lora=lora)
    result = lora_model.load_state_dict(state_dict, strict=False)
    assert result.unexpected_keys == []
    assert result.missing_keys and all(".lora_" in key for key in result.missing_keys)

    tokenizer = torchtune_tokenizer(family, models[family])
    tokens, _ = tokenizer.tokenize_messages(
        [
            Message(role="user", content="Uppercase: c a t s", masked=True),
            Message(role="assistant", content="C A T S"),
        ]
    )
    with torch.no_grad():
        logits = model(torch.tensor([tokens]))
    assert logits.shape == (1, len(tokens), config["vocab_size"])
    assert torch.isfinite(logits).all()


def special_tokens(family: str, model_dir: Path) -> dict[str, int]:
    """The family's special tokens and their ids, as its tokenizer files list them."""
    if family == "gemma3":
        import sentencepiece

        spm = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
        return {spm.id_to_piece(i): i for i in range(spm.vocab_size()) if not spm.is_byte(i) and i < 6}
    return {
        t["content"]: t["id"] for t in json.loads((model_dir / "tokenizer.json").read_text())["added_tokens"]
    }


def test_gemma3s_tokenizer_has_gemmas_ids_and_setup(models):
    """<pad> 0, <eos> 1, <bos> 2, <unk> 3 as in Gemma's tokenizer.model, the turn tokens whole pieces, no dummy
    prefix, digits split; the tokenizer config names the turn tokens and Gemma 3's chat template."""
    tokenizer = torchtune_tokenizer("gemma3", models["gemma3"])
    assert (tokenizer.pad_id, tokenizer.eos_id, tokenizer.bos_id) == (0, 1, 2)
    assert special_tokens("gemma3", models["gemma3"]) == {
        "<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 4, "<end_of_turn>": 5,
    }  # fmt: skip
    assert (tokenizer.start_of_turn_id, tokenizer.end_of_turn_id) == (4, 5)
    assert tokenizer.stop_tokens == [5, 1]
    turn = tokenizer.encode("<start_of_turn>model\n123<end_of_turn>", add_bos=False, add_eos=False)
    assert turn[0] == 4 and turn[-1] == 5 and len(turn) == 1 + 2 + 3 + 1
    assert tokenizer.encode("x", add_bos=False, add_eos=False) != tokenizer.encode(
        " x", add_bos=False, add_eos=False
    )
    tokenizer_config = json.loads((models["gemma3"] / "tokenizer_config.json").read_text())
    assert tokenizer_config["additional_special_tokens"] == ["<start_of_turn>", "<end_of_turn>"]
    assert "<start_of_turn>" in tokenizer_config["chat_template"]


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_round_trips_task_text(models, dataset, family):
    from tokenizers import Tokenizer

    tokenizer = torchtune_tokenizer(family, models[family])
    json_file = models[family] / "tokenizer.json"
    hf_tokenizer = Tokenizer.from_file(str(json_file)) if json_file.is_file() else None
    rows = [json.loads(line) for line in dataset["eval.jsonl"].read_text().splitlines()]
    for text in [row[column] for row in rows for column in ("input", "output")] + ["Hello world! 123"]:
        ids = tokenizer.encode(text, add_bos=False, add_eos=False)
        assert tokenizer.decode(ids) == text
        # torchtune's encoder (tiktoken / its own BPE) and the HF tokenizer.json agree.
        if hf_tokenizer is not None:
            assert hf_tokenizer.encode(text, add_special_tokens=False).ids == ids

    # Every letter of the task is a single token, so the task is short and regular.
    prompt_ids = tokenizer.encode(rows[0]["input"], add_bos=False, add_eos=False)
    assert len(prompt_ids) == 2 + len(rows[0]["input"].split()) - 1
    if family == "gemma3":  # its ids: test_gemma3s_tokenizer_has_gemmas_ids_and_setup
        return

    added = special_tokens(family, models[family])
    assert {k: v for k, v in tokenizer.special_tokens.items() if k in added} == added
    if family == "llama3_2":
        assert tokenizer.bos_id == added["<|begin_of_text|>"] and tokenizer.eot_id == added["<|eot_id|>"]
    elif family == "mistral_nemo":
        assert tokenizer.bos_id == added["<s>"] and tokenizer.eos_id == added["</s>"]
    elif family == "smollm2":
        assert tokenizer.bos_id is None and tokenizer.eos_id == added["<|im_end|>"]
    else:
        assert tokenizer.im_start_id == added["<|im_start|>"] and tokenizer.eos_id == added["<|im_end|>"]
    if family == "qwen3":  # Qwen3's plain added tokens: whole tokens in text, kept when decoding
        think = tokenizer.encode("<think>\n\n</think>", add_bos=False, add_eos=False)
        assert [think[0], think[-1]] == [added["<think>"], added["</think>"]]
        assert hf_tokenizer.encode("<think>\n\n</think>", add_special_tokens=False).ids == think
    # Special tokens come right after the base vocabulary, or first.
    first = 0 if family in SPECIALS_FIRST else min(added.values())
    assert sorted(added.values()) == list(range(first, first + len(added)))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow
def test_dim_256_builds_for_qlora(family, tmp_path):
    from safetensors import safe_open

    model_dir = build_tiny_model(tmp_path / family, family=family, dim=256)
    config = read_config(model_dir)
    assert config["hidden_size"] == 256
    state_dict = load_torchtune_state_dict(family, model_dir, tmp_path / "out")
    build_torchtune_model(family, config).load_state_dict(state_dict, strict=True)
    qlora = {
        "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
        "apply_lora_to_mlp": True,
        "lora_rank": 8,
        "lora_alpha": 16,
        "quantize_base": True,
    }
    qlora_model = build_torchtune_model(family, config, lora=qlora)
    result = qlora_model.load_state_dict(state_dict, strict=False)
    assert result.unexpected_keys == [] and all(".lora_" in key for key in result.missing_keys)
    with torch.no_grad():
        assert torch.isfinite(qlora_model(torch.tensor([[1, 2, 3]]))).all()
    # QLoRA (NF4) quantizes weights in blocks: numel / 64 must be divisible by 256.
    with safe_open(model_dir / "model.safetensors", framework="pt") as weights:
        for key in weights.keys():  # noqa: SIM118
            if key.endswith("proj.weight"):
                shape = weights.get_slice(key).get_shape()
                assert (shape[0] * shape[1] // 64) % 256 == 0, key


def test_dataset_is_deterministic_and_disjoint(dataset, tmp_path):
    import pyarrow.parquet as pq

    again = build_tiny_dataset(tmp_path / "again", train_rows=200, eval_rows=20)
    for name, path in dataset.items():
        assert again[name].read_bytes() == path.read_bytes(), name
    other = build_tiny_dataset(tmp_path / "other", seed=1, train_rows=200, eval_rows=20)
    assert other["train.jsonl"].read_bytes() != dataset["train.jsonl"].read_bytes()

    splits = {}
    for split, size in (("train", 200), ("eval", 20)):
        rows = [json.loads(line) for line in dataset[f"{split}.jsonl"].read_text().splitlines()]
        table = pq.read_table(dataset[f"{split}.parquet"])
        assert table.column_names == ["input", "output"]
        assert table.to_pylist() == rows
        assert len(rows) == size
        splits[split] = {row["input"] for row in rows}
    assert len(splits["train"]) == 200
    assert not splits["train"] & splits["eval"]


def test_dataset_rows_follow_the_task(dataset):
    for line in dataset["train.jsonl"].read_text().splitlines():
        row = json.loads(line)
        letters = row["input"].split(": ", 1)[1]
        assert row["output"] == letters.upper()


def test_cli_commands(tmp_path, capsys):
    assert (
        cli.main(["tiny-model", str(tmp_path / "m"), "--family", "qwen2_5", "--dim", "32", "--seed", "3"])
        == 0
    )
    assert read_config(tmp_path / "m")["hidden_size"] == 32
    assert cli.main(["tiny-model", str(tmp_path / "q3"), "--family", "qwen3", "--dim", "32"]) == 0
    assert {k: read_config(tmp_path / "q3")[k] for k in ("model_type", "head_dim")} == {
        "model_type": "qwen3",
        "head_dim": 16,
    }
    assert cli.main(["tiny-model", str(tmp_path / "g3"), "--family", "gemma3", "--num-layers", "4"]) == 0
    assert read_config(tmp_path / "g3")["layer_types"] == ["sliding_attention", "full_attention"] * 2
    assert cli.main(["tiny-model", str(tmp_path / "n"), "--family", "mistral_nemo", "--dim", "32"]) == 0
    assert {k: read_config(tmp_path / "n")[k] for k in ("model_type", "head_dim", "tie_word_embeddings")} == {
        "model_type": "mistral",
        "head_dim": 4,
        "tie_word_embeddings": False,
    }
    assert cli.main(["tiny-model", str(tmp_path / "s"), "--family", "smollm2", "--dim", "32"]) == 0
    assert not (tmp_path / "s" / "original").exists() and read_config(tmp_path / "s")["rope_scaling"] is None
    assert cli.main(["tiny-dataset", str(tmp_path / "d"), "--train-rows", "5", "--eval-rows", "2"]) == 0
    assert len((tmp_path / "d" / "train.jsonl").read_text().splitlines()) == 5
    assert str(tmp_path / "d" / "eval.parquet") in capsys.readouterr().out


def test_cli_help_does_not_import_torch():
    code = (
        "import sys; from kfp_finetune import cli; cli.build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "ok"
