"""evaluate as a KFP component after a real fine-tune, under kfp.local: initializers → torchtune-finetune
(local backend, CPU) → evaluate, with the gate's `passed` driving a `dsl.If` as an export step would."""

# No `from __future__ import annotations`: KFP reads the pipeline signature's annotations as types.

import json
import re
from pathlib import Path
from typing import NamedTuple

import pytest
from kfp import dsl, local
from kfp.dsl import HTML, Dataset, Input, Metrics

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.evaluate.component import evaluate
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune
from kfp_finetune.tiny.dataset import PROMPT_PREFIX

pytestmark = pytest.mark.slow


class Outputs(NamedTuple):
    metrics: Metrics
    report: HTML
    samples: Dataset
    passed: bool
    workspace_check: str


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
def gate(passed: bool) -> bool:
    """kfp.local (2.17) resolves a `dsl.If` on a task's single `Output` but not on a named output such as
    evaluate's `passed` (it reads `<task>-passed` as a pipeline input), so the condition reads this copy."""
    return passed


@dsl.component(install_kfp_package=False)
def mark_export(marker_path: str):
    """Stands in for export: records that the gate let the pipeline through."""
    with open(marker_path, "w") as f:
        f.write("exported")


@dsl.pipeline(
    name="evaluate-test", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi"))
)
def evaluate_pipeline(model_uri: str, data_uri: str, marker_path: str, min_improvement: float) -> Outputs:
    model_task = model_initialize(
        source_uri=model_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="base"
    )
    data_task = dataset_initialize(
        source_uri=data_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="tiny", eval_fraction=0.05
    )
    tune = torchtune_finetune(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        train_data=data_task.outputs["train"],
        eval_data=data_task.outputs["eval"],
        base_model=model_task.outputs["model"],
        backend="local",
        device="cpu",
        method="full",
        batch_size=16,
        gradient_accumulation_steps=1,
        max_steps_per_epoch=100,  # enough to cut the loss by far more than the gate's min_improvement
        learning_rate=3e-3,
        num_warmup_steps=0,
        seed=0,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    check = evaluate(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=tune.outputs["model"],
        base_model=model_task.outputs["model"],
        eval_data=data_task.outputs["eval"],
        max_samples=40,
        batch_size=20,
        max_new_tokens=12,
        device="cpu",
        gate_metric="eval_loss",
        min_improvement=min_improvement,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    )
    folder = read_eval_folder(workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, samples=check.outputs["samples"])
    verdict = gate(passed=check.outputs["passed"])
    with dsl.If(verdict.output == True):  # noqa: E712 - a KFP condition, not a Python comparison
        mark_export(marker_path=marker_path)
    return Outputs(
        metrics=check.outputs["metrics"],
        report=check.outputs["report"],
        samples=check.outputs["samples"],
        passed=check.outputs["passed"],
        workspace_check=folder.output,
    )


def test_evaluate_after_finetune_in_a_local_pipeline(tiny_llama, tiny_dataset, tmp_path):
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "pipeline_root"),
        workspace_root=str(tmp_path / "workspace"),
    )
    marker = tmp_path / "exported.txt"
    task = evaluate_pipeline(
        model_uri=str(tiny_llama),
        data_uri=str(tiny_dataset["train.jsonl"]),
        marker_path=str(marker),
        min_improvement=1.0,
    )

    values = task.outputs["metrics"].metadata
    assert values["num_samples"] == 40
    assert values["tuned_eval_loss"] < values["base_eval_loss"] - 1.0
    assert values["delta_eval_loss"] < -1.0 and values["gate_improvement"] > 1.0
    assert task.outputs["passed"] is True and values["passed"] == 1.0
    assert marker.read_text() == "exported"  # the dsl.If branch ran

    samples = task.outputs["samples"]
    assert re.fullmatch(r"eval/[a-z0-9-]+/samples.jsonl", samples.metadata["workspace_path"])
    rows = [json.loads(line) for line in Path(samples.path).read_text().splitlines()]
    assert len(rows) == 40 and samples.metadata["num_rows"] == 40
    assert all(r["prompt"].startswith(PROMPT_PREFIX) and "tuned" in r and "base" in r for r in rows)
    folder = json.loads(task.outputs["workspace_check"])
    assert folder == {"files": ["metrics.json", "report.html", "samples.jsonl"], "rows": 40}

    html = Path(task.outputs["report"].path).read_text()
    assert f"{values['tuned_eval_loss']:.4g}" in html and f"{values['base_eval_loss']:.4g}" in html
    assert "training loss" in html and "PASSED" in html
