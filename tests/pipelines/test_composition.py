"""Composition never collides: every name a step writes or creates (workspace entries, run and eval folders,
export staging, TrainJobs) comes from KFP's id of the task instance (`{{$.pipeline_task_uuid}}`), so nesting
`finetune_pipeline` twice in one run, or a sweep's trials, never share a folder or a TrainJob.

The names themselves; a compile-level check that every step the pipelines run that writes into the workspace gets
the task id; and `finetune_pipeline` nested twice under kfp.local with two data files of the same name.
"""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl

from kfp_finetune.commands.run_local import run_pipeline_locally
from kfp_finetune.components._shared.artifacts import entry_name
from kfp_finetune.components._shared.names import instance_name
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.pipelines import PIPELINES, finetune_pipeline, settings
from tests.support.data_shapes import tiny_rows

TASK_ID = "{{$.pipeline_task_uuid}}"


# --- the names -----------------------------------------------------------------------------------------------


def test_entries_of_sources_with_the_same_file_name_are_apart_under_two_tasks():
    first = entry_name("", "/data/a/train.jsonl", "task-1")
    second = entry_name("", "s3://bucket/b/train.jsonl?X-Amz-Signature=secret", "task-2")
    assert first.startswith("train-") and second.startswith("train-")
    assert first != second
    assert entry_name("", "/data/a/train.jsonl", "task-1") == first  # a restarted task finds its own entry
    assert entry_name("mine", "/data/a/train.jsonl", "task-1") == instance_name("mine", "task-1")
    assert entry_name("", "/data/a/train.jsonl") == "train"  # outside KFP: the readable part alone


def test_instance_names_are_path_safe():
    assert instance_name("../x y", "t") == f"x-y-{hashlib.sha256(b't').hexdigest()[:8]}"
    assert instance_name("..", "") == "default"


def test_trainjob_names_are_per_task_instance_valid_and_stable():
    names = {tj.trainjob_name("run-1", "torchtune-finetune", task) for task in ("uuid-a", "uuid-b", "")}
    assert len(names) == 3
    assert (
        tj.trainjob_name("run-1", "torchtune-finetune", "uuid-a") in names
    )  # re-attach: the same name again
    # Without a task id the name is what it always was, so a launcher started before this change re-attaches.
    assert tj.trainjob_name("run-1", "torchtune-finetune", "") == tj.trainjob_name(
        "run-1", "torchtune-finetune"
    )
    long = tj.trainjob_name("9" * 80, "Trial LR=0.0003 rank=64 " * 4, "f" * 200)
    assert tj.validate_name(long) == long and len(long) <= tj.MAX_NAME_LENGTH


# --- every step that writes gets the task id ------------------------------------------------------------------


def _tasks(spec: dict):
    """(dag name, task name, task) for every task of every DAG in a compiled pipeline."""
    dags = {"root": spec["root"], **{k: c for k, c in spec["components"].items() if "dag" in c}}
    for dag_name, dag in dags.items():
        for task_name, task in dag["dag"]["tasks"].items():
            yield dag_name, task_name, task


@pytest.mark.parametrize("name", sorted(PIPELINES))
@pytest.mark.slow
def test_every_step_that_writes_gets_its_task_id(name, tmp_path):
    target = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(PIPELINES[name], str(target))
    spec = next(yaml.safe_load_all(target.read_text()))
    writers = 0
    for dag_name, task_name, task in _tasks(spec):
        component = spec["components"][task["componentRef"]["name"]]
        if "executorLabel" not in component:
            continue  # a sub-DAG: its own tasks are checked
        declared = component.get("inputDefinitions", {}).get("parameters", {})
        if "workspace_path" not in declared and "task_id" not in declared:
            continue  # writes nothing (the quality gate, the sweep grid, the trial selection)
        writers += 1
        assert "task_id" in declared, (
            f"{name}: {dag_name}/{task_name} writes into the workspace without a task_id"
        )
        given = task.get("inputs", {}).get("parameters", {}).get("task_id", {})
        assert given.get("runtimeValue", {}).get("constant") == TASK_ID, (
            f"{name}: {dag_name}/{task_name} is not given task_id=dsl.PIPELINE_TASK_ID_PLACEHOLDER"
        )
    assert writers >= 2


# --- finetune_pipeline nested twice under kfp.local ----------------------------------------------------------

ROWS = 60
# Four LoRA steps, generations of one token: the names are under test, not learning; both exports run because
# four steps at this learning rate already lower the loss of each of the 6 held-out rows, which the gate's
# interval needs (it cannot be opened by a setting).
FAST = {
    "tune_backend": "local", "tune_device": "cpu", "tune_gpus_per_node": 0, "tune_batch_size": 8,
    "tune_max_steps_per_epoch": 4, "tune_learning_rate": 3e-3, "tune_num_warmup_steps": 0, "tune_seed": 0,
    "tune_overrides": {"gradient_accumulation_steps": 1}, "data_eval_fraction": 0.1,
    "eval_max_samples": 0, "eval_max_new_tokens": 1, "eval_device": "cpu", "export_overwrite": True,
}  # fmt: skip


