"""The transformers engine's plan from the fine-tune step's settings: the step's names mapped to the engine's, a
torchtune-only setting or a bad value refused by its pipeline name before anything is read, the settings file
written for the command, and that command training the tiny Qwen3-MoE for real."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.transformers import node, plan, run_layout
from kfp_finetune.components._shared.transformers.settings import SftSettings

WHERE = {"model_dir": "/nowhere/model", "data_files": ["/nowhere/train.parquet"], "run_dir": "/nowhere/run"}


def test_the_steps_settings_become_the_engines_under_its_names():
    settings = plan.sft_settings(
        {
            "learning_rate": 1e-4,
            "num_warmup_steps": 3,
            "epochs": 2,
            "max_steps_per_epoch": 5,
            "dtype": "fp32",
            "enable_activation_checkpointing": True,
            "column_map": {"input": "question"},
            "device": "cpu",
            "optimizer": None,  # unset: this engine's default, not a refusal
            "overrides": {},
        },
        **WHERE,
    )
    assert (settings.learning_rate, settings.warmup_steps, settings.epochs) == (1e-4, 3, 2)
    assert (settings.max_steps_per_epoch, settings.max_steps, settings.step_budget) == (5, None, 10)
    assert (settings.bf16, settings.gradient_checkpointing, settings.device) == (False, True, "cpu")
    assert settings.column_map == {"input": "question"}
    assert (settings.model_dir, settings.output_dir) == ("/nowhere/model", "/nowhere/run")


@pytest.mark.parametrize(
    ("hints", "values", "expected"),
    [
        ({"dataset_type": "instruct", "data_style": "alpaca"}, {}, ("instruct", "alpaca", {})),
        (
            {"dataset_type": "chat", "data_style": "sharegpt", "conversation_column": "conversations"},
            {},
            ("chat", "sharegpt", {"messages": "conversations"}),
        ),
        (
            {"dataset_type": "text", "data_style": "text", "text_column": "body"},
            {},
            ("text", "text", {"text": "body"}),
        ),
        (  # what the user sets wins over what dataset-initialize found
            {"dataset_type": "chat", "data_style": "openai", "conversation_column": "messages"},
            {"column_map": {"messages": "dialog"}, "conversation_style": "sharegpt"},
            ("chat", "sharegpt", {"messages": "dialog"}),
        ),
    ],
)
def test_the_rows_are_read_as_dataset_initialize_wrote_them(hints, values, expected):
    settings = plan.sft_settings(values, **WHERE, data_hints=hints)
    assert (settings.dataset_type, settings.data_style, settings.column_map) == expected


def test_alpaca_and_sharegpt_rows_become_the_prompts_dataset_initialize_would_write(tmp_path):
    pytest.importorskip("trl")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kfp_finetune.components._shared.transformers.rows import load_rows

    alpaca = tmp_path / "alpaca.parquet"
    pq.write_table(
        pa.table({"instruction": ["Reverse it.", "Say hi."], "input": ["abc", " "], "output": ["cba", "hi"]}),
        alpaca,
    )
    settings = plan.sft_settings({}, **{**WHERE, "data_files": [str(alpaca)], "run_dir": str(tmp_path / "a")},
                                 data_hints={"dataset_type": "instruct", "data_style": "alpaca"})  # fmt: skip
    rows = load_rows(settings, has_chat_template=True)
    assert [r["prompt"][0]["content"] for r in rows] == ["Reverse it.\n\nabc", "Say hi."]
    sharegpt = tmp_path / "sharegpt.parquet"
    turns = [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]
    pq.write_table(pa.table({"conversations": [turns]}), sharegpt)
    hints = {"dataset_type": "chat", "data_style": "sharegpt", "conversation_column": "conversations"}
    settings = plan.sft_settings({}, **{**WHERE, "data_files": [str(sharegpt)], "run_dir": str(tmp_path / "s")},
                                 data_hints=hints)  # fmt: skip
    assert load_rows(settings, has_chat_template=True)[0]["messages"] == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"recipe": "lora_finetune_single_device"}, "tune_recipe is a torchtune setting"),
        ({"overrides": {"clip_grad_norm": 1.0}}, "tune_overrides is a torchtune setting"),
        ({"compile": True, "train_on_input": True}, r"tune_compile is .* \(nor tune_train_on_input\)"),
    ],
)
def test_a_setting_only_torchtune_reads_is_refused_by_its_pipeline_name(values, named):
    with pytest.raises(SettingError, match=f"^{named}.*: unset it, or set tune_engine=torchtune"):
        plan.check_settings(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lora_rank": 0}, "tune_lora_rank must be a whole number of at least 1"),
        ({"num_warmup_steps": -1}, "tune_num_warmup_steps must be a whole number, 0 or more"),
        ({"method": "lorra"}, "tune_method must be one of lora, qlora, dora, full .* did you mean 'lora'"),
        ({"device": "tpu"}, "tune_device must be one of auto, cpu, cuda"),
        ({"dtype": "fp16"}, "tune_dtype must be bf16 or fp32"),
    ],
)
def test_a_bad_value_is_refused_by_its_pipeline_name(values, message):
    with pytest.raises(SettingError, match=f"^{message}") as refused:
        plan.check_settings(values)
    assert message.startswith(refused.value.setting)  # pre-flight names the parameter from it


def test_the_plan_writes_the_settings_its_command_reads(tmp_path):
    run = plan.plan_run({"lora_rank": 4}, **{**WHERE, "run_dir": tmp_path / "run"}, devices=2, nodes=2)
    assert SftSettings.from_json(run.settings_path) == run.settings
    assert run.settings.lora_rank == 4
    assert (run.world, run.distributed, run.metrics_path) == (
        4,
        True,
        tmp_path / "run" / run_layout.METRICS_FILE,
    )
    assert run.command(["--nproc_per_node", "2"]) == [
        "torchrun", "--nproc_per_node", "2", "-m", plan.MODULE, str(run.settings_path),
    ]  # fmt: skip
    assert run.command() == ["python", "-m", plan.MODULE, str(run.settings_path)]


def test_cuda_asked_for_where_there_is_none_is_refused_before_training(tmp_path):
    pytest.importorskip("trl")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = plan.plan_run({"device": "cuda"}, **{**WHERE, "run_dir": tmp_path})
    with pytest.raises(SettingError, match="device is cuda, but CUDA sees no GPU"):
        run.settings.trl_config(run.world)


@pytest.mark.slow
def test_the_planned_command_trains_the_tiny_moe(tmp_path, monkeypatch):
    pytest.importorskip("trl")
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    build_tiny_hf_model(tmp_path / "base", "qwen3_moe")
    build_tiny_dataset(tmp_path / "data", train_rows=32, eval_rows=1)
    run = plan.plan_run(
        {
            "max_steps_per_epoch": 3,
            "batch_size": 4,
            "max_seq_len": 64,
            "learning_rate": 1e-3,
            "device": "cpu",
        },
        model_dir=tmp_path / "base",
        data_files=[str(tmp_path / "data" / "train.parquet")],
        run_dir=tmp_path / "run",
    )
    node.check_node_command(run.command(), local=True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    command = run.command()
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    resolved = json.loads((run.run_dir / run_layout.RESOLVED_CONFIG).read_text())
    assert resolved["settings"]["max_steps_per_epoch"] == 3 and resolved["settings"]["device"] == "cpu"
    assert resolved["sft_config"]["max_steps"] == 3
    assert len(run.metrics_path.read_text().splitlines()) == 3
    assert run_layout.last_adapter_state(run.run_dir) is not None
    assert (run.run_dir / run_layout.MERGED_DIR / "config.json").is_file()


def test_a_micro_batch_chosen_on_a_gpu_keeps_the_run_floor(tmp_path, monkeypatch):
    """The plan counts the floor at fast.PLANNED_BATCH and leaves batch_size auto; the training process's GPU
    choice (32 rows of 512 tokens) would train 240 rows in 8 steps: it is lowered to 12 (20 steps), the reason in
    the run's choices; an unset learning rate follows a larger micro-batch. Where the plan lowered the micro-batch
    itself, it is the user's to keep."""
    pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kfp_finetune.components._shared.transformers import fast, run_length

    monkeypatch.setattr(
        fast.Hardware, "here", classmethod(lambda cls, device: fast.Hardware(True, 80 * fast.GIB))
    )
    monkeypatch.setattr(
        fast.ModelSize, "of", classmethod(lambda cls, folder: fast.ModelSize(10**9, 2048, 16, 32_000))
    )
    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"input": ["a question"] * 240, "output": ["an answer"] * 240}), data)
    where = {"model_dir": str(tmp_path), "data_files": [str(data)], "run_dir": str(tmp_path / "run")}
    settings = plan.sft_settings({"max_seq_len": 512}, **where, num_rows=240)
    assert settings.batch_size == "auto" and settings.planned == []  # 30 steps at the planned batch of 8
    fitted = run_length.fit_micro_batch(settings, world=1)
    assert fitted.batch_size == 12
    (choice,) = fitted.planned
    assert choice["reason"].startswith("32 x 512 tokens") and "lowered to 12" in choice["reason"]
    assert fitted.learning_rate == "auto" and fitted.rate() == 2e-4  # 12 rows: 1.5x the 8 the rate is for
    # Steps as set: no floor, so 32 rows, 4x: the default rate x sqrt(4), unless the user set one.
    grown = run_length.fit_micro_batch(replace(settings, max_steps=5), world=1)
    assert (grown.batch_size, grown.learning_rate) == (32, 4e-4)
    assert (
        grown.planned[-1]["setting"] == "learning_rate" and "square-root rule" in grown.planned[-1]["reason"]
    )
    own_rate = run_length.fit_micro_batch(replace(settings, max_steps=5, learning_rate=1e-4), world=1)
    assert (own_rate.batch_size, own_rate.learning_rate) == (32, 1e-4)
    small = plan.sft_settings({"max_seq_len": 512}, **where, num_rows=60)  # the plan lowered it to 3
    assert run_length.fit_micro_batch(small, world=1) is small


