"""The transformers engine's early validation: settings are checked, and TRL's and PEFT's configs built, before any
model is read (model_dir need not exist), offline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.transformers.settings import SftSettings

pytest.importorskip("trl")


def settings(**changes) -> SftSettings:
    values = {
        "model_dir": "/nowhere/model",
        "data_files": ["/nowhere/train.parquet"],
        "output_dir": "/tmp/run",
    }
    return SftSettings(**{**values, **changes})


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


@pytest.mark.parametrize(
    ("changes", "field", "fix"),
    [
        ({"method": "lorra"}, "method", "did you mean 'lora'"),
        ({"dataset_type": "chats"}, "dataset_type", "did you mean 'chat'"),
        ({"lora_rank": 0}, "lora_rank", "at least 1"),
        ({"learning_rate": -1e-4}, "learning_rate", "above 0"),
        ({"lora_dropout": 1.0}, "lora_dropout", r"\[0, 1\)"),
        ({"bf16": "yes"}, "bf16", "auto, true or false"),
        ({"max_steps": 0}, "max_steps", "at least 1"),
        ({"data_files": ["/data/train.csv"]}, "data_files", ".parquet, .jsonl"),
        ({"data_files": []}, "data_files", "at least one"),
        ({"column_map": {"question": "q"}}, "column_map", "columns are input, output"),
        (
            {"method": "full", "target_parameters": ["mlp.experts.down_proj"]},
            "target_parameters",
            "method to lora",
        ),
        (  # PEFT refuses it as it wraps the model (lora.ParamWrapper), minutes into a run
            {"target_parameters": ["mlp.experts.down_proj"], "lora_dropout": 0.05},
            "lora_dropout",
            "0 where LoRA adapts 3D parameters",
        ),
        (  # PEFT refuses it as it wraps the model (lora.ParamWrapper)
            {"method": "dora", "target_parameters": ["mlp.experts.down_proj"]},
            "target_parameters",
            "cannot be adapted with DoRA",
        ),
        (
            {"target_parameters": "mlp.experts.down_proj"},
            "target_parameters",
            "must be a list of parameter names",
        ),
        ({"seed": -1}, "seed", "0 or more"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field_and_the_fix(changes, field, fix):
    with pytest.raises(SettingError, match=fix) as raised:
        settings(**changes).check()
    assert raised.value.setting == field
    with pytest.raises(SettingError):  # trl_config checks first: no TRL object for bad settings
        settings(**changes).trl_config()


def test_unknown_or_missing_settings_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="unknown transformers-engine setting.*lora_rnak"):
        SftSettings.from_dict(
            {"model_dir": "m", "data_files": ["d.jsonl"], "output_dir": "o", "lora_rnak": 8}
        )
    with pytest.raises(ConfigError, match="need data_files, output_dir"):
        SftSettings.from_dict({"model_dir": "m"})
    path = tmp_path / "settings.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        SftSettings.from_json(path)


def test_trl_and_peft_configs_are_built_without_loading_a_model(monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("early validation loaded a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    sft, lora = settings(max_steps=20, batch_size=4, max_seq_len=64, seed=7).trl_config()
    assert (sft.max_steps, sft.per_device_train_batch_size, sft.max_length, sft.seed) == (20, 4, 64, 7)
    # Instruct rows train on the answer only, as the torchtune engine's train_on_input false.
    assert sft.completion_only_loss is True and sft.assistant_only_loss is False
    assert sft.bf16 is False and sft.use_cpu  # auto on a machine without a GPU
    assert sft.gradient_checkpointing is False and sft.save_strategy == "no"
    assert sft.model_init_kwargs == {"dtype": "float32"}
    assert (lora.r, lora.lora_alpha, lora.target_modules) == (16, 32.0, "all-linear")

    chat, _ = settings(dataset_type="chat").trl_config()
    assert chat.assistant_only_loss is True and chat.completion_only_loss is False
    full, no_adapter = settings(method="full").trl_config()
    assert no_adapter is None
    qlora, adapter = settings(method="qlora", bf16=False).trl_config()
    assert qlora.model_init_kwargs["quantization_config"].load_in_4bit and adapter is not None
    experts, adapter = settings(target_parameters=["mlp.experts.gate_up_proj"]).trl_config()
    assert adapter.target_parameters == ["mlp.experts.gate_up_proj"]


def test_the_resolved_config_is_json_with_the_settings_and_the_trl_arguments():
    resolved = json.loads(json.dumps(settings(method="qlora", bf16=False).resolved(world_size=2)))
    assert resolved["world_size"] == 2
    assert resolved["settings"]["method"] == "qlora" and resolved["settings"]["bf16"] is False
    assert resolved["sft_config"]["completion_only_loss"] is True
    assert resolved["lora_config"]["r"] == 16


def test_importing_the_wing_imports_no_torch():
    code = (
        "import sys\n"
        "from kfp_finetune.components._shared.transformers import face, run_layout, settings, train\n"
        "assert not {'torch', 'trl', 'transformers', 'peft'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_packing_needs_flash_attention(monkeypatch):
    """Packed rows are kept apart only by flash attention; without flash-attn packing is refused before training."""
    import importlib.util

    # Imported before flash-attn is faked: transformers' import-time checks read the package's metadata.
    from trl import SFTConfig  # noqa: F401

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a)
    )
    with pytest.raises(SettingError, match="flash attention") as raised:
        settings(packing=True).trl_config()
    assert raised.value.setting == "packing"
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a)
    )
    sft, _ = settings(packing=True).trl_config()
    assert sft.packing and sft.model_init_kwargs["attn_implementation"] == "flash_attention_2"


def test_fsdp_is_refused_where_it_cannot_shard():
    for changes, fix in (({"method": "qlora"}, "4-bit"), ({"device": "cpu"}, "GPU runs only")):
        problems = SftSettings(
            model_dir="m", data_files=["t.parquet"], output_dir="r", fsdp=True, **changes
        ).problems()
        assert [p.setting for p in problems] == ["fsdp"] and fix in problems[0].problem


def test_the_fsdp2_arguments_are_the_ones_transformers_reads():
    """transformers drops an fsdp_config key it does not know: each one set is read into accelerate's plugin."""
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from kfp_finetune.components._shared.transformers.settings import fsdp_arguments

    plugin = TrainingArguments(
        output_dir="/tmp/unused", use_cpu=True, **fsdp_arguments(True)
    ).fsdp_plugin_args
    assert plugin["fsdp_version"] == 2 and plugin["reshard_after_forward"] is True
    assert plugin["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert plugin["state_dict_type"] == "SHARDED_STATE_DICT" and plugin["activation_checkpointing"] is True
    unchecked = TrainingArguments(output_dir="/tmp/unused", use_cpu=True, **fsdp_arguments(False))
    assert unchecked.fsdp_plugin_args["activation_checkpointing"] is False


def test_a_run_sharded_on_several_gpus_gets_fsdp2_and_fsdps_own_checkpointing(monkeypatch, tmp_path):
    """The choice made on a GPU host (fast.py) becomes the Trainer's arguments: FSDP2, and activation checkpointing
    by FSDP rather than the Trainer's (which would gather each layer once more)."""
    pytest.importorskip("trl")
    from kfp_finetune.components._shared.transformers import fast

    small_gpu = fast.Hardware(cuda=True, gpu_bytes=24 * fast.GIB)
    monkeypatch.setattr(fast.Hardware, "here", classmethod(lambda cls, device: small_gpu))
    monkeypatch.setattr(
        fast.ModelSize,
        "of",
        classmethod(lambda cls, folder: fast.ModelSize(8_030_261_248, 4096, 32, 128_256)),
    )
    run = SftSettings(model_dir=str(tmp_path), data_files=["t.parquet"], output_dir=str(tmp_path / "run"),
                      method="full", max_seq_len=2048, batch_size=1)  # fmt: skip
    sft, _ = run.trl_config(world_size=8)
    assert sft.fsdp is True and sft.fsdp_plugin_args["fsdp_version"] == 2
    assert sft.fsdp_plugin_args["activation_checkpointing"] is True and sft.gradient_checkpointing is False
    single, _ = run.trl_config(world_size=1)
    assert not single.fsdp and single.gradient_checkpointing is True
