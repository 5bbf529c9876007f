"""`kfp-finetune upload / run / schedule / list-runtimes` against local stand-ins of the KFP and Kubernetes APIs.

The real kfp.Client and kubernetes client make real HTTP requests; the tests assert what reached the server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kfp_finetune.cli import main
from kfp_finetune.commands import kfp_backend as kb
from kfp_finetune.commands.compile import COMPILE_ENV
from tests.support import kfp_schedule
from tests.support import kfp_standin as kfp_support
from tests.support import kube_standin as kube_support

kfp_standin = kfp_support.kfp_standin
kube_standin = kube_support.kube_standin

REPO = Path(__file__).resolve().parents[2]
COMPILED = REPO / "compiled"
TOKEN = "test-token-d41d8cd9"
# The parameters finetune-pipeline requires (no default), plus a few typed ones.
FINETUNE_PARAMS = [
    "data_uri=hf://org/data",
    "model_uri=hf://org/model",
    "export_destination=s3://bucket/models/nightly",
]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No ambient KFP/Kubernetes settings, golden compile settings, and a known token."""
    for name in (*kb.HOST_ENVS, kb.UI_HOST_ENV, kb.TOKEN_ENV, "KUBERNETES_SERVICE_HOST", *COMPILE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(kb.TOKEN_ENV, TOKEN)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert TOKEN not in out + err, "the token must never be printed"
    return code, out, err


def upload(capsys, standin, *extra: str) -> tuple[str, str]:
    """Upload finetune-pipeline; return (pipeline id, version id) from the output."""
    code, out, err = cli(capsys, "upload", "finetune-pipeline", "--host", standin.url, *extra)
    assert code == 0, err
    fields = dict(line.split(": ", 1) for line in out.splitlines())
    return fields["pipeline id"], fields["version"].rsplit("(id ", 1)[1].rstrip(")")


# --- upload -------------------------------------------------------------------------------------------------


def test_upload_creates_the_pipeline_with_the_compiled_spec_and_the_token(capsys, kfp_standin):
    pipeline_id, version_id = upload(capsys, kfp_standin, "--description", "nightly re-tune")

    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/pipelines/upload")
    filename, content = request.files["uploadfile"]
    assert content == (COMPILED / "finetune-pipeline.yaml").read_bytes()
    assert filename == "finetune-pipeline.yaml"
    assert request.param("name") == "finetune-pipeline"
    assert request.param("description") == "nightly re-tune"
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in kfp_standin.requests)
    assert kfp_standin.pipelines[pipeline_id]["display_name"] == "finetune-pipeline"
    assert kfp_standin.versions[version_id]["pipeline_id"] == pipeline_id


@pytest.mark.slow
def test_upload_of_an_existing_pipeline_adds_a_version_under_the_same_parent(capsys, kfp_standin, tmp_path):
    pipeline_id, first_version = upload(capsys, kfp_standin)
    changed = tmp_path / "changed.yaml"
    text = (COMPILED / "finetune-pipeline.yaml").read_text()
    changed.write_text(text.replace("description: 'Fine-tune an LLM", "description: 'Fine-tune a LLM", 1))

    code, out, err = cli(capsys, "upload", str(changed), "--host", kfp_standin.url, "--description", "v2")
    assert code == 0, err

    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/pipelines/upload_version")
    assert request.param("pipelineid") == pipeline_id
    assert request.param("description") == "v2"
    assert request.files["uploadfile"][1] == changed.read_bytes()
    from kfp_finetune import __version__

    assert request.param("name") == f"v{__version__}-{kb.Package(changed, []).sha256()[:12]}"
    versions = kfp_standin.versions_of(pipeline_id)
    assert [v["pipeline_version_id"] for v in versions][0] == first_version
    assert len(versions) == 2 and "new version" in out


@pytest.mark.slow
def test_upload_of_an_unchanged_pipeline_adds_nothing(capsys, kfp_standin):
    pipeline_id, version_id = upload(capsys, kfp_standin)
    again_pipeline, again_version = upload(capsys, kfp_standin)
    assert (again_pipeline, again_version) == (pipeline_id, version_id)
    assert not kfp_standin.requests_for("POST", "/apis/v2beta1/pipelines/upload_version")
    assert len(kfp_standin.versions_of(pipeline_id)) == 1