def test_the_run_length_floor_chooses_what_the_step_left_unset():
    """60 rows at the default batch of 8 are 8 optimizer steps: the micro-batch drops to 3 (20 steps), the reason in
    the settings; a batch size the user gave is kept and the epochs rise instead; settings that plan a short run
    are kept (with a warning in the log); too few rows are refused (run_length.py)."""
    settings = plan.sft_settings({}, **WHERE, num_rows=60)
    assert (settings.batch_size, settings.epochs) == (3, 1)
    (batch, steps) = settings.planned
    assert batch["setting"] == "batch_size" and "60 rows over batch 8 x accumulation 1" in batch["reason"]
    assert (steps["setting"], steps["value"]) == ("optimizer steps", 20)
    assert plan.sft_settings({}, **WHERE, num_rows=60, world=2).batch_size == 1  # 30 rows a process

    twelve = plan.sft_settings({}, **WHERE, num_rows=12)  # micro-batch 1 is 12 steps: two epochs make 24
    assert (twelve.batch_size, twelve.epochs) == (1, 2)
    own_batch = plan.sft_settings({"batch_size": 8}, **WHERE, num_rows=60)  # more epochs instead: 3 x 8 steps
    assert (own_batch.batch_size, own_batch.epochs, own_batch.planned[-1]["value"]) == (8, 3, 24)
    kept = plan.sft_settings({"batch_size": 8, "epochs": 1}, **WHERE, num_rows=60)  # a short run, as set
    assert (kept.batch_size, kept.epochs, kept.planned) == (8, 1, [])
    with pytest.raises(ConfigError, match="too little training data .* set tune_epochs, tune_batch_size"):
        plan.sft_settings({}, **WHERE, num_rows=5)
    assert plan.sft_settings({}, **WHERE).planned == []  # no row count: nothing planned


def test_an_unset_max_seq_len_is_left_to_the_training_process_and_a_set_one_within_the_positions_kept(
    tmp_path,
):
    """The training process chooses it from the rows' tokens (seq_len.py); a user's value within the model's
    positions (a scaled rotary length counts: Qwen2.5 with YaRN x4) is planned as given."""
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768, "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}))  # fmt: skip
    where = {**WHERE, "model_dir": str(tmp_path)}
    unset = plan.sft_settings({}, **where)
    assert unset.max_seq_len == "auto" and not [c for c in unset.planned if c["setting"] == "max_seq_len"]
    assert plan.sft_settings({"max_seq_len": 65536}, **where).max_seq_len == 65536


def test_a_max_seq_len_beyond_the_models_positions_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 4096}))
    with pytest.raises(
        SettingError, match="^tune_max_seq_len is 8192, more than the 4096 positions the model has"
    ):
        plan.sft_settings({"max_seq_len": 8192}, **{**WHERE, "model_dir": str(tmp_path)})
