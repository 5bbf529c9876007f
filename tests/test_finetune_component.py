"""torchtune-finetune as a KFP component: initializers → finetune (local backend) in a pipeline under kfp.local,
real torchtune on the tiny model, asserting the artifacts a user sees."""

# No `from __future__ import annotations`: KFP reads the pipeline signature's annotations as types.

import json
import math
import re
from pathlib import Path
from typing import NamedTuple

import pytest
from kfp import dsl, local
from kfp.dsl import HTML, Artifact, Input, Metrics, Model

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune

pytestmark = pytest.mark.slow


class Outputs(NamedTuple):
    model: Model
    metrics: Metrics
    report: HTML
    train_config: Artifact
    workspace_check: str


@dsl.component(install_kfp_package=False)
def inspect_checkpoint(workspace_path: str, model: Input[Model]) -> str:
    """Runs inside the pipeline: kfp.local deletes the workspace when the run ends."""
    import json
    import os

    def listing(rel: str) -> list:
        root = os.path.join(workspace_path, rel)
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)

    adapter = os.path.join(workspace_path, model.metadata["adapter_path"], "adapter_config.json")
    return json.dumps(
        {
            "merged": listing(model.metadata["merged_path"]),
            "adapter": listing(model.metadata["adapter_path"]),
            "adapter_config": json.load(open(adapter)),
        }
    )


@dsl.pipeline(
    name="finetune-test", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi"))
)
def finetune_pipeline(model_uri: str, data_uri: str, method: str = "lora") -> Outputs:
    model_task = model_initialize(
        source_uri=model_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="base"
    )
    data_task = dataset_initialize(
        source_uri=data_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="reverse", eval_fraction=0.1
    )
    tune = torchtune_finetune(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        train_data=data_task.outputs["train"],
        eval_data=data_task.outputs["eval"],
        base_model=model_task.outputs["model"],
        method=method,
        backend="local",
        device="cpu",
        batch_size=8,
        gradient_accumulation_steps=1,
        max_steps_per_epoch=30,
        learning_rate=3e-3,
        num_warmup_steps=0,
        seed=0,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    check = inspect_checkpoint(workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, model=tune.outputs["model"])
    return Outputs(
        model=tune.outputs["model"],
        metrics=tune.outputs["metrics"],
        report=tune.outputs["report"],
        train_config=tune.outputs["train_config"],
        workspace_check=check.output,
    )


def test_finetune_in_a_local_pipeline(tiny_llama, tiny_dataset, tmp_path):
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "pipeline_root"),
        workspace_root=str(tmp_path / "workspace"),
    )
    task = finetune_pipeline(model_uri=str(tiny_llama), data_uri=str(tiny_dataset["train.jsonl"]))

    model, metrics = task.outputs["model"], task.outputs["metrics"]
    meta = model.metadata
    assert (meta["recipe"], meta["config"], meta["method"]) == (
        "lora_finetune_single_device", "llama3_2/1B_lora_single_device", "lora")  # fmt: skip
    assert meta["base_model"] == str(tiny_llama)
    assert meta["steps"] == 30
    assert re.fullmatch(r"runs/[a-z0-9-]+/merged", meta["merged_path"])
    assert meta["adapter_path"] == meta["merged_path"].replace("merged", "adapter")
    assert meta["eval_data_path"].startswith("datasets/reverse")
    assert all(len(f["sha256"]) == 64 for f in meta["files"].values())
    assert json.loads(Path(model.path).read_text())["recipe"] == "lora_finetune_single_device"

    values = metrics.metadata
    assert math.isfinite(values["final_loss"]) and values["final_loss"] < values["first_loss"]
    assert values["steps"] == 30 and values["tokens_per_second"] > 0

    check = json.loads(task.outputs["workspace_check"])
    assert "model-00001-of-00001.safetensors" in check["merged"] and "config.json" in check["merged"]
    assert not {"adapter_config.json", "adapter_model.safetensors", "adapter_model.pt"} & set(check["merged"])
    assert check["adapter"] == ["adapter_config.json", "adapter_model.safetensors"]
    assert check["adapter_config"]["base_model_name_or_path"] == str(tiny_llama)
    assert check["adapter_config"]["use_dora"] is False

    html = Path(task.outputs["report"].path).read_text()
    assert "<svg" in html and "training loss" in html and "lora_finetune_single_device" in html
    assert not re.search(r"<script|src=\"http|href=\"http", html), "the report must be self-contained"

    config_dir = Path(task.outputs["train_config"].path)
    assert sorted(p.name for p in config_dir.iterdir()) == ["torchtune_config.yaml"]
    assert "max_steps_per_epoch: 30" in (config_dir / "torchtune_config.yaml").read_text()
