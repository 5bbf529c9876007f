"""A URI carrying credentials (a presigned query, `user:password@`) as a pipeline parameter is refused by the first
step of every pipeline — pre-flight in finetune-pipeline and sweep-pipeline, the initializers in prepare-inputs,
and export wherever it runs alone — before anything reads or writes with it: KFP's executor has printed it in the
step's log already, and the run stores it. The refusal names the parameter as the user set it, says why and how
to use a Secret instead, and never shows the credential."""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

import re
from types import SimpleNamespace

import pytest
from kfp import local

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.export.component import export
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight
from kfp_finetune.components.register_model.component import register_model
from kfp_finetune.pipelines import finetune_pipeline, prepare_inputs

SECRET = "plantedSECRET0123456789"
PRESIGNED = f"https://127.0.0.1:9/train.jsonl?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}"
USERINFO = f"s3://AKIAPLANTED:{SECRET}@bucket/base"
ENDPOINT = f"https://AKIAPLANTED:{SECRET}@127.0.0.1:9"  # nothing listens: never reached
WHY = "KFP prints every pipeline parameter in each step's log and stores it with the run"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_line(capsys, step, **arguments) -> str:
    with pytest.raises(SystemExit):
        step.python_func(**arguments)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and SECRET not in err, err
    return lines[0]


def test_pre_flight_lists_every_parameter_carrying_credentials(tmp_path):
    with pytest.raises(PreflightError) as refused:
        run_preflight(
            model_uri=USERINFO, data_uri=PRESIGNED, export_destination=str(tmp_path / "out"),
            s3_endpoint_url=ENDPOINT, tune_backend="local",
        )  # fmt: skip
    message = str(refused.value)
    for parameter, what in (("model_uri", "user:password@"), ("data_uri", "a query string"),
                            ("s3_endpoint_url", "user:password@")):  # fmt: skip
        assert re.search(rf"\(\d\) {parameter}: carries credentials \({what}", message), message
    assert WHY in message and "HF_TOKEN" in message and "AWS_SECRET_ACCESS_KEY" in message
    assert "\n" not in message and SECRET not in message


def test_model_initialize_refuses_a_source_with_credentials(capsys, tmp_path):
    line = error_line(
        capsys, model_initialize, source_uri=USERINFO, workspace_path=str(tmp_path),
        model=SimpleNamespace(path=str(tmp_path / "model"), metadata={}),
    )  # fmt: skip
    assert line.startswith("error: model_uri carries credentials (user:password@") and WHY in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("arguments", "parameter"),
    [
        ({"source_uri": PRESIGNED}, "data_uri"),
        ({"source_uri": "/data/train.jsonl", "base_model_uri": f"hf://org/base?token={SECRET}"}, "model_uri"),
        ({"source_uri": "/data/train.jsonl", "s3_endpoint_url": ENDPOINT}, "s3_endpoint_url"),
    ],
)
def test_dataset_initialize_refuses_each_uri_with_credentials(capsys, tmp_path, arguments, parameter):
    outputs = {split: SimpleNamespace(path=str(tmp_path / split), metadata={}) for split in ("train", "eval")}
    line = error_line(capsys, dataset_initialize, workspace_path=str(tmp_path / "ws"), **outputs, **arguments)
    assert line.startswith(f"error: {parameter} carries credentials (") and WHY in line
    assert not (tmp_path / "ws").exists()


def test_export_refuses_a_destination_with_credentials(capsys, tmp_path):
    line = error_line(
        capsys, export, workspace_path=str(tmp_path), model=SimpleNamespace(metadata={}),
        destination=f"s3://bucket/tuned?X-Amz-Signature={SECRET}",
        exported=SimpleNamespace(path=str(tmp_path / "exported"), metadata={}, uri=""),
        serving=SimpleNamespace(path=str(tmp_path / "serving"), metadata={}, uri=""),
    )  # fmt: skip
    assert line.startswith("error: export_destination carries credentials (a query string") and WHY in line


def test_register_model_refuses_an_address_with_credentials(capsys, tmp_path):
    artifact = SimpleNamespace(metadata={}, path="", uri="")
    line = error_line(
        capsys, register_model, exported=artifact, metrics=artifact, base_model=artifact, train_data=artifact,
        registered=SimpleNamespace(path=str(tmp_path / "registered"), metadata={}, uri=""),
        address=f"https://admin:{SECRET}@model-registry.example.com",
    )  # fmt: skip
    assert line.startswith("error: registry_address carries credentials (user:password@") and WHY in line


def _failed_run(pipeline, tmp_path, capfd, **arguments) -> tuple[str, str]:
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "pipeline_root"),
        workspace_root=str(tmp_path / "workspace"),
    )
    with pytest.raises(RuntimeError, match="finished with status .*FAILURE") as failed:
        pipeline(**arguments)
    return _ANSI.sub("", str(failed.value)), _ANSI.sub("", capfd.readouterr().out)


@pytest.mark.parametrize("name", ["finetune-pipeline", "prepare-inputs"])
def test_the_first_step_of_a_pipeline_refuses_a_presigned_data_uri(name, tiny_llama, tmp_path, capfd):
    pipeline = {"finetune-pipeline": finetune_pipeline, "prepare-inputs": prepare_inputs}[name]
    extra = (
        {"export_destination": str(tmp_path / "out"), "tune_backend": "local"}
        if name != "prepare-inputs"
        else {}
    )
    failure, output = _failed_run(
        pipeline, tmp_path, capfd, model_uri=str(tiny_llama), data_uri=PRESIGNED, **extra
    )
    first = "preflight" if name == "finetune-pipeline" else "dataset-initialize"
    assert f"Inner task failed: '{first}'" in failure
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    assert len(errors) == 1 and "data_uri" in errors[0] and "carries credentials" in errors[0], errors
    assert SECRET not in errors[0]
    for downstream in ("torchtune-finetune", "evaluate", "export"):
        assert f"Executing task '{downstream}'" not in output
