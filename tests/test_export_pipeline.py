"""export as a KFP component: initializers → torchtune-finetune (local backend, a few CPU steps) → export to a
local folder, in a pipeline under kfp.local; asserts the output artifact and what landed at the destination."""

# No `from __future__ import annotations`: KFP reads the pipeline signature's annotations as types.

import json
from pathlib import Path

import pytest
from kfp import dsl, local

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.export.component import export
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune

pytestmark = pytest.mark.slow


@dsl.pipeline(
    name="export-test", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi"))
)
def export_pipeline(model_uri: str, data_uri: str, destination: str) -> dsl.Model:
    model_task = model_initialize(
        source_uri=model_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="base"
    )
    data_task = dataset_initialize(
        source_uri=data_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="reverse", eval_fraction=0.1
    )
    tune = torchtune_finetune(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        train_data=data_task.outputs["train"],
        base_model=model_task.outputs["model"],
        method="lora",
        backend="local",
        device="cpu",
        batch_size=2,
        gradient_accumulation_steps=1,
        max_steps_per_epoch=2,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    exported = export(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=tune.outputs["model"],
        metrics=tune.outputs["metrics"],
        destination=destination,
        format="both",
        dtype="bf16",
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    return exported.outputs["exported"]


def test_export_in_a_local_pipeline(tiny_llama, tiny_dataset, tmp_path):
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "pipeline_root"),
        workspace_root=str(tmp_path / "workspace"),
    )
    destination = tmp_path / "pvc" / "models" / "tiny-tuned"
    task = export_pipeline(
        model_uri=str(tiny_llama), data_uri=str(tiny_dataset["train.jsonl"]), destination=str(destination)
    )

    artifact = task.output
    assert artifact.uri == str(destination)
    meta = artifact.metadata
    assert (meta["format"], meta["dtype"], meta["state"], meta["method"]) == (
        "both",
        "bfloat16",
        "created",
        "lora",
    )
    assert meta["base_model"] == str(tiny_llama)
    assert meta["metrics"]["final_loss"] > 0 and "tokens_per_second" in meta["metrics"]
    files = sorted(p.relative_to(destination).as_posix() for p in destination.rglob("*") if p.is_file())
    assert files == sorted(meta["files"])
    assert {"README.md", "checksums.sha256", "config.json", "adapter/adapter_config.json"} <= set(files)
    assert json.loads((destination / "config.json").read_text())["torch_dtype"] == "bfloat16"
    card = (destination / "README.md").read_text()
    assert "export-test" in card  # the pipeline run's name, filled in by KFP
    assert "| LoRA rank |" in card and "| tokens_per_second |" in card
    assert Path(destination / "checksums.sha256").read_text().count("\n") == len(files) - 1
