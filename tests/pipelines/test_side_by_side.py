"""dataset-initialize and model-initialize run side by side: in the compiled prepare-inputs DAG (alone and nested
in the pipelines) dataset-initialize neither waits for model-initialize nor takes its output; it reads the base
model's config and tokenizer files from model_uri itself."""

import pytest
import yaml
from kfp import compiler

from kfp_finetune.pipelines import PIPELINES


def _tasks(spec: dict):
    """Every task of the pipeline, nested DAGs included."""
    for dag in [spec["root"], *spec["components"].values()]:
        yield from (dag.get("dag") or {}).get("tasks", {}).items()


@pytest.mark.parametrize("name", ["prepare-inputs", "finetune-pipeline", "sweep-pipeline"])
@pytest.mark.slow
def test_dataset_initialize_does_not_wait_for_model_initialize(name, tmp_path):
    target = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(PIPELINES[name], str(target))
    tasks = dict(_tasks(next(yaml.safe_load_all(target.read_text()))))
    data = tasks["dataset-initialize"]
    assert "model-initialize" not in data.get("dependentTasks", []), data.get("dependentTasks")
    assert "base_model" not in data["inputs"].get("artifacts", {}), "takes model-initialize's output"
    assert "base_model_uri" in data["inputs"]["parameters"], "reads the model's tokenizer from model_uri"
