"""The components' test DAG: initialize → torchtune-finetune (LoRA, local backend, CPU) → evaluate and export,
plus steps that look into the workspace, run under kfp.local on the tiny model.

The tests of torchtune-finetune, evaluate and export as KFP components each check their own step's outputs
of one shared run (the `component_pipeline_run` session fixture in tests/conftest.py), so the tiny model is
fine-tuned once for all of them instead of once per test, and once for all test workers (`shared_run`) instead of
once per worker.
"""

# No `from __future__ import annotations`: KFP reads the pipeline signature's annotations as types.

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kfp import dsl, local
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.evaluate.component import evaluate
from kfp_finetune.components.export.component import export
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.quality_gate.component import quality_gate
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune

PIPELINE_NAME = "components-test"
TRAINING_STEPS = 30
EVAL_SAMPLES = 40
# The gate's required eval-loss gain: 30 LoRA steps cut the loss by well over this on the tiny task.
MIN_IMPROVEMENT = 1.0


class Outputs(NamedTuple):
    base_model: Model
    train_data: Dataset
    eval_data: Dataset
    model: Model
    train_metrics: Metrics
    train_report: HTML
    train_config: Artifact
    checkpoint_listing: str
    eval_metrics: Metrics
    eval_report: HTML
    eval_samples: Dataset
    passed: bool
    eval_folder_listing: str
    exported: Model


@dsl.component(install_kfp_package=False)
def inspect_checkpoint(workspace_path: str, model: Input[Model]) -> str:
    """Runs inside the pipeline: kfp.local deletes the workspace when the run ends."""
    import json
    import os

    def listing(rel: str) -> list:
        root = os.path.join(workspace_path, rel)
        return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)

    adapter = os.path.join(workspace_path, model.metadata["adapter_path"], "adapter_config.json")
    merged = model.metadata["merged_path"]
    return json.dumps(
        {
            "merged": listing(merged) if merged else None,
            "last_epoch": listing(os.path.join(model.metadata["run_dir"], "epoch_0")),
            "adapter": listing(model.metadata["adapter_path"]),
            "adapter_config": json.load(open(adapter)),
        }
    )


@dsl.component(install_kfp_package=False)
def read_eval_folder(workspace_path: str, samples: Input[Dataset]) -> str:
    """Runs inside the pipeline: kfp.local deletes the workspace when the run ends."""
    import json
    import os

    folder = os.path.dirname(os.path.join(workspace_path, samples.metadata["workspace_path"]))
    with open(os.path.join(folder, "samples.jsonl")) as f:
        rows = sum(1 for _ in f)
    return json.dumps({"files": sorted(os.listdir(folder)), "rows": rows})


@dsl.component(install_kfp_package=False)
def mark_gate_passed(marker_path: str):
    """Records that the quality gate's `dsl.If` branch ran."""
    with open(marker_path, "w") as f:
        f.write("passed")


@dsl.pipeline(
    name=PIPELINE_NAME, pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi"))
)
def component_pipeline(model_uri: str, data_uri: str, export_destination: str, gate_marker: str) -> Outputs:
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
        method="lora",
        backend="local",
        device="cpu",
        batch_size=8,
        gradient_accumulation_steps=1,
        max_steps_per_epoch=TRAINING_STEPS,
        learning_rate=3e-3,
        num_warmup_steps=0,
        seed=0,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    checkpoint = inspect_checkpoint(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, model=tune.outputs["model"]
    )
    evaluation = evaluate(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=tune.outputs["model"],
        base_model=model_task.outputs["model"],
        eval_data=data_task.outputs["eval"],
        max_samples=EVAL_SAMPLES,
        batch_size=20,
        max_new_tokens=12,
        device="cpu",
        gate_metric="eval_loss",
        min_improvement=MIN_IMPROVEMENT,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    verdict = quality_gate(passed=evaluation.outputs["passed"], gate_metric="eval_loss")
    with dsl.If(verdict.output == True):  # noqa: E712 - a KFP condition, not a Python comparison
        mark_gate_passed(marker_path=gate_marker)
    eval_folder = read_eval_folder(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, samples=evaluation.outputs["samples"]
    )
    exported = export(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=tune.outputs["model"],
        metrics=tune.outputs["metrics"],
        destination=export_destination,
        format="both",
        dtype="bf16",
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    return Outputs(
        base_model=model_task.outputs["model"],
        train_data=data_task.outputs["train"],
        eval_data=data_task.outputs["eval"],
        model=tune.outputs["model"],
        train_metrics=tune.outputs["metrics"],
        train_report=tune.outputs["report"],
        train_config=tune.outputs["train_config"],
        checkpoint_listing=checkpoint.output,
        eval_metrics=evaluation.outputs["metrics"],
        eval_report=evaluation.outputs["report"],
        eval_samples=evaluation.outputs["samples"],
        passed=evaluation.outputs["passed"],
        eval_folder_listing=eval_folder.output,
        exported=exported.outputs["exported"],
    )


@dataclass(frozen=True)
class ComponentPipelineRun:
    base_model: Path  # the tiny model the run fine-tuned
    outputs: dict  # the pipeline's outputs by name (see Outputs)
    export_destination: Path
    gate_marker: Path  # written by a step inside `dsl.If(quality gate passed)`


def run_component_pipeline(model_dir: Path, train_data: Path, root: Path) -> ComponentPipelineRun:
    """Runs the DAG on `model_dir` and `train_data` with everything it writes under `root`."""
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root / "pipeline_root"),
        workspace_root=str(root / "workspace"),
    )
    destination = root / "pvc" / "models" / "tiny-tuned"
    marker = root / "gate-passed.txt"
    task = component_pipeline(
        model_uri=str(model_dir),
        data_uri=str(train_data),
        export_destination=str(destination),
        gate_marker=str(marker),
    )
    return ComponentPipelineRun(
        base_model=model_dir, outputs=task.outputs, export_destination=destination, gate_marker=marker
    )


def shared_run(root: Path) -> ComponentPipelineRun:
    """run_component_pipeline on its own tiny model and data under `root`, a folder every test worker of the session
    sees: the first worker to ask runs it while holding a lock, the others wait for it and read its outputs."""
    from filelock import FileLock

    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.model import build_tiny_model

    result = root / "run.pickle"
    with FileLock(f"{root}.lock"):
        if not result.exists():
            model = build_tiny_model(root / "tiny-llama3_2", family="llama3_2")
            data = build_tiny_dataset(root / "data")
            run = run_component_pipeline(model, data["train.jsonl"], root / "run")
            partial = result.with_suffix(".partial")
            partial.write_bytes(pickle.dumps(run))
            partial.rename(result)
    return pickle.loads(result.read_bytes())