@dsl.component
def list_workspace(workspace_path: str) -> str:
    """What the run wrote into its workspace (kfp.local deletes the workspace when the run ends): the visible
    entries of each area, and each dataset entry's source."""
    import json
    import os

    listing = {}
    for area in ("datasets", "models", "runs", "eval"):
        root = os.path.join(workspace_path, area)
        listing[area] = (
            sorted(n for n in os.listdir(root) if not n.startswith(".")) if os.path.isdir(root) else []
        )
    listing["sources"] = []
    for name in listing["datasets"]:
        with open(os.path.join(workspace_path, "datasets", name, "manifest.json")) as f:
            listing["sources"].append(json.load(f)["source_uri"])
    listing["configs"] = [
        os.path.isfile(os.path.join(workspace_path, "runs", name, "torchtune_config.yaml"))
        for name in listing["runs"]
    ]
    return json.dumps(listing)


@dsl.pipeline(name="two-fine-tunes", pipeline_config=settings.pipeline_config())
def two_fine_tunes(model_uri: str, data_a: str, data_b: str, export_a: str, export_b: str) -> str:
    """Two models tuned in one run: the README's "nest a DAG" example, twice."""
    first = finetune_pipeline(model_uri=model_uri, data_uri=data_a, export_destination=export_a, **FAST)
    second = finetune_pipeline(model_uri=model_uri, data_uri=data_b, export_destination=export_b, **FAST)
    listing = list_workspace(workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER).after(first, second)
    listing.set_caching_options(False)
    return listing.output


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.glob("*.safetensors")))).hexdigest()


@pytest.mark.slow
def test_finetune_pipeline_nested_twice_never_collides(tiny_llama, tmp_path):
    rows = tiny_rows(2 * ROWS)
    data_a = _write_jsonl(tmp_path / "a" / "train.jsonl", rows[:ROWS])
    data_b = _write_jsonl(tmp_path / "b" / "train.jsonl", rows[ROWS:])
    export_a, export_b = tmp_path / "export-a", tmp_path / "export-b"
    listing = run_pipeline_locally(
        two_fine_tunes,
        {
            "model_uri": str(tiny_llama),
            "data_a": str(data_a),
            "data_b": str(data_b),
            "export_a": str(export_a),
            "export_b": str(export_b),
        },
        tmp_path / "run",
    ).output
    written = json.loads(listing)

    assert len(written["datasets"]) == 2 and all(n.startswith("train-") for n in written["datasets"]), written
    assert sorted(Path(source).parent.name for source in written["sources"]) == ["a", "b"], written
    assert len(written["models"]) == 2, written
    assert len(written["runs"]) == 2 and all(written["configs"]), written
    assert len(written["eval"]) == 2, written
    assert _digest(export_a) != _digest(export_b), "the two exports hold the same model"
    for exported in (export_a, export_b):
        assert (exported / "config.json").is_file() and list(exported.glob("*.safetensors"))


# --- the README's nesting example ------------------------------------------------------------------------------


def readme_nesting_example() -> str:
    """The python block under README.md's "Nest a DAG in your own pipeline", exactly as shown."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("### Nest a DAG in your own pipeline", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_readme_nesting_example_compiles_to_a_pipeline_a_stock_kfp_accepts(tmp_path, monkeypatch):
    """Compiled as shown (with the reader's own `notify`), the outer pipeline passes what a stock KFP 2.15+ API
    server checks on upload and run (tests/support/kfp_validation.py names the upstream rules), with no admin
    workspace default, and nests the golden finetune-pipeline DAG."""
    from kfp.dsl import HTML, Input

    from tests.support.kfp_validation import pipeline_spec_problem, workspace_problem

    @dsl.component
    def notify(passed: bool, report: Input[HTML]):
        print(passed, report.path)

    monkeypatch.chdir(Path(__file__).parents[2])  # the snippet loads compiled/ relative to the clone
    namespace = {"notify": notify}
    exec(compile(readme_nesting_example(), "README.md", "exec"), namespace)
    package = tmp_path / "nightly.yaml"
    compiler.Compiler().compile(namespace["nightly"], str(package))
    spec, platform = yaml.safe_load_all(package.read_text())
    assert pipeline_spec_problem(spec) is None
    assert workspace_problem({"platform_spec": platform}, workspace_default=None) is None
    golden, _ = yaml.safe_load_all(
        (Path(__file__).parents[2] / "compiled/finetune-pipeline.yaml").read_text()
    )
    nested = {name for name in spec["components"] if name.startswith("comp-finetune-pipeline")}
    assert nested, sorted(spec["components"])
    assert set(golden["root"]["inputDefinitions"]["parameters"]) <= set(
        spec["components"][min(nested)]["inputDefinitions"]["parameters"]
    )