def test_upload_a_yaml_file_with_explicit_names(capsys, kfp_standin):
    path = COMPILED / "prepare-inputs.yaml"
    code, _, err = cli(capsys, "upload", str(path), "--name", "team-inputs", "--host", kfp_standin.url)
    assert code == 0, err
    code, _, err = cli(
        capsys,
        "upload",
        str(path),
        "--name",
        "team-inputs",
        "--version-name",
        "2026-11-21",
        "--host",
        kfp_standin.url,
    )
    assert code == 0, err
    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/pipelines/upload_version")
    assert request.param("name") == "2026-11-21"
    # The same explicit version name again is refused before anything is uploaded.
    code, _, err = cli(
        capsys,
        "upload",
        str(path),
        "--name",
        "team-inputs",
        "--version-name",
        "2026-11-21",
        "--host",
        kfp_standin.url,
    )
    assert code == 2 and "already has a version called '2026-11-21'" in err
    assert len(kfp_standin.requests_for("POST", "/apis/v2beta1/pipelines/upload_version")) == 1


def test_upload_unknown_pipeline_name_is_a_usage_error(capsys, kfp_standin):
    code, _, err = cli(capsys, "upload", "finetune-pipelin", "--host", kfp_standin.url)
    assert code == 2
    assert "unknown pipeline 'finetune-pipelin'" in err and "finetune-pipeline" in err
    code, _, err = cli(capsys, "upload", "missing.yaml", "--host", kfp_standin.url)
    assert code == 2 and "no such pipeline file" in err
    assert kfp_standin.requests == []


@pytest.mark.slow
def test_multi_user_namespace_reaches_upload_and_experiment(capsys):
    with kfp_support.KfpStandin(token=TOKEN, multi_user=True) as standin:
        upload(capsys, standin, "--namespace", "team-a")
        code, _, err = cli(
            capsys,
            "run",
            "--pipeline",
            "finetune-pipeline",
            "--namespace",
            "team-a",
            "--host",
            standin.url,
            *[arg for p in FINETUNE_PARAMS for arg in ("--param", p)],
        )
        assert code == 0, err
        (upload_request,) = standin.requests_for("POST", "/apis/v2beta1/pipelines/upload")
        assert upload_request.param("namespace") == "team-a"
        assert all(
            r.param("namespace") == "team-a" for r in standin.requests_for("GET", "/apis/v2beta1/pipelines")
        )
        (experiment,) = standin.experiments.values()
        assert experiment["namespace"] == "team-a"
        # The namespace came with a host, so kfp.Client had no reason to ask healthz whether KFP is multi-user.
        assert not standin.requests_for("GET", "/apis/v2beta1/healthz")


# --- run ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_an_uploaded_version_with_typed_parameters(capsys, kfp_standin):
    pipeline_id, version_id = upload(capsys, kfp_standin)
    code, out, err = cli(
        capsys, "run", "--pipeline", "finetune-pipeline", "--experiment", "nightly", "--run-name", "retune-1",
        "--host", kfp_standin.url,
        *[arg for p in FINETUNE_PARAMS for arg in ("--param", p)],
        "--param", "eval_gpus=1",
        "--param", "data_eval_fraction=1e-2",  # YAML 1.1 reads this as a string; the pipeline says float
        "--param", "eval_lm_eval_tasks=[hellaswag, arc_easy]",
        "--param", "eval_thresholds={eval_loss: 2.5}",
        "--param", "export_hf_private=false",
        "--param", "data_train_split=0123",  # a string parameter keeps the text as typed
        "--param", "eval_gate_metric=a: b: c",  # not YAML, still a fine string
    )  # fmt: skip
    assert code == 0, err

    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/runs")
    body = request.json
    assert body["display_name"] == "retune-1"
    assert body["pipeline_version_reference"] == {
        "pipeline_id": pipeline_id,
        "pipeline_version_id": version_id,
    }
    assert "pipeline_spec" not in body
    assert body["runtime_config"]["parameters"] == {
        "data_uri": "hf://org/data",
        "model_uri": "hf://org/model",
        "export_destination": "s3://bucket/models/nightly",
        "eval_gpus": 1,
        "data_eval_fraction": 0.01,
        "eval_lm_eval_tasks": ["hellaswag", "arc_easy"],
        "eval_thresholds": {"eval_loss": 2.5},
        "export_hf_private": False,
        "data_train_split": "0123",
        "eval_gate_metric": "a: b: c",
    }
    (experiment,) = kfp_standin.experiments.values()
    assert experiment["display_name"] == "nightly" and body["experiment_id"] == experiment["experiment_id"]
    (run_id,) = kfp_standin.runs
    assert f"run id: {run_id}" in out
    assert f"url: {kfp_standin.url}/#/runs/details/{run_id}" in out


