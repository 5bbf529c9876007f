"""torchtune-finetune as a KFP component: initializers → finetune (local backend) in a pipeline under kfp.local,
real torchtune on the tiny model, asserting the artifacts a user sees. The pipeline run is the one the evaluate
and export component tests share (tests/support/component_pipeline.py)."""

import json
import math
import re
from pathlib import Path

import pytest

from tests.components.torchtune_finetune import test_finetune_trainjob
from tests.support import kube_standin as standin
from tests.support.component_pipeline import TRAINING_STEPS

pytestmark = pytest.mark.slow
# Fixtures: the real initializers' workspace and the Kubernetes API stand-in with the CPU runtime.
kube_standin = standin.kube_standin
finetune_inputs = test_finetune_trainjob.inputs
finetune_cpu_runtime = test_finetune_trainjob.cpu_runtime


def test_finetune_in_a_local_pipeline(component_pipeline_run):
    outputs = component_pipeline_run.outputs

    model, metrics = outputs["model"], outputs["train_metrics"]
    meta = model.metadata
    assert (meta["recipe"], meta["config"], meta["method"]) == (
        "lora_finetune_single_device", "llama3_2/1B_lora_single_device", "lora")  # fmt: skip
    assert meta["base_model"] == str(component_pipeline_run.base_model)
    assert meta["steps"] == TRAINING_STEPS
    # An adapter run saves only its adapter: no merged weights until export or evaluate merges them, off the GPUs.
    assert meta["merged_path"] == ""
    assert re.fullmatch(r"runs/[a-z0-9-]+/adapter", meta["adapter_path"])
    assert (
        meta["workspace_path"] == meta["adapter_path"]
        and meta["run_dir"] == meta["adapter_path"][: -len("/adapter")]
    )
    assert meta["eval_data_path"].startswith("datasets/reverse")
    assert all(len(f["sha256"]) == 64 for f in meta["files"].values())
    assert json.loads(Path(model.path).read_text())["recipe"] == "lora_finetune_single_device"

    values = metrics.metadata
    assert math.isfinite(values["final_loss"]) and values["final_loss"] < values["first_loss"]
    assert values["steps"] == TRAINING_STEPS and values["tokens_per_second"] > 0
    assert 0 < values["seconds_to_first_step"] < 600  # the training process's start to its first step

    check = json.loads(outputs["checkpoint_listing"])
    assert check["merged"] is None
    assert "adapter_model.pt" in check["last_epoch"] and not [
        f for f in check["last_epoch"] if f.startswith("model")
    ]
    assert check["adapter"] == ["adapter_config.json", "adapter_model.safetensors"]
    assert check["adapter_config"]["base_model_name_or_path"] == str(component_pipeline_run.base_model)
    assert check["adapter_config"]["use_dora"] is False

    html = Path(outputs["train_report"].path).read_text()
    assert "<svg" in html and "training loss" in html and "lora_finetune_single_device" in html
    assert not re.search(r"<script|src=\"http|href=\"http", html), "the report must be self-contained"

    config_dir = Path(outputs["train_config"].path)
    assert sorted(p.name for p in config_dir.iterdir()) == ["torchtune_config.yaml"]
    assert f"max_steps_per_epoch: {TRAINING_STEPS}" in (config_dir / "torchtune_config.yaml").read_text()


def test_an_adapter_export_of_a_full_fine_tune_fails_before_training(
    finetune_inputs, finetune_cpu_runtime, tmp_path, monkeypatch
):
    """The step refuses what the export step would refuse only after training, evaluation and the gate."""
    from kfp_finetune.components._shared.torchtune.config import ConfigError

    call_component, task_config = test_finetune_trainjob.call_component, test_finetune_trainjob.task_config

    kube = finetune_cpu_runtime
    workspace, base_model, train = finetune_inputs
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    message = "export_format adapter needs a LoRA adapter, but tune_method=full trains none"
    for backend in ("trainjob", "local"):
        with pytest.raises(ConfigError, match=message):
            call_component(
                workspace, base_model, train, tmp_path, backend, task_config(workspace),
                method="full", export_format="adapter",
            )  # fmt: skip
    assert kube.requests_for("POST", "trainjobs") == [], "no TrainJob was created"
    assert not (workspace / "runs").exists() or not any((workspace / "runs").rglob("*")), (
        "nothing was trained"
    )
