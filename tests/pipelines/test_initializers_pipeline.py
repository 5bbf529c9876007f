"""dataset-initialize and model-initialize inside a pipeline with a workspace, run by kfp.local.

The components run as subprocesses (as in a pod) against the hub stand-in; their output artifacts must carry
the metadata later steps and the KFP UI rely on, and the bytes must be in the workspace.
"""

# No `from __future__ import annotations`: KFP reads the pipeline signature's annotations as types.

import json
from pathlib import Path
from typing import NamedTuple

import pytest
from kfp import dsl, local
from kfp.dsl import Dataset, Input, Model

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.tiny.dataset import build_tiny_dataset
from tests.support.hub_standin import HubStandin
from tests.support.sources import hub_env, write_fake_model


class Outputs(NamedTuple):
    model: Model
    train: Dataset
    eval: Dataset
    workspace_check: str


@dsl.component(install_kfp_package=False)
def read_workspace(
    workspace_path: str, model: Input[Model], train: Input[Dataset], eval: Input[Dataset]
) -> str:
    """A downstream step: finds the bytes through the artifacts' metadata (kfp.local deletes the workspace
    when the run ends, so the check runs inside the pipeline)."""
    import json
    import os

    model_dir = os.path.join(workspace_path, model.metadata["workspace_path"])
    data_files = train.metadata["data_files"] + eval.metadata["data_files"]
    return json.dumps(
        {
            "model_files": sorted(os.listdir(model_dir)),
            "repo_id_file": json.load(open(os.path.join(model_dir, "original_repo_id.json"))),
            "data_files_present": all(os.path.isfile(os.path.join(workspace_path, f)) for f in data_files),
            "num_data_files": len(data_files),
        }
    )


@dsl.pipeline(
    name="initialize-test",
    pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi")),
)
def initialize_pipeline(model_uri: str, data_uri: str) -> Outputs:
    model_task = model_initialize(
        source_uri=model_uri, workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, name="base"
    )
    data_task = dataset_initialize(
        source_uri=data_uri,
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        name="reverse",
        eval_fraction=0.1,
        seed=3,
    )
    check = read_workspace(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=model_task.outputs["model"],
        train=data_task.outputs["train"],
        eval=data_task.outputs["eval"],
    )
    return Outputs(
        model=model_task.outputs["model"],
        train=data_task.outputs["train"],
        eval=data_task.outputs["eval"],
        workspace_check=check.output,
    )


@pytest.mark.slow
def test_initializers_in_a_local_pipeline(tmp_path, monkeypatch):
    model_src = write_fake_model(tmp_path / "model-src", shards=2)
    build_tiny_dataset(tmp_path / "data-src", train_rows=100, eval_rows=10)
    workspace = tmp_path / "workspace"
    with HubStandin() as hub:
        repo = hub.add_repo("meta-llama/Tiny-3.2", model_src)
        data_repo = hub.add_repo("org/reverse", tmp_path / "data-src", repo_type="dataset")
        # The component subprocesses inherit this environment (the hub stand-in, isolated caches, online).
        for key, value in hub_env(hub.endpoint, tmp_path).items():
            monkeypatch.setenv(key, value)
        local.init(
            runner=local.SubprocessRunner(use_venv=False),
            pipeline_root=str(tmp_path / "pipeline_root"),
            workspace_root=str(workspace),
        )
        task = initialize_pipeline(model_uri="hf://meta-llama/Tiny-3.2", data_uri="hf://org/reverse")

    model, train, held_out = task.outputs["model"], task.outputs["train"], task.outputs["eval"]
    assert model.metadata["commit_sha"] == repo.revisions["main"].commit
    assert model.metadata["repo_id"] == "meta-llama/Tiny-3.2" and model.metadata["model_type"] == "llama"
    assert model.metadata["workspace_path"] == "models/base" and model.metadata["num_files"] == 7
    assert json.loads(Path(model.path).read_text())["commit_sha"] == repo.revisions["main"].commit

    assert train.metadata["commit_sha"] == data_repo.revisions["main"].commit
    assert (train.metadata["num_rows"], held_out.metadata["num_rows"]) == (90, 10)
    assert train.metadata["dataset_type"] == "instruct" and train.metadata["columns"] == ["input", "output"]

    check = json.loads(task.outputs["workspace_check"])
    assert "original_repo_id.json" in check["model_files"] and "manifest.json" in check["model_files"]
    assert check["repo_id_file"] == {"repo_id": "meta-llama/Tiny-3.2"}
    assert check["data_files_present"] and check["num_data_files"] == 2
