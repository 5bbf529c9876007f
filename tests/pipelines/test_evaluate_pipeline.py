"""evaluate as a KFP component after a real fine-tune, under kfp.local: initializers → torchtune-finetune
(local backend, CPU) → evaluate with a min_improvement gate → quality-gate → `dsl.If`. The pipeline run is the
one the finetune and export component tests share (tests/support/component_pipeline.py). The real pipeline's
gated export is proven both ways: a passing model exported (tests/pipelines/test_pipelines.py), a failing one kept
and not exported (the README's run-local command, tests/cli/test_readme_commands.py)."""

import json
import re
from pathlib import Path

import pytest

from kfp_finetune.tiny.dataset import PROMPT_PREFIX
from tests.support.component_pipeline import EVAL_SAMPLES, MIN_IMPROVEMENT

pytestmark = pytest.mark.slow


def test_evaluate_after_finetune_in_a_local_pipeline(component_pipeline_run):
    outputs = component_pipeline_run.outputs

    values = outputs["eval_metrics"].metadata
    assert values["num_samples"] == EVAL_SAMPLES
    assert values["tuned_eval_loss"] < values["base_eval_loss"] - MIN_IMPROVEMENT
    assert values["delta_eval_loss"] < -MIN_IMPROVEMENT and values["gate_improvement"] > MIN_IMPROVEMENT
    assert outputs["passed"] is True and values["passed"] == 1.0
    assert component_pipeline_run.gate_marker.read_text() == "passed"  # the dsl.If branch ran

    samples = outputs["eval_samples"]
    assert re.fullmatch(r"eval/[a-z0-9-]+/samples.jsonl", samples.metadata["workspace_path"])
    rows = [json.loads(line) for line in Path(samples.path).read_text().splitlines()]
    assert len(rows) == EVAL_SAMPLES and samples.metadata["num_rows"] == EVAL_SAMPLES
    assert all(r["prompt"].startswith(PROMPT_PREFIX) and "tuned" in r and "base" in r for r in rows)
    folder = json.loads(outputs["eval_folder_listing"])
    assert folder == {"files": ["metrics.json", "report.html", "samples.jsonl"], "rows": EVAL_SAMPLES}

    html = Path(outputs["eval_report"].path).read_text()
    assert f"{values['tuned_eval_loss']:.4g}" in html and f"{values['base_eval_loss']:.4g}" in html
    assert "training loss" in html and "PASSED" in html
