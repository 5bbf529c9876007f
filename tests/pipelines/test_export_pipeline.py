"""export as a KFP component: initializers → torchtune-finetune (local backend, CPU) → export to a local folder,
in a pipeline under kfp.local; asserts the output artifact and what landed at the destination. The pipeline run
is the one the finetune and evaluate component tests share (tests/support/component_pipeline.py)."""

import json
from pathlib import Path

import pytest

from tests.support.component_pipeline import PIPELINE_NAME

pytestmark = pytest.mark.slow


def test_export_in_a_local_pipeline(component_pipeline_run):
    destination = component_pipeline_run.export_destination

    artifact = component_pipeline_run.outputs["exported"]
    assert artifact.uri == str(destination)
    meta = artifact.metadata
    assert (meta["format"], meta["dtype"], meta["state"], meta["method"]) == (
        "both",
        "bfloat16",
        "created",
        "lora",
    )
    assert meta["base_model"] == str(component_pipeline_run.base_model)
    assert meta["metrics"]["final_loss"] > 0 and "tokens_per_second" in meta["metrics"]
    files = sorted(p.relative_to(destination).as_posix() for p in destination.rglob("*") if p.is_file())
    assert files == sorted(meta["files"])
    assert {"README.md", "checksums.sha256", "config.json", "adapter/adapter_config.json"} <= set(files)
    assert json.loads((destination / "config.json").read_text())["torch_dtype"] == "bfloat16"
    card = (destination / "README.md").read_text()
    assert PIPELINE_NAME in card  # the pipeline run's name, filled in by KFP
    assert "| LoRA rank |" in card and "| tokens_per_second |" in card
    header, *sums = Path(destination / "checksums.sha256").read_text().splitlines()
    assert header.startswith("# kfp-finetune export: run ") and PIPELINE_NAME in header  # KFP's run name
    assert len(sums) == len(files) - 1
