"""Config resolution: auto-selection, precedence, where every typed field lands, and every bad input's error."""

import json
import shutil

import pytest
import yaml

from kfp_finetune.components._shared.torchtune import sample_packing
from kfp_finetune.components._shared.torchtune.config import (
    ConfigError,
    LoraSettings,
    TorchtuneConfig,
    from_flat,
)
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, inspect_model_dir
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command

# Real HF config.json values of one released size per family, and the torchtune builder of that size.
_LLAMA3 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
}
REAL_MODELS = {
    "llama2": ("torchtune.models.llama2.llama2_7b", {"model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "vocab_size": 32000, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}, ["tokenizer.model"]),
    "code_llama2": ("torchtune.models.code_llama2.code_llama2_7b", {"model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "vocab_size": 32016, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "max_position_embeddings": 16384},
        ["tokenizer.model"]),
    "llama3": ("torchtune.models.llama3.llama3_8b", _LLAMA3, ["original/tokenizer.model"]),
    "llama3_1": ("torchtune.models.llama3_1.llama3_1_8b", {**_LLAMA3, "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "rope_type": "llama3"}}, ["original/tokenizer.model"]),
    "llama3_2": ("torchtune.models.llama3_2.llama3_2_1b", {**_LLAMA3, "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "max_position_embeddings": 131072, "tie_word_embeddings": True,
        "rope_scaling": {"factor": 32.0, "rope_type": "llama3"}}, ["original/tokenizer.model"]),
    "mistral": ("torchtune.models.mistral.mistral_7b", {"model_type": "mistral", "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "vocab_size": 32000, "rms_norm_eps": 1e-5, "max_position_embeddings": 32768}, ["tokenizer.model"]),
    "gemma": ("torchtune.models.gemma.gemma_2b", {"model_type": "gemma", "hidden_size": 2048,
        "intermediate_size": 16384, "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1,
        "head_dim": 256, "vocab_size": 256000, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192},
        ["tokenizer.model"]),
    "gemma2": ("torchtune.models.gemma2.gemma2_2b", {"model_type": "gemma2", "hidden_size": 2304,
        "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "vocab_size": 256000, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096,
        "query_pre_attn_scalar": 256}, ["tokenizer.model"]),
    "phi3": ("torchtune.models.phi3.phi3_mini", {"model_type": "phi3", "hidden_size": 3072,
        "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "vocab_size": 32064, "rms_norm_eps": 1e-5, "max_position_embeddings": 4096}, ["tokenizer.model"]),
    "phi4": ("torchtune.models.phi4.phi4_14b", {"model_type": "phi3", "hidden_size": 5120,
        "intermediate_size": 17920, "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 10,
        "vocab_size": 100352, "rms_norm_eps": 1e-5, "max_position_embeddings": 16384},
        ["vocab.json", "merges.txt"]),
    "qwen2": ("torchtune.models.qwen2.qwen2_0_5b", {"model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 32768,
        "tie_word_embeddings": True}, ["vocab.json", "merges.txt", "tokenizer.json:qwen2"]),
    "qwen2_5": ("torchtune.models.qwen2_5.qwen2_5_0_5b", {"model_type": "qwen2", "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
        "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "max_position_embeddings": 32768,
        "tie_word_embeddings": True}, ["vocab.json", "merges.txt", "tokenizer.json:qwen2_5"]),
}  # fmt: skip
_QWEN_ADDED = {"qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]}
_QWEN_ADDED["qwen2_5"] = _QWEN_ADDED["qwen2"] + ["<|fim_prefix|>", "<tool_call>"]


def fake_model_dir(root, family):
    """A model folder with a real config.json and placeholder weight/tokenizer files (enough to resolve)."""
    _, hf_config, files = REAL_MODELS[family]
    path = root / family
    (path / "original").mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(hf_config))
    (path / "model.safetensors").write_bytes(b"")
    for name in files:
        name, _, variant = name.partition(":")
        content = (
            json.dumps({"added_tokens": [{"content": t} for t in _QWEN_ADDED[variant]]}) if variant else ""
        )
        (path / name).write_text(content)
    return path


def resolve(model_dir, data, tmp_path, validate=True, **settings):
    devices, nodes = settings.pop("devices", 1), settings.pop("nodes", 1)
    extra = {k: settings.pop(k) for k in ("token_lengths", "gpu_memory_gib") if k in settings}
    cfg = TorchtuneConfig(**settings)
    return resolve_run(
        cfg, model_dir, data, tmp_path / "run", devices=devices, nodes=nodes, validate=validate, **extra
    )


@pytest.fixture(scope="module")
def data_file(tiny_dataset):
    return tiny_dataset["train.jsonl"]


@pytest.mark.parametrize("family", sorted(REAL_MODELS))
def test_every_family_builds_the_same_architecture_as_torchtunes_named_builder(family, tmp_path):
    import torch
    from torchtune.config._utils import _get_component_from_path

    named_builder, _, _ = REAL_MODELS[family]
    model = inspect_model_dir(fake_model_dir(tmp_path, family))
    assert model.family.name == family
    node = model.model_node()
    with torch.device("meta"):
        ours = _get_component_from_path(node.pop("_component_"))(**node)
        reference = _get_component_from_path(named_builder)()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {
        k: v.shape for k, v in reference.state_dict().items()
    }


@pytest.mark.parametrize(
    ("family", "method", "devices", "nodes", "recipe", "config"),
    [
        ("llama3_2", "lora", 1, 1, "lora_finetune_single_device", "llama3_2/1B_lora_single_device"),
        ("llama3_2", "qlora", 1, 1, "lora_finetune_single_device", "llama3_2/1B_qlora_single_device"),
        ("llama3_2", "dora", 1, 1, "lora_finetune_single_device", "llama3_2/1B_lora_single_device"),
        ("llama3_2", "full", 1, 1, "full_finetune_single_device", "llama3_2/1B_full_single_device"),
        ("llama3_2", "lora", 4, 1, "lora_finetune_distributed", "llama3_2/1B_lora"),
        ("llama3_2", "full", 8, 2, "full_finetune_distributed", "llama3_2/1B_full"),
        ("llama3", "dora", 1, 1, "lora_finetune_single_device", "llama3/8B_dora_single_device"),
        ("llama3_1", "qlora", 1, 1, "lora_finetune_single_device", "llama3_1/8B_qlora_single_device"),
        # The nearest size first: the family's only distributed QLoRA config is 405B's (adapter-only checkpoints).
        ("llama3_1", "qlora", 8, 1, "lora_finetune_distributed", "llama3_1/8B_lora"),
        ("llama3_2", "qlora", 8, 1, "lora_finetune_distributed", "llama3_2/1B_lora"),
        ("qwen2_5", "lora", 1, 1, "lora_finetune_single_device", "qwen2_5/0.5B_lora_single_device"),
        ("qwen2", "full", 2, 1, "full_finetune_distributed", "qwen2/0.5B_full"),
        ("mistral", "full", 1, 1, "full_finetune_single_device", "mistral/7B_full_low_memory"),
        ("gemma", "lora", 1, 1, "lora_finetune_single_device", "gemma/2B_lora_single_device"),
        ("gemma2", "qlora", 1, 1, "lora_finetune_single_device", "gemma2/2B_qlora_single_device"),
        ("phi3", "lora", 2, 1, "lora_finetune_distributed", "phi3/mini_lora"),
        ("phi4", "full", 1, 1, "full_finetune_single_device", "phi4/14B_full_low_memory"),
        # Code Llama LoRA is refused (lora_llama2 takes no rope_base): test_torchtune_layout.py.
        ("code_llama2", "full", 1, 1, "full_finetune_single_device", "code_llama2/7B_full_low_memory"),
    ],
)
def test_auto_selection(family, method, devices, nodes, recipe, config, tmp_path, data_file):
    # Not validated: GPU configs name optional packages (bitsandbytes) that this machine need not have.
    model_dir = fake_model_dir(tmp_path, family)
    run = resolve(model_dir, data_file, tmp_path, validate=False, method=method, devices=devices, nodes=nodes)
    assert (run.recipe, run.config_name) == (recipe, config)
    assert run.distributed == (devices * nodes > 1)
    assert run.config["checkpointer"]["model_type"] == FAMILIES[family].model_type
    assert run.config["model"].get("quantize_base", False) == (method == "qlora")
    assert run.config["model"].get("use_dora", False) == (method == "dora")
    assert ("lora_rank" in run.config["model"]) == (method != "full")


@pytest.mark.slow
def test_tiny_models_pick_the_smallest_family_config(tiny_llama, tiny_qwen, data_file, tmp_path):
    llama = resolve(tiny_llama, data_file, tmp_path, method="lora")
    assert llama.config_name == "llama3_2/1B_lora_single_device"
    assert llama.config["model"]["_component_"] == "torchtune.models.llama3_2.lora_llama3_2"
    assert llama.config["model"]["embed_dim"] == 64
    qwen = resolve(tiny_qwen, data_file, tmp_path, method="lora")
    assert qwen.config_name == "qwen2_5/0.5B_lora_single_device"
    assert qwen.config["model"]["tie_word_embeddings"] is True
    assert qwen.config["tokenizer"]["merges_file"].endswith("merges.txt")


@pytest.mark.slow
def test_explicit_recipe_and_config_win(tiny_llama, data_file, tmp_path):
    run = resolve(
        tiny_llama,
        data_file,
        tmp_path,
        recipe="lora_finetune_single_device",
        config="qwen2/0.5B_lora_single_device",
    )
    assert (run.recipe, run.config_name) == ("lora_finetune_single_device", "qwen2/0.5B_lora_single_device")
    assert run.config["model"]["lora_rank"] == 32  # the chosen config's hyperparameters
    assert (
        run.config["model"]["_component_"] == "torchtune.models.llama3_2.lora_llama3_2"
    )  # the model dir's model
    own = tmp_path / "mine.yaml"
    own.write_text(
        yaml.safe_dump(
            {"batch_size": 3, "epochs": 7, "optimizer": {"_component_": "torch.optim.SGD", "lr": 0.1}}
        )
    )
    run = resolve(tiny_llama, data_file, tmp_path, recipe="lora_finetune_single_device", config=str(own))
    assert (run.config["batch_size"], run.config["epochs"], run.config_name) == (3, 7, None)


def test_every_typed_field_lands_at_its_torchtune_key(tiny_llama, data_file, tmp_path):
    cfg = TorchtuneConfig(
        method="lora", device="cpu", dtype="bf16", batch_size=3, epochs=2, gradient_accumulation_steps=5,
        loss="torchtune.modules.loss.CEWithChunkedOutputLoss", optimizer="torch.optim.SGD", optimizer_fused=False,
        learning_rate=0.05, weight_decay=0.1, lr_scheduler="torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
        num_warmup_steps=7, enable_activation_checkpointing=True, enable_activation_offloading=False,
        lora=LoraSettings(lora_attn_modules=["q_proj", "k_proj"], apply_lora_to_mlp=False, apply_lora_to_output=False,
                          lora_rank=4, lora_alpha=8, lora_dropout=0.1),
        max_steps_per_epoch=11, packed=True, max_seq_len=96, compile=True, seed=13, save_adapter_weights_only=True,
        log_every_n_steps=2,
    )  # fmt: skip
    cfg.dataset.train_on_input = True
    cfg.dataset.new_system_prompt = "Be brief."
    cfg.dataset.column_map = {"input": "question", "output": "answer"}
    run = resolve_run(cfg, tiny_llama, data_file, tmp_path / "run")
    c = yaml.safe_load(run.yaml_path.read_text())
    assert (c["device"], c["dtype"], c["batch_size"], c["epochs"], c["gradient_accumulation_steps"]) == (
        "cpu",
        "bf16",
        3,
        2,
        5,
    )
    assert c["loss"] == {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"}
    assert c["optimizer"] == {
        "_component_": "torch.optim.SGD",
        "lr": 0.05,
        "weight_decay": 0.1,
        "fused": False,
    }
    assert c["lr_scheduler"]["num_warmup_steps"] == 7
    assert (c["enable_activation_checkpointing"], c["enable_activation_offloading"]) == (True, False)
    m = c["model"]
    assert (m["lora_attn_modules"], m["apply_lora_to_mlp"], m["lora_rank"], m["lora_alpha"], m["lora_dropout"]) == (
        ["q_proj", "k_proj"], False, 4, 8, 0.1)  # fmt: skip
    d = c["dataset"]  # packed by torchtune: through our builder, no label across samples (sample_packing.py)
    assert (d["_component_"], d["builder"]) == (
        sample_packing.COMPONENT,
        "torchtune.datasets.instruct_dataset",
    )
    assert (d["source"], d["data_files"], d["split"]) == ("json", [str(data_file)], "train")
    assert (d["train_on_input"], d["new_system_prompt"], d["packed"]) == (True, "Be brief.", True)
    assert d["column_map"] == {"input": "question", "output": "answer"}
    assert c["tokenizer"]["max_seq_len"] == 96
    assert (c["max_steps_per_epoch"], c["compile"], c["seed"], c["save_adapter_weights_only"], c["log_every_n_steps"]) == (
        11, True, 13, True, 2)  # fmt: skip


def test_chat_and_text_datasets(tiny_llama, data_file, tmp_path):
    # validate=False: the nodes are checked, not the instruct rows of data_file against them (prompt_fit)
    chat = resolve(
        tiny_llama,
        data_file,
        tmp_path,
        validate=False,
        dataset={"dataset_type": "chat", "conversation_style": "sharegpt"},
    )
    assert chat.config["dataset"]["_component_"] == "torchtune.datasets.chat_dataset"
    assert (chat.config["dataset"]["conversation_column"], chat.config["dataset"]["conversation_style"]) == (
        "messages", "sharegpt")  # fmt: skip
    text = resolve(
        tiny_llama,
        data_file,
        tmp_path,
        validate=False,
        dataset={"dataset_type": "text", "text_column": "body"},
    )
    assert text.config["dataset"]["_component_"] == "torchtune.datasets.text_completion_dataset"
    assert text.config["dataset"]["column"] == "body"
    hub = resolve(tiny_llama, None, tmp_path, dataset={"source": "tatsu-lab/alpaca", "split": "train[:100]"})
    assert (hub.config["dataset"]["source"], hub.config["dataset"]["split"]) == (
        "tatsu-lab/alpaca",
        "train[:100]",
    )
    assert "data_files" not in hub.config["dataset"]


def test_alpaca_style_instruct_data_uses_the_alpaca_builder(tiny_llama, data_file, tmp_path):
    run = resolve(tiny_llama, data_file, tmp_path, dataset={"data_style": "alpaca", "train_on_input": True})
    assert run.config["dataset"]["_component_"] == "torchtune.datasets.alpaca_dataset"
    assert run.config["dataset"]["train_on_input"] is True
    with pytest.raises(ConfigError, match="new_system_prompt is not supported for alpaca"):
        resolve(tiny_llama, data_file, tmp_path, dataset={"data_style": "alpaca", "new_system_prompt": "Hi"})
    with pytest.raises(ConfigError, match="conversation_style must be one of openai, sharegpt"):
        resolve(
            tiny_llama, data_file, tmp_path, dataset={"dataset_type": "chat", "conversation_style": "chatml"}
        )


def test_qwen_with_max_seq_len_still_trains_on_every_examples_end_token(tiny_qwen, data_file, tmp_path):
    """torchtune 0.6.1's Qwen tokenizers mask the end token whenever max_seq_len is set; the resolved YAML names
    our fixed builder, which torchtune's config system builds into the dataset the recipe trains on."""
    from omegaconf import OmegaConf
    from torchtune import config

    run = resolve(tiny_qwen, data_file, tmp_path, max_seq_len=64)
    resolved = OmegaConf.load(run.yaml_path)
    assert resolved.tokenizer._component_ == (
        "kfp_finetune.components._shared.torchtune.tokenizer_builders.qwen2_5_tokenizer"
    )
    tokenizer = config.instantiate(resolved.tokenizer)
    assert tokenizer.max_seq_len == 64
    example = config.instantiate(resolved.dataset, tokenizer)[0]
    assert len(example["tokens"]) < 64
    assert example["tokens"][-1] == example["labels"][-1] == tokenizer.eos_id


def test_only_the_qwen_families_gemma3_and_the_tokenizer_json_families_use_our_own_tokenizers():
    """The Qwen ones fixed, Qwen3's and Gemma 3's written here (torchtune 0.6.1 has neither), and the tokenizer.json
    tokenizer of the families whose repos ship nothing else."""
    ours = {name for name, family in FAMILIES.items() if not family.tokenizer.startswith("torchtune.models.")}
    assert ours == {"qwen2", "qwen2_5", "qwen3", "gemma3", "smollm2", "mistral_nemo"}
    reading_tokenizer_json = {
        name for name, f in FAMILIES.items() if f.tokenizer_files == {"path": "tokenizer.json"}
    }
    assert reading_tokenizer_json == {"smollm2", "mistral_nemo"}


@pytest.mark.slow
def test_data_folder_uses_its_train_files(tiny_dataset, tiny_llama, tmp_path):
    run = resolve(tiny_llama, tiny_dataset["train.parquet"].parent, tmp_path)
    assert run.config["dataset"]["source"] == "parquet"
    assert run.config["dataset"]["data_files"] == [str(tiny_dataset["train.parquet"])]


@pytest.mark.slow
def test_precedence_base_then_fields_then_overrides(tiny_llama, data_file, tmp_path):
    base = resolve(tiny_llama, data_file, tmp_path)
    assert base.config["optimizer"]["lr"] == 3e-4  # llama3_2/1B_lora_single_device's own value
    typed = resolve(tiny_llama, data_file, tmp_path, learning_rate=1e-3)
    assert typed.config["optimizer"]["lr"] == 1e-3
    both = resolve(
        tiny_llama, data_file, tmp_path, learning_rate=1e-3,
        overrides={"optimizer.lr": 5e-4, "+clip_grad_norm_extra.value": 1, "~profiler": None, "clip_grad_norm": 1.0},
    )  # fmt: skip
    assert both.config["optimizer"]["lr"] == 5e-4
    assert both.config["clip_grad_norm_extra"] == {"value": 1}
    assert "profiler" not in both.config
    assert both.config["clip_grad_norm"] == 1.0


@pytest.mark.slow
def test_cpu_runs_get_cpu_safe_settings(tiny_llama, data_file, tmp_path):
    full = resolve(tiny_llama, data_file, tmp_path, method="full", device="cpu")
    assert full.config["optimizer"]["_component_"] == "torch.optim.AdamW"  # not bitsandbytes' PagedAdamW8bit
    assert full.config["optimizer_in_bwd"] is False
    assert (full.config["dtype"], full.config["log_peak_memory_stats"]) == ("fp32", False)


@pytest.mark.slow
def test_all_outputs_inside_the_run_dir_and_written_atomically(tiny_llama, data_file, tmp_path):
    run = resolve(tiny_llama, data_file, tmp_path)
    run_dir = str(tmp_path / "run")
    c = run.config
    assert c["output_dir"] == c["checkpointer"]["output_dir"] == run_dir
    assert c["metric_logger"]["log_dir"] == f"{run_dir}/logs"
    assert c["profiler"]["output_dir"].startswith(run_dir)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["torchtune_config.yaml"]
    assert "${" not in run.yaml_path.read_text()  # interpolations resolved: the file is complete
    with pytest.raises(ConfigError, match="outside the run directory"):
        resolve(tiny_llama, data_file, tmp_path, overrides={"output_dir": "/tmp/elsewhere"})


def test_tune_command():
    # The fine-tuning recipes run as our recipe module (resume); `tune run` turns its path into a module name.
    assert tune_command("lora_finetune_single_device", "/w/c.yaml") == [
        "tune", "run", "kfp_finetune/components/torchtune_finetune/recipe.py", "--config", "/w/c.yaml"]  # fmt: skip
    assert tune_command("qat_distributed", "c.yaml")[2] == "qat_distributed"  # not extended: torchtune's own
    assert tune_command("full_finetune_distributed", "c.yaml", ["--nnodes", "2"])[:4] == [
        "tune",
        "run",
        "--nnodes",
        "2",
    ]


def test_from_flat_maps_names_to_groups():
    cfg = from_flat({"method": "qlora", "lora_rank": 4, "column_map": {"input": "q"}, "clip_grad_norm": 1.0},
                    unknown_to_overrides=True)  # fmt: skip
    assert (cfg.method, cfg.lora.lora_rank, cfg.dataset.column_map, cfg.overrides) == (
        "qlora", 4, {"input": "q"}, {"clip_grad_norm": 1.0})  # fmt: skip
    with pytest.raises(ConfigError, match="unknown setting 'lora_rnak'"):
        from_flat({"lora_rnak": 4})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"recipe": "lora_finetune_everywhere"}, "recipe 'lora_finetune_everywhere' is unknown"),
        ({"config": "llama3_2/1B_nonsense"}, "config 'llama3_2/1B_nonsense' is unknown"),
        ({"config": "llama3_2/1B_full_single_device"}, "belongs to another recipe"),
        ({"method": "full", "recipe": "lora_finetune_single_device"}, "does not match tune_method='full'"),
        ({"method": "lora", "recipe": "full_finetune_single_device"}, "use a lora_\\* recipe"),
        ({"recipe": "generate"}, "does not fine-tune"),
        ({"lora": {"lora_rank": 0}}, "lora_rank must be at least 1"),
        ({"method": "full", "lora": {"quantize_base": True}}, "quantize_base \\(QLoRA\\) needs an adapter"),
        ({"method": "qlora"}, "QLoRA cannot quantize this model"),
        ({"lora": {"apply_lora_to_output": True}}, "ties its output projection"),
        ({"lora": {"lora_attn_modules": ["q", "v_proj"]}}, "lora_attn_modules has \\['q'\\]"),
        ({"overrides": {"optimzer.lr": 1.0}}, "'optimzer' does not exist"),
        ({"overrides": {"~nothing": None}}, "'nothing' does not exist"),
        ({"method": "sft"}, "method must be one of"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"packed": True}, "packed needs a sequence length"),
        ({"device": "cpu", "devices": 2}, "distributed recipes cannot run on CPU"),
        ({"recipe": "lora_finetune_single_device", "devices": 2}, "runs on one device"),
        ({"save_adapter_weights_only": True, "method": "full"}, "applies to lora/qlora/dora"),
        (
            {"optimizer": "bitsandbytes_missing.optim.AdamW8bit"},
            "cannot load a component .*bitsandbytes_missing",
        ),
        ({"overrides": {"+optimizer.not_an_argument": 1}}, "torchtune rejects the resolved config"),
    ],
)
def test_bad_input_is_rejected_before_anything_runs(settings, message, tiny_llama, data_file, tmp_path):
    with pytest.raises(ConfigError, match=message):
        resolve(tiny_llama, data_file, tmp_path, **settings)
    assert not (tmp_path / "run").exists()


def test_bad_model_dirs(tiny_llama, data_file, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    (broken / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="has no weights"):
        resolve(broken, data_file, tmp_path)
    shutil.copy(tiny_llama / "model.safetensors", broken / "model.safetensors")
    (broken / "original" / "tokenizer.model").unlink()
    with pytest.raises(ConfigError, match="ships no original/tokenizer.model .*llama3_2 tokenizer"):
        resolve(broken, data_file, tmp_path)
    config = json.loads((tiny_llama / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    with pytest.raises(ConfigError, match="unknown architecture model_type='falcon'"):
        resolve(broken, data_file, tmp_path)
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "qwen3_moe"}))
    with pytest.raises(ConfigError, match="Qwen3-MoE .* not supported"):
        resolve(broken, data_file, tmp_path)
    (broken / "config.json").unlink()
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve(broken, data_file, tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve(tiny_llama, tmp_path / "nope.jsonl", tmp_path)
    sharded = tmp_path / "sharded"
    shutil.copytree(tiny_llama, sharded)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))  # fmt: skip
    with pytest.raises(ConfigError, match="missing weight shards .*model-00001-of-00002"):
        resolve(sharded, data_file, tmp_path)


# --- the checkpoint the export needs ------------------------------------------------------------------------


def resolve_for_export(model_dir, data, tmp_path, export_format, **settings):
    cfg = TorchtuneConfig(**settings)
    return resolve_run(cfg, model_dir, data, tmp_path / "run", validate=False, export_format=export_format)


@pytest.mark.parametrize(
    "method", ["lora", "dora"]
)  # QLoRA needs a model wider than tiny_llama; is_peft alike
def test_an_adapter_method_saves_only_its_adapter_whatever_the_export(
    method, tiny_llama, data_file, tmp_path
):
    """No GPU idles at an epoch end while rank 0 merges: export and evaluate merge after training (merge.py)."""
    for export_format in ("merged", "both", "adapter", ""):
        run = resolve_for_export(tiny_llama, data_file, tmp_path, export_format, method=method)
        assert run.config["save_adapter_weights_only"] is True
        assert "save_adapter_weights_only: true" in run.yaml_path.read_text()
        (choice,) = [c for c in run.defaults if c.setting == "save_adapter_weights_only"]
        assert choice.value is True and "no GPU idles" in choice.reason


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("how", ["parameter", "overrides"])
def test_an_explicit_choice_of_checkpoints_wins(value, how, tiny_llama, data_file, tmp_path):
    """False keeps torchtune's own per-epoch merge; True with a merged export is no longer refused (export merges)."""
    if how == "parameter":
        settings = {"save_adapter_weights_only": value}
    else:
        settings = {"overrides": {"save_adapter_weights_only": value}}
    run = resolve_for_export(tiny_llama, data_file, tmp_path, "merged", **settings)
    assert run.config["save_adapter_weights_only"] is value
    assert not [c for c in run.defaults if c.setting == "save_adapter_weights_only"]


def test_a_full_fine_tune_has_no_adapter_only_checkpoints(tiny_llama, data_file, tmp_path):
    run = resolve_for_export(tiny_llama, data_file, tmp_path, "merged", method="full")
    assert (
        "save_adapter_weights_only" not in run.config or run.config["save_adapter_weights_only"] is not True
    )


def test_exports_that_cannot_work_are_refused(tiny_llama, data_file, tmp_path):
    with pytest.raises(
        ConfigError, match="export_format adapter needs a LoRA adapter, but tune_method=full trains none"
    ):
        resolve_for_export(tiny_llama, data_file, tmp_path, "adapter", method="full")
    with pytest.raises(
        ConfigError, match="export_format must be one of merged, adapter, both \\(got 'gguf'\\)"
    ):
        resolve_for_export(tiny_llama, data_file, tmp_path, "gguf")
    assert not (tmp_path / "run").exists()