def test_run_a_local_pipeline_sends_its_spec_inline(capsys, kfp_standin, tmp_path):
    params_file = tmp_path / "params.yaml"
    params_file.write_text("data_uri: hf://org/data\nmodel_uri: hf://org/model\ndata_seed: 7\n")
    code, _, err = cli(
        capsys, "run", "prepare-inputs", "--params-file", str(params_file), "--param", "data_seed=8",
        "--host", kfp_standin.url,
    )  # fmt: skip
    assert code == 0, err
    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/runs")
    pipeline_doc, platform_doc = yaml.safe_load_all((COMPILED / "prepare-inputs.yaml").read_text())
    assert request.json["pipeline_spec"] == {"pipeline_spec": pipeline_doc, "platform_spec": platform_doc}
    assert "pipeline_version_reference" not in request.json
    assert request.json["runtime_config"]["parameters"] == {
        "data_uri": "hf://org/data",
        "model_uri": "hf://org/model",
        "data_seed": 8,
    }
    assert request.json["display_name"].startswith("prepare-inputs ")
    assert not kfp_standin.requests_for("POST", "/apis/v2beta1/pipelines/upload")


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("lerning_rate=1e-4", "unknown parameter(s) lerning_rate"),
        ("eval_gpus=two", "--param eval_gpus: eval_gpus is declared NUMBER_INTEGER, so it needs an integer"),
        ("eval_gpus=1.5", "eval_gpus is declared NUMBER_INTEGER, so it needs an integer, e.g. 8; got '1.5'"),
        (
            "export_hf_private=maybe",
            "export_hf_private is declared BOOLEAN, so it needs true or false; got 'maybe'",
        ),
        (
            "export_hf_private=yes",
            "export_hf_private is declared BOOLEAN, so it needs true or false; got 'yes'",
        ),
        ("eval_lm_eval_tasks=[a, b", "eval_lm_eval_tasks is declared LIST, so it needs a JSON/YAML list"),
        ("no-equals-sign", "--param expects KEY=VALUE, got 'no-equals-sign'"),
    ],
)
@pytest.mark.slow
def test_bad_parameters_are_usage_errors_and_nothing_is_sent(capsys, kfp_standin, param, message):
    code, _, err = cli(
        capsys, "run", "finetune-pipeline", "--host", kfp_standin.url,
        *[arg for p in FINETUNE_PARAMS for arg in ("--param", p)], "--param", param,
    )  # fmt: skip
    assert code == 2
    assert message in err
    assert kfp_standin.requests == []


def test_missing_required_parameter_is_named(capsys, kfp_standin):
    code, _, err = cli(capsys, "run", "finetune-pipeline", "--host", kfp_standin.url, "--param", "data_uri=x")
    assert code == 2
    assert "missing required parameter(s): export_destination, model_uri" in err


def test_run_needs_exactly_one_source_and_a_known_uploaded_pipeline(capsys, kfp_standin):
    code, _, err = cli(capsys, "run", "--host", kfp_standin.url)
    assert code == 2 and "either a pipeline" in err
    code, _, err = cli(capsys, "run", "prepare-inputs", "--pipeline", "x", "--host", kfp_standin.url)
    assert code == 2
    code, _, err = cli(capsys, "run", "--pipeline", "never-uploaded", "--host", kfp_standin.url)
    assert code == 2 and "no uploaded pipeline called 'never-uploaded'" in err
    assert not kfp_standin.requests_for("POST", "/apis/v2beta1/runs")


