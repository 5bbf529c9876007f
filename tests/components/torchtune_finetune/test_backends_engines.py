"""The backends launch any engine's plan (backends.LaunchPlan): the local backend trains the transformers engine's
plan for real, with progress lines from its metric lines; the TrainJob backend sends it behind the node
entrypoint's `--engine`, on the engine's runtime."""

from __future__ import annotations

import sys

import pytest

from kfp_finetune.components._shared.metrics_file import read_metrics_file
from kfp_finetune.components._shared.transformers import plan, run_layout
from kfp_finetune.components.torchtune_finetune.backends.local import LocalBackend, resolve_executable
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.entrypoint import node_command

WHERE = {"model_dir": "/nowhere/model", "data_files": ["/nowhere/train.parquet"]}


def test_python_and_torchrun_run_from_this_interpreters_environment():
    assert resolve_executable(["python", "-m", "x"]) == [sys.executable, "-m", "x"]
    assert resolve_executable(["torchrun", "--nproc_per_node", "2", "-m", "x"]) == [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "x",
    ]  # fmt: skip


def test_a_trainjob_names_the_engine_for_its_node_pods_and_runs_on_the_engines_runtime(tmp_path):
    """The transformers engine's run: its command behind `--engine transformers`, on the runtime `transformers`
    when none is named (auto); a runtime that is named is kept."""
    (tmp_path / "data.jsonl").write_text("")
    sft = plan.plan_run({}, model_dir=tmp_path, data_files=[str(tmp_path / "data.jsonl")], run_dir=tmp_path / "run",
                    devices=2)  # fmt: skip
    backend = TrainJobBackend(pod=tj.NodePodSettings(), devices=2, run_id="run-1", task_name="finetune")
    spec = backend.manifest(sft)["spec"]
    torchrun = tj.torchrun_args(backend.job_name)
    assert spec["runtimeRef"]["name"] == "transformers"
    assert spec["trainer"]["command"] == node_command(
        ["torchrun", *torchrun, "-m", plan.MODULE, str(tmp_path / "run" / "sft_settings.json")],
        "transformers",
    )
    assert spec["trainer"]["command"][3:5] == ["--engine", "transformers"]
    named = TrainJobBackend(pod=tj.NodePodSettings(), runtime="transformers-cpu", run_id="r", task_name="t")
    assert named.manifest(sft)["spec"]["runtimeRef"]["name"] == "transformers-cpu"


@pytest.mark.slow
def test_the_local_backend_trains_a_transformers_plan(tmp_path, monkeypatch, capsys):
    pytest.importorskip("trl")
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    build_tiny_hf_model(tmp_path / "base", "qwen3_moe")
    build_tiny_dataset(tmp_path / "data", train_rows=24, eval_rows=1)
    sft = plan.plan_run(
        {"max_steps_per_epoch": 2, "batch_size": 4, "max_seq_len": 64, "device": "cpu"},
        model_dir=tmp_path / "base",
        data_files=[str(tmp_path / "data" / "train.parquet")],
        run_dir=tmp_path / "run",
    )
    LocalBackend(devices=1).run(sft, total_steps=2)
    assert [s.step for s in read_metrics_file(sft.metrics_path)] == [1, 2]
    assert "step 2/2" in capsys.readouterr().out  # the progress clock read the engine's metric lines
    assert (sft.run_dir / run_layout.MERGED_DIR / "config.json").is_file()
