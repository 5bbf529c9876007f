"""A URI that carries credentials (a presigned query, `user:password@`) is refused as a parameter by `run`,
`schedule` and `run-local` before anything is sent or run: KFP prints every parameter in each step's log and
stores it with the run. The message names the parameter, says why and how to use a Secret, and never shows the
credential."""

from __future__ import annotations

import pytest

from kfp_finetune.cli import main
from kfp_finetune.commands import kfp_backend as kb
from tests.support import kfp_standin as kfp_support

kfp_standin = kfp_support.kfp_standin

SECRET = "plantedSECRET0123456789"
REQUIRED = {
    "data_uri": "hf://org/data",
    "model_uri": "hf://org/model",
    "export_destination": "s3://bucket/models/nightly",
}
CARRYING = {
    "data_uri": f"https://127.0.0.1:9/train.jsonl?X-Amz-Credential=AKIA&X-Amz-Signature={SECRET}",
    "model_uri": f"s3://AKIAPLANTED:{SECRET}@bucket/base",
    "export_destination": f"hf://org/tuned?token={SECRET}",
    "s3_endpoint_url": f"https://AKIAPLANTED:{SECRET}@127.0.0.1:9",
}


@pytest.fixture(autouse=True)
def no_ambient_kfp(monkeypatch):
    for name in (*kb.HOST_ENVS, kb.UI_HOST_ENV, kb.TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)


def command(name: str, host: str) -> list[str]:
    return {
        "run": ["run", "finetune-pipeline", "--host", host],
        "schedule": ["schedule", "finetune-pipeline", "--cron", "0 0 2 * * *", "--host", host],
        "run-local": ["run-local", "finetune-pipeline"],
    }[name]


@pytest.mark.parametrize("parameter", list(CARRYING))
@pytest.mark.parametrize("name", ["run", "schedule", "run-local"])
def test_a_uri_carrying_credentials_is_refused_before_anything_is_sent(capsys, kfp_standin, name, parameter):
    params = {**REQUIRED, parameter: CARRYING[parameter]}
    code = main(
        [*command(name, kfp_standin.url), *[a for k, v in params.items() for a in ("--param", f"{k}={v}")]]
    )
    out, err = capsys.readouterr()
    assert code == 2
    assert (
        err.startswith(f"error: --param {parameter}: {parameter} carries credentials (")
        and err.count("\n") == 1
    )
    assert "KFP prints every pipeline parameter in each step's log" in err and "Kubernetes Secret" in err
    assert SECRET not in out + err
    assert kfp_standin.requests == []


def test_a_params_file_is_checked_the_same_way(capsys, kfp_standin, tmp_path):
    params = tmp_path / "params.yaml"
    params.write_text(
        "".join(f"{k}: '{v}'\n" for k, v in {**REQUIRED, "data_uri": CARRYING["data_uri"]}.items())
    )
    code = main(["run", "finetune-pipeline", "--host", kfp_standin.url, "--params-file", str(params)])
    err = capsys.readouterr().err
    assert code == 2 and "data_uri carries credentials (a query string" in err and SECRET not in err
    assert kfp_standin.requests == []


@pytest.mark.parametrize(
    "value",
    [
        "hf://org/data@v1.2",  # a revision, not userinfo
        "/data/odd?name.jsonl",  # a local path: a `?` may be part of a file name
        "s3://bucket/train",
        "https://example.com/public/train.jsonl",
    ],
)
@pytest.mark.slow
def test_uris_without_credentials_pass(capsys, kfp_standin, value):
    code = main(
        ["run", "finetune-pipeline", "--host", kfp_standin.url]
        + [a for k, v in {**REQUIRED, "data_uri": value}.items() for a in ("--param", f"{k}={v}")]
    )
    assert code == 0, capsys.readouterr().err


def test_a_kfp_host_with_userinfo_is_not_echoed_when_it_cannot_be_reached(capsys):
    code = main(["run", "finetune-pipeline", "--host", f"http://admin:{SECRET}@127.0.0.1:9"]
                + [a for k, v in REQUIRED.items() for a in ("--param", f"{k}={v}")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and "http://<redacted>@127.0.0.1:9" in err, err
    assert SECRET not in err