def test_server_errors_exit_1_with_the_servers_message_and_no_token(capsys):
    with kfp_support.KfpStandin(token="the-right-one") as standin:
        code, _, err = cli(capsys, "upload", "prepare-inputs", "--host", standin.url, "--namespace", "team-a")
    assert code == 1
    assert "KFP answered 401" in err and "no valid bearer token" in err
    assert standin.requests[0].headers["authorization"] == f"Bearer {TOKEN}"


def test_unreachable_host_exits_1(capsys, kfp_standin):
    url = kfp_standin.url
    kfp_standin.stop()
    code, _, err = cli(capsys, "upload", "prepare-inputs", "--host", url, "--namespace", "team-a")
    assert code == 1 and f"cannot reach KFP at {url}" in err


@pytest.mark.slow
def test_kubeconfig_credentials_reach_kfp_through_the_service_proxy(tmp_path):
    """No --host and no KFP_TOKEN: kfp.Client goes through the kubeconfig's API server with its token."""
    with kfp_support.KfpStandin(token="kube-token") as standin:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": standin.url}}],
                    "users": [{"name": "u", "user": {"token": "kube-token"}}],
                    "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "ctx",
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if k != kb.TOKEN_ENV}
        # A separate process: the kubernetes client reads KUBECONFIG once, at import.
        result = subprocess.run(
            [sys.executable, "-m", "kfp_finetune.cli", "upload", "prepare-inputs"],
            env={**env, "KUBECONFIG": str(kubeconfig)},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        (request,) = standin.requests_for("POST", "/apis/v2beta1/pipelines/upload")
        assert request.proxy_namespace == "kubeflow"
        assert request.headers["authorization"] == "Bearer kube-token"
        assert "kube-token" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("name", "fragments"),
    [
        ("Prepare Inputs", ["'Prepare Inputs' (pipelineInfo.name)", "lowercase", "name='prepare-inputs'"]),
        ("prepare.inputs", ["'prepare.inputs'", "name='prepare-inputs'"]),
        ("-prepare", ["'-prepare'", "starting with a letter or digit"]),
        ("p" * 129, ["1-128 lowercase"]),
    ],
    ids=["spaces", "dot", "leading-dash", "too-long"],
)
def test_upload_checks_the_spec_name_first(capsys, kfp_standin, tmp_path, name, fragments):
    """The server's 400 (test_kfp_cli_server.py) said before anything is sent, naming the fix; the spec is
    not rewritten, so what KFP stores is the file given."""
    documents = kb.load_package("prepare-inputs", tmp_path).documents
    documents[0]["pipelineInfo"]["name"] = name
    source = tmp_path / "mine.yaml"
    source.write_text(yaml.safe_dump_all(documents))
    code, _, err = cli(capsys, "upload", str(source), "--host", kfp_standin.url)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and all(f in err for f in fragments), err
    assert kfp_standin.requests == []


@pytest.mark.parametrize(
    ("flag", "longest"), [("--name", 128), ("--version-name", 127)], ids=["name", "version-name"]
)
def test_upload_checks_name_lengths_first(capsys, kfp_standin, flag, longest):
    code, _, err = cli(
        capsys, "upload", "prepare-inputs", flag, "n" * (longest + 1), "--host", kfp_standin.url
    )
    assert code == 2 and f"{flag} is {longest + 1} characters long; KFP takes at most {longest}" in err
    assert kfp_standin.requests == []


