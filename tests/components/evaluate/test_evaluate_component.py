"""The evaluate component as KFP runs it (kfp.local): a "tuned" model that is the base's own weights — what a run
that trained nothing hands on — fails the quality gate, and its interval reaches the Metrics and the report."""

# No `from __future__ import annotations`: KFP reads the pipeline signature's annotations as types.

from pathlib import Path
from typing import NamedTuple

import pytest
from kfp import dsl
from kfp.dsl import HTML, Input, Metrics, Model, Output

from kfp_finetune.commands.run_local import run_pipeline_locally
from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.evaluate.component import evaluate
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.quality_gate.component import quality_gate
from kfp_finetune.pipelines import settings

EVAL_SAMPLES = 16


class Outputs(NamedTuple):
    metrics: Metrics
    report: HTML
    verdict: bool


@dsl.component(install_kfp_package=False)
def unchanged_tuned_model(base: Input[Model], tuned: Output[Model]):
    """A fine-tune's model output whose merged weights are the base's, unchanged."""
    folder = base.metadata["workspace_path"]
    tuned.metadata.update(workspace_path=folder, merged_path=folder, adapter_path="", base_model_path=folder)


@dsl.pipeline(name="unchanged-model-gate", pipeline_config=settings.pipeline_config())
def unchanged_model_gate(model_uri: str, data_uri: str) -> Outputs:
    base = model_initialize(source_uri=model_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="base")
    data = dataset_initialize(
        source_uri=data_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="data", eval_fraction=0.2
    )
    evaluation = evaluate(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=unchanged_tuned_model(base=base.outputs["model"]).outputs["tuned"],
        base_model=base.outputs["model"],
        eval_data=data.outputs["eval"],
        max_samples=EVAL_SAMPLES,
        batch_size=EVAL_SAMPLES,
        max_new_tokens=4,
        device="cpu",
        min_improvement=-1000.0,  # cannot open the gate: the evidence rule comes first
    )
    verdict = quality_gate(passed=evaluation.outputs["passed"], gate_metric="eval_loss")
    return Outputs(evaluation.outputs["metrics"], evaluation.outputs["report"], verdict.output)


@pytest.mark.slow
def test_an_unchanged_model_fails_the_gate_in_a_pipeline(tiny_llama, tiny_dataset, tmp_path):
    outputs = run_pipeline_locally(
        unchanged_model_gate,
        {"model_uri": str(tiny_llama), "data_uri": str(tiny_dataset["train.jsonl"])},
        tmp_path / "run",
    ).outputs
    assert outputs["verdict"] is False
    metrics = outputs["metrics"].metadata
    assert metrics["passed"] == 0.0 and metrics["delta_eval_loss"] == 0.0
    assert metrics["eval_loss_improvement_ci_low"] == metrics["eval_loss_improvement_ci_high"] == 0.0
    assert metrics["confidence"] == 0.95
    report = Path(outputs["report"].path).read_text()
    assert "FAILED" in report and "eval_loss did not improve: +0" in report
    assert f"95% CI [0, 0] ({EVAL_SAMPLES} examples)" in report
