"""The fine-tune step trains a model torchtune cannot serve on the engine that can (issue 28 item 2): the step's own
entry point (run_finetune, local backend) on dataset-initialize's output and a tiny Qwen3-MoE, with no engine named.
The run is planned and checked by the engine's wing before anything trains, hands on merged/ and adapter/, records
the engine, and is refused by name when a setting only torchtune reads is set or torchtune is forced on it."""

from __future__ import annotations

import json
import os

import pytest

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.torchtune_finetune.backends import backend_for
from kfp_finetune.components.torchtune_finetune.finetune import (
    ArtifactInput,
    component_settings,
    run_finetune,
)
from kfp_finetune.components.torchtune_finetune.weights import is_zero, tensors

pytest.importorskip("trl")
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    root = tmp_path_factory.mktemp("planned")
    workspace = root / "ws"
    build_tiny_hf_model(workspace / "models" / "moe", "qwen3_moe")
    rows = [
        {"instruction": f"Write the number {i} backwards.", "input": "", "output": str(i)[::-1] + "."}
        for i in range(100, 160)
    ]
    (root / "alpaca.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = initialize_dataset(str(root / "alpaca.jsonl"), str(workspace), eval_fraction=0.05)
    return workspace, result.train_metadata


def finetune(workspace, task, **parameters):
    root, train = workspace
    return run_finetune(
        workspace=root, train_data=ArtifactInput(dict(train)),
        base_model=ArtifactInput({"workspace_path": "models/moe"}),
        settings=component_settings({"device": "cpu", "max_steps_per_epoch": 4, "batch_size": 4,
                                     "max_seq_len": 64, "learning_rate": 1e-3, **parameters}),
        run_id="planned", task_name=task, backend=backend_for("local"),
        engine=parameters.pop("engine", engines.AUTO),
    )  # fmt: skip


def test_a_model_torchtune_cannot_serve_trains_on_the_engine_that_can(workspace, caplog):
    result = finetune(workspace, "auto-lora")
    meta = result.model_metadata
    assert meta["engine"] == "transformers" and meta["method"] == "lora" and meta["steps"] == 4
    assert meta["merged_path"].endswith("/merged") and meta["adapter_path"].endswith("/adapter")
    assert any(name.endswith("adapter_model.safetensors") for name in meta["files"])
    lora_b = [t for name, t in tensors(result.checkpoint.adapter_dir) if "lora_b" in name.lower()]
    assert lora_b and not any(is_zero(t) for t in lora_b)  # the adapter learned something
    assert {"sft_settings.json", "trl_config.json"} <= set(result.config_files)
    assert result.train_config["files"] == sorted(result.config_files)
    assert "engine: transformers (transformers" in caplog.text  # the choice and its reason, in the step log
    assert "engine: transformers" in result.report_html


@pytest.mark.filterwarnings("ignore:Unsupported layer type")  # PEFT's word for a 3D-parameter target
def test_the_experts_named_in_lora_target_parameters_are_adapted_through_the_step(workspace, caplog):
    """The step's lora_target_parameters reaches PEFT: the merged model's expert weights are no longer the base's,
    and the step log no longer says they stay the base's."""
    root, _ = workspace
    experts = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
    meta = finetune(workspace, "experts", lora_target_parameters=experts).model_metadata
    base, merged = dict(tensors(root / "models" / "moe")), dict(tensors(root / meta["merged_path"]))
    changed = {name for name in base if base[name].read() != merged[name].read()}
    assert {name for name in changed if ".experts." in name}, sorted(changed)
    assert "so they stay the base's" not in caplog.text


def test_a_full_fine_tune_hands_on_the_merged_folder_alone(workspace):
    meta = finetune(workspace, "auto-full", method="full").model_metadata
    assert meta["engine"] == "transformers" and meta["adapter_path"] == ""
    assert meta["workspace_path"] == meta["merged_path"]


def test_a_setting_only_torchtune_reads_is_refused_before_anything_trains(workspace):
    root, _ = workspace
    with pytest.raises(ConfigError, match="^tune_overrides is a torchtune setting"):
        finetune(workspace, "refused", overrides={"clip_grad_norm": 1.0})
    assert not list(root.glob("runs/*refused*/logs"))


def test_torchtune_forced_on_a_model_it_cannot_serve_is_refused_with_its_reason(workspace):
    with pytest.raises(ConfigError, match="no engine can fine-tune this model. torchtune: .*qwen3_moe"):
        finetune(workspace, "forced", engine="torchtune")


def test_a_retried_local_step_resumes_from_the_checkpoint_its_earlier_attempt_saved(workspace, caplog):
    """The earlier attempt's training is stopped by SIGTERM after its checkpoint (a KFP retry of a step whose
    process was killed); the retried step finds the checkpoint through the engine's face, trains only what was
    left, and its losses are an uninterrupted run's."""
    import signal
    import subprocess
    import sys

    from kfp_finetune.components._shared.metrics_file import read_resume_points
    from kfp_finetune.components._shared.transformers import face
    from kfp_finetune.components._shared.workspace import area_dir
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name

    root, train = workspace
    steps = {"max_steps_per_epoch": 8, "checkpoint_every_steps": 2}
    uninterrupted = finetune(workspace, "straight", **steps)
    straight = [round(s.loss, 4) for s in uninterrupted.steps]

    run_dir = area_dir(root, "runs", trainjob_name("planned", "retried", ""))
    plan = face.plan_run(
        component_settings({"device": "cpu", "batch_size": 4, "max_seq_len": 64, "learning_rate": 1e-3, **steps}),
        model_dir=root / "models" / "moe", data_files=[str(root / f) for f in train["data_files"]],
        run_dir=run_dir, data_hints={k: v for k, v in train.items() if k in ("dataset_type", "data_style")},
    )  # fmt: skip
    first = subprocess.Popen([sys.executable, *plan.command()[1:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    for line in first.stdout:  # synchronised on the run's own output: step 3 logged, then the signal
        if line.startswith("Step 3 |"):
            first.send_signal(signal.SIGTERM)
            break
    rest = first.stdout.read()
    assert first.wait(timeout=600) == 143, rest[-2000:]
    saved = face.resume_point(run_dir)
    assert saved is not None and saved.startswith("checkpoint-")

    retried = finetune(workspace, "retried", **steps)
    assert (
        f"an earlier attempt of this task left a checkpoint at {saved}: training resumes from it"
        in caplog.text
    )
    assert [round(s.loss, 4) for s in retried.steps] == straight and len(straight) == 8
    at = int(saved.split()[0].removeprefix("checkpoint-"))  # "checkpoint-N in <folder>"
    assert read_resume_points(retried.run.metrics_path) == [at]
    assert retried.metrics["resumes"] == 1.0
    assert f"Training was interrupted and continued from step {at}." in retried.report_html
    assert "resumes" not in uninterrupted.metrics and "interrupted" not in uninterrupted.report_html
    assert face.resume_point(run_dir) is None, "the checkpoints are removed once the run is complete"


def test_data_too_small_for_a_run_that_learns_is_refused_before_anything_trains(workspace, tmp_path):
    """Five rows with every run-length setting left unset: even micro-batch 1 and three epochs plan 15 optimizer
    steps, under the floor both engines keep (run_floor.MIN_OPTIMIZER_STEPS): refused, naming the settings that
    accept a short run, before the training process starts."""
    root, _ = workspace
    rows = [{"instruction": f"Say {i}.", "input": "", "output": f"{i}."} for i in range(5)]
    (tmp_path / "five.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    five = initialize_dataset(str(tmp_path / "five.jsonl"), str(root), name="five", eval_fraction=0.0)
    assert five.train_metadata["num_rows"] == 5
    with pytest.raises(
        ConfigError, match="too little training data for a run that learns: 5 rows over batch 1 "
    ):
        run_finetune(
            workspace=root, train_data=ArtifactInput(dict(five.train_metadata)),
            base_model=ArtifactInput({"workspace_path": "models/moe"}), settings=component_settings({"device": "cpu"}),
            run_id="planned", task_name="five", backend=backend_for("local"),
        )  # fmt: skip
    assert not list(root.glob("runs/*five*/logs"))