# --- schedule -----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_schedule_cron_defaults_to_one_at_a_time_without_catchup(capsys, kfp_standin):
    pipeline_id, version_id = upload(capsys, kfp_standin)
    code, out, err = cli(
        capsys, "schedule", "--pipeline", "finetune-pipeline", "--cron", "0 30 2 * * MON-FRI",
        "--start", "2096-12-01T00:00:00", "--end", "2097-06-01T00:00:00+02:00", "--name", "nightly",
        "--host", kfp_standin.url, *[arg for p in FINETUNE_PARAMS for arg in ("--param", p)],
        "--param", "eval_gpus=1",
    )  # fmt: skip
    assert code == 0, err

    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/recurringruns")
    body = request.json
    assert body["trigger"] == {
        "cron_schedule": {
            "cron": "0 30 2 * * MON-FRI",
            "start_time": "2096-12-01T00:00:00Z",
            "end_time": "2097-05-31T22:00:00Z",
        }
    }
    assert body["max_concurrency"] == 1
    assert body["no_catchup"] is True
    assert body["mode"] == "ENABLE"
    assert body["display_name"] == "nightly"
    assert body["pipeline_version_reference"] == {
        "pipeline_id": pipeline_id,
        "pipeline_version_id": version_id,
    }
    assert body["runtime_config"]["parameters"]["eval_gpus"] == 1
    assert body["runtime_config"]["parameters"]["data_uri"] == "hf://org/data"
    (recurring_id,) = kfp_standin.recurring_runs
    assert f"recurring run id: {recurring_id}" in out
    assert f"/#/recurringrun/details/{recurring_id}" in out


def test_schedule_interval_with_catchup_disabled_and_concurrency(capsys, kfp_standin):
    code, _, err = cli(
        capsys, "schedule", "prepare-inputs", "--interval-seconds", "21600", "--max-concurrency", "3",
        "--catchup", "--disabled", "--host", kfp_standin.url,
        "--param", "data_uri=hf://org/data", "--param", "model_uri=hf://org/model",
    )  # fmt: skip
    assert code == 0, err
    (request,) = kfp_standin.requests_for("POST", "/apis/v2beta1/recurringruns")
    body = request.json
    assert body["trigger"] == {"periodic_schedule": {"interval_second": 21600}}
    assert (body["max_concurrency"], body["no_catchup"], body["mode"]) == (3, False, "DISABLE")
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "prepare-inputs"


@pytest.mark.parametrize(
    ("cron", "message"),
    [
        ("0 2 * * *", "has 5 fields, but KFP's cron has 6 with seconds first"),
        ("0 0 25 * * *", "hours field '25': 25 is outside 0-23"),
        ("0 0 2 * * FUNDAY", "day of week field 'FUNDAY'"),
        ("0 */0 * * * *", "step '0' must be a positive number"),
        ("0 0 2 * * * 2027", "has 7 fields"),
        ("@fortnightly", "unknown descriptor"),
    ],
)
def test_bad_cron_is_explained_before_anything_is_sent(capsys, kfp_standin, cron, message):
    code, _, err = cli(
        capsys, "schedule", "prepare-inputs", "--cron", cron, "--host", kfp_standin.url,
        "--param", "data_uri=x", "--param", "model_uri=y",
    )  # fmt: skip
    assert code == 2
    assert message in err and "seconds first" in err
    assert kfp_standin.requests == []


# (cron, stderr fragment): the API server accepts each (robfig's `cron.Parse` checks fields one by one), so only
# the command can refuse them; the stand-in's controller (robfig's `Next`) confirms what each would do.
NEVER_OR_TOO_OFTEN = [
    ("0 0 0 31 2 *", "never fires: no date in the next five years has day of month '31' in month '2'"),
    ("0 0 31 2 *", "'0 0 31 2 *' never fires"),
    ("0 0 0 30-31 2 *", "never fires"),
    ("0 0 0 31 APR,JUN,SEP,NOV *", "never fires"),
    ("@every 0s", "would start a run every second"),
    ("@every 500ms", "would start a run every second"),
    ("@every 30s", "would start a run every 30 s"),
    ("* * * * * *", "would start 60 runs a minute (seconds field '*')"),
    ("*/20 0 2 * * *", "would start 3 runs a minute"),
]


@pytest.mark.parametrize(("cron", "message"), NEVER_OR_TOO_OFTEN, ids=[c for c, _ in NEVER_OR_TOO_OFTEN])
def test_schedules_that_never_fire_or_fire_too_often_are_refused(capsys, kfp_standin, cron, message):
    six_fields = f"0 {cron}" if len(cron.split()) == 5 else cron
    assert kfp_schedule.cron_problem(six_fields) is None  # the API server would take it
    start = 1_767_225_600  # 2026-01-01T00:00:00Z
    first = kfp_schedule.cron_after(six_fields, start)
    if "never fires" in message:
        assert first == kfp_schedule.MAX_EPOCH
    else:
        assert kfp_schedule.cron_after(six_fields, first) - first < 60
    code, _, err = cli(
        capsys, "schedule", "prepare-inputs", "--cron", cron, "--host", kfp_standin.url,
        "--param", "data_uri=x", "--param", "model_uri=y",
    )  # fmt: skip
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert kfp_standin.requests == []


def test_a_leap_day_and_a_minutely_schedule_are_accepted():
    from kfp_finetune.commands.schedule import check_cron

    assert check_cron("0 0 0 29 2 *") == "0 0 0 29 2 *"  # fires in leap years, within robfig's five
    assert check_cron("0 * * * * *") == "0 * * * * *"
    assert check_cron("0 0 0 31 2 MON") == "0 0 0 31 2 MON"  # day 31 OR a Monday in February (robfig)
    assert check_cron("@every 1m") == "@every 1m"


def test_five_field_cron_suggests_the_six_field_form():
    with pytest.raises(kb.UsageError, match=r"Did you mean '0 0 2 \* \* \*'\?"):
        kb.validate_cron("0 2 * * *")


@pytest.mark.parametrize(
    "cron",
    [
        "0 0 2 * * *",
        "0 0 9 ? * 2-6",
        "0 */15 8-18 * JAN-MAR mon,wed",
        "@daily",
        "@every 1h30m",
        "  0 0 2 * * *",
    ],
)
def test_valid_crons_pass(cron):
    assert kb.validate_cron(cron) == " ".join(cron.split())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cron", "@daily", "--max-concurrency", "11"], "--max-concurrency must be 1-10"),
        (["--interval-seconds", "0"], "--interval-seconds must be at least 60"),
        (["--interval-seconds", "1"], "at most one run a minute), got 1"),
        (["--cron", "@daily", "--start", "tomorrow"], "--start 'tomorrow': expected an ISO 8601 time"),
        (["--cron", "@daily", "--start", "2027-01-02", "--end", "2027-01-01"], "is not after --start"),
        (["--cron", "@daily", "--end", "2020-01-01"], "--end 2020-01-01T00:00:00Z is in the past"),
        (
            ["--interval-seconds", "86400", "--start", "2090-01-01", "--end", "2090-01-01T12:00:00"],
            "comes before the first run (2090-01-02T00:00:00Z",
        ),
    ],
)
def test_bad_schedule_options(capsys, kfp_standin, argv, message):
    code, _, err = cli(capsys, "schedule", "prepare-inputs", *argv, "--host", kfp_standin.url)
    assert code == 2 and message in err
    assert kfp_standin.requests == []


# --- list-runtimes ------------------------------------------------------------------------------------------


def seed_our_runtimes(kube) -> None:
    for path in sorted((REPO / "runtimes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "ClusterTrainingRuntime":
                kube.add_object(document)


def test_list_runtimes_marks_ours(capsys, kube_standin):
    seed_our_runtimes(kube_standin)
    kube_standin.add_runtime("team-torch", kind="TrainingRuntime", namespace="team-a", num_nodes=2)
    kubeconfig = str(kube_standin.kubeconfig_path)

    code, out, err = cli(
        capsys, "list-runtimes", "--kubeconfig", kubeconfig, "--namespace", "team-a", "-o", "json"
    )
    assert code == 0, err
    rows = {row["name"]: row for row in json.loads(out)}
    ours = {"torchtune", "torchtune-cpu", "transformers", "transformers-cpu"}
    assert set(rows) == {"torch-distributed", "team-torch", *ours}
    cpu = rows["torchtune-cpu"]
    assert (cpu["kind"], cpu["framework"], cpu["numNodes"], cpu["kfpFinetune"]) == (
        "ClusterTrainingRuntime", "torch", 1, True,
    )  # fmt: skip
    assert cpu["image"] == "ghcr.io/kfp-finetune/kfp-finetune-trainer:0.1.0"
    assert rows["transformers-cpu"]["image"] == "ghcr.io/kfp-finetune/kfp-finetune-trainer-transformers:0.1.0"
    assert all(rows[name]["kfpFinetune"] for name in ours)
    assert rows["torch-distributed"]["kfpFinetune"] is False
    assert (rows["team-torch"]["kind"], rows["team-torch"]["namespace"], rows["team-torch"]["numNodes"]) == (
        "TrainingRuntime", "team-a", 2,
    )  # fmt: skip

    code, out, _ = cli(capsys, "list-runtimes", "--kubeconfig", kubeconfig)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "FRAMEWORK", "NODES", "DEVICES/NODE", "IMAGE", "KFP-FINETUNE"]
    assert len(lines) == 6  # header + 5 cluster runtimes; team-torch needs --namespace
    assert next(line for line in lines if " torchtune " in line).rstrip().endswith("yes")
    assert not next(line for line in lines if "torch-distributed" in line).rstrip().endswith("yes")
    assert any(r.path.endswith("/clustertrainingruntimes") for r in kube_standin.requests)


def test_list_runtimes_errors(capsys, kube_standin, tmp_path):
    kube_standin.fail_next(status=403, path_contains="clustertrainingruntimes")
    code, _, err = cli(capsys, "list-runtimes", "--kubeconfig", str(kube_standin.kubeconfig_path))
    assert code == 1 and "not allowed to list training runtimes (403" in err

    code, _, err = cli(capsys, "list-runtimes", "--kubeconfig", str(tmp_path / "nope"))
    assert code == 2 and "no usable Kubernetes credentials" in err


# --- the compiled workspace ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["finetune-pipeline", "sweep-pipeline", "prepare-inputs", "tune-and-evaluate"]
)
@pytest.mark.slow
def test_golden_pipelines_carry_a_complete_workspace_claim(name):
    """A stock KFP without an admin workspace default accepts them (the size and access mode travel with them)."""
    _, platform = yaml.safe_load_all((COMPILED / f"{name}.yaml").read_text())
    workspace = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]
    assert workspace["size"] == "100Gi"
    assert workspace["kubernetes"]["pvcSpecPatch"] == {"accessModes": ["ReadWriteOnce"]}


def test_workspace_settings_come_from_the_compile_environment(monkeypatch):
    import importlib

    from kfp_finetune.pipelines import settings

    monkeypatch.setenv("KFP_FINETUNE_WORKSPACE_ACCESS_MODE", "ReadWriteMany")
    monkeypatch.setenv("KFP_FINETUNE_WORKSPACE_STORAGE_CLASS", "nfs")
    monkeypatch.setenv("KFP_FINETUNE_WORKSPACE_SIZE", "200Gi")
    try:
        workspace = importlib.reload(settings).pipeline_config().workspace
        assert workspace.size == "200Gi"
        assert workspace.kubernetes.pvcSpecPatch == {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "nfs",
        }
    finally:
        monkeypatch.undo()
        importlib.reload(settings)


def test_run_of_a_pipeline_whose_workspace_lacks_access_modes_is_refused(capsys, kfp_standin, tmp_path):
    """What a stock KFP 2.15+ answers without an admin default: the compiled workspace must be complete."""
    pipeline_doc, platform_doc = yaml.safe_load_all((COMPILED / "prepare-inputs.yaml").read_text())
    platform_doc["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["kubernetes"]["pvcSpecPatch"] = {}
    incomplete = tmp_path / "incomplete.yaml"
    incomplete.write_text(yaml.safe_dump_all([pipeline_doc, platform_doc]))
    params = ["--param", "data_uri=hf://org/data", "--param", "model_uri=hf://org/model"]
    code, _, err = cli(capsys, "run", str(incomplete), *params, "--host", kfp_standin.url)
    assert code == 1 and "workspace PVC spec must specify accessModes" in err
    code, _, err = cli(capsys, "run", "prepare-inputs", *params, "--host", kfp_standin.url)
    assert code == 0, err
