"""Pre-flight: every check against the real client and a real server or a stand-in speaking the real protocol
(moto's S3 server, the hub stand-in, the Kubernetes stand-in), and one kfp.local run where a bad destination fails
the first step in seconds and nothing downstream starts."""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

import json
import re

import boto3
import pytest

from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight
from tests.pipelines.test_fail_fast import _run_until_a_step_fails
from tests.support import kube_standin as standin
from tests.support.hub_standin import HubStandin
from tests.support.sources import (
    hub_env,
    result,
    run_python,
    use_s3_credentials,
)

kube_standin = standin.kube_standin
LOCAL = {"tune_backend": "local"}


def _problems(error: PreflightError) -> str:
    message = str(error)
    assert "\n" not in message, "one line"
    return message


# --- s3:// against moto's S3 server -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_writable_bucket_passes_and_keeps_no_probe_object(s3):
    assert "export_destination" in run_preflight(
        export_destination="s3://models/team/tuned", s3_endpoint_url=s3.url, **LOCAL
    )
    writes = [(m, p) for m, p, status in s3.requests if m in ("PUT", "DELETE") and status < 300]
    assert [m for m, _ in writes] == ["PUT", "DELETE"], s3.requests
    assert writes[0][1] == writes[1][1] and writes[0][1].startswith("/models/team/tuned/.kfp-finetune-probe-")
    # moto's backend is one per process: other tests' objects may share the bucket, the probe must not be there.
    left = boto3.client("s3", endpoint_url=s3.url).list_objects_v2(
        Bucket="models", Prefix="team/tuned/.kfp-finetune-probe-"
    )
    assert "Contents" not in left


def test_a_missing_bucket_fails_naming_the_parameter(s3):
    with pytest.raises(PreflightError) as failed:
        run_preflight(export_destination="s3://no-such-bucket/tuned", s3_endpoint_url=s3.url, **LOCAL)
    assert re.search(
        r"\(1\) export_destination: bucket 'no-such-bucket' does not exist", _problems(failed.value)
    )


def test_missing_s3_credentials_name_the_secret(s3, monkeypatch, tmp_path):
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(PreflightError) as failed:
        run_preflight(
            export_destination="s3://models/tuned", s3_endpoint_url=s3.url, s3_secret="my-s3", **LOCAL
        )
    message = _problems(failed.value)
    assert "export_destination: no S3 credentials" in message and "s3_secret ('my-s3')" in message
    assert s3.requests == [], "no probe without credentials"


def test_refused_forms_reuse_the_storage_checks(monkeypatch):
    use_s3_credentials(monkeypatch)
    with pytest.raises(PreflightError) as failed:
        run_preflight(export_destination="s3://models", model_uri="gs://bucket/model", **LOCAL)
    message = _problems(failed.value)
    assert "(1) model_uri: invalid storage URI 'gs://bucket/model'" in message
    assert "(2) export_destination: cannot publish to 's3://models': that is the root" in message


# --- local paths ------------------------------------------------------------------------------------------------


def test_a_local_folder_passes_from_its_nearest_existing_parent_and_stays_empty(tmp_path):
    run_preflight(export_destination=str(tmp_path / "models" / "tuned"), **LOCAL)
    assert list(tmp_path.iterdir()) == [], "nothing created, no probe file left"


def test_a_destination_under_a_file_fails(tmp_path):
    (tmp_path / "models").write_text("not a folder")
    with pytest.raises(
        PreflightError, match=r"export_destination: destination .* lies under .*models, which is a file"
    ):
        run_preflight(export_destination=str(tmp_path / "models" / "tuned"), **LOCAL)


def test_an_unwritable_folder_fails():
    """sysfs takes no new files, not even from root (the tests may run as root, whom file modes do not stop)."""
    with pytest.raises(PreflightError) as failed:
        run_preflight(export_destination="/sys/kfp-finetune/tuned", **LOCAL)
    assert re.search(
        r"export_destination: cannot write to /sys/kfp-finetune/tuned \(the export would create it in /sys\): "
        r"Permission denied. Mount a writable volume there",
        _problems(failed.value),
    )


# --- hf:// against the hub stand-in -----------------------------------------------------------------------------

# The hub client reads HF_ENDPOINT and offline mode at import: scenarios run in a child per token.
SCENARIOS = """
    import json, sys
    from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

    def attempt(arguments):
        try:
            return {"done": run_preflight(tune_backend="local", **arguments)}
        except PreflightError as error:
            return {"error": str(error)}

    print(json.dumps({key: attempt(arguments) for key, arguments in json.loads(sys.argv[1]).items()}))
"""


@pytest.fixture(scope="module")
def hub_results(tmp_path_factory, tiny_llama):
    tmp = tmp_path_factory.mktemp("hub")
    model = tiny_llama  # a real model: pre-flight resolves the run from its config and tokenizer files
    with HubStandin() as hub:
        hub.add_repo("org/tiny", model)
        hub.add_repo("org/gated", model, gated=True, tokens=("hf_write",))
        hub.add_token("hf_write", "alice", orgs={"acme": "write", "beta": "read"})
        hub.add_token("hf_read", "alice", role="read")
        hub.add_token("hf_fine", "bob", role="fineGrained",
                      scoped=[{"entity": {"type": "org", "name": "acme"}, "permissions": ["repo.write"]}])  # fmt: skip
        by_token = {
            None: {
                "dest": {"export_destination": "hf://alice/tuned", "hf_token_secret": "my-hf"},
                "gated": {"model_uri": "hf://org/gated"},
                "public": {"model_uri": "hf://org/tiny"},
            },
            "hf_read": {"dest": {"export_destination": "hf://alice/tuned"}},
            "hf_unknown": {"dest": {"export_destination": "hf://alice/tuned"}},
            "hf_write": {
                "own": {"export_destination": "hf://alice/tuned"},
                "org": {"export_destination": "hf://acme/tuned/sub@main", "model_uri": "hf://org/gated"},
                "org_read": {"export_destination": "hf://beta/tuned"},
                "other": {"export_destination": "hf://carol/tuned"},
            },
            "hf_fine": {
                "scoped": {"export_destination": "hf://acme/tuned"},
                "unscoped": {"export_destination": "hf://bob/tuned"},
                "gated": {"model_uri": "hf://org/gated"},
            },
        }
        results = {
            token: result(
                run_python(SCENARIOS, hub_env(hub.endpoint, tmp, token=token), json.dumps(scenarios))
            )
            for token, scenarios in by_token.items()
        }
        results["repos"] = sorted(repo_id for _, repo_id in hub.repos)
        results["requests"] = hub.requests
        yield results


@pytest.mark.slow
def test_a_write_token_passes_for_its_namespaces_and_creates_nothing(hub_results):
    assert hub_results["hf_write"]["own"] == {"done": ["export_destination"]}
    assert hub_results["hf_write"]["org"] == {"done": ["export_destination", "model_uri", "model"]}
    assert hub_results["hf_fine"]["scoped"] == {"done": ["export_destination"]}
    assert hub_results["repos"] == ["org/gated", "org/tiny"], "the probe created no repo"
    assert not [p for m, p, _ in hub_results["requests"] if m in ("POST", "PUT")], "nothing written"


@pytest.mark.parametrize(
    "token, case, expected",
    [
        (
            None,
            "dest",
            r"export_destination: pushing to the hub needs a write token .*hf_token_secret \('my-hf'\)",
        ),
        ("hf_read", "dest", r"export_destination: cannot push to hf://alice/tuned: .*'alice'\) is read-only"),
        ("hf_unknown", "dest", r"export_destination: the hub refuses the token in HF_TOKEN \(401"),
        ("hf_write", "org_read", r"export_destination: .*has only the 'read' role in 'beta'"),
        ("hf_write", "other", r"export_destination: .*may not write to the namespace 'carol'"),
        ("hf_fine", "unscoped", r"export_destination: .*no repo.write permission on 'bob'"),
    ],
)
@pytest.mark.slow
def test_a_token_that_cannot_push_fails_naming_why(hub_results, token, case, expected):
    assert re.search(expected, hub_results[token][case]["error"]), hub_results[token][case]


def test_a_gated_source_is_probed_with_the_token(hub_results):
    assert hub_results[None]["public"] == {"done": ["model_uri", "model"]}
    no_token = hub_results[None]["gated"]["error"]
    assert re.search(
        r"model_uri: model repo 'org/gated' .*is gated \(401\) and HF_TOKEN is not set", no_token
    )
    assert "hf_token_secret ('hf-token')" in no_token
    refused = hub_results["hf_fine"]["gated"]["error"]
    assert re.search(r"model_uri: .*is gated and the token in HF_TOKEN has no access \(403\)", refused)
    probes = [(m, status) for m, p, status in hub_results["requests"] if "/org/gated/resolve/" in p]
    assert ("HEAD", 200) in probes and ("HEAD", 401) in probes and ("HEAD", 403) in probes, probes
    # Refused tokens read metadata only; the accepted one (hf_write) fetched the config and tokenizer files.
    fetched = [p for m, p, status in hub_results["requests"] if m == "GET" and "/org/gated/resolve/" in p]
    assert all(status == 200 for m, status in probes if m == "GET"), probes
    assert fetched and not [p for p in fetched if ".safetensors" in p], "no weights downloaded"


# --- the runtime, against the Kubernetes stand-in --------------------------------------------------------------


def test_the_runtime_must_exist_on_the_cluster(kube_standin, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(kube_standin.kubeconfig_path))
    assert run_preflight(tune_runtime="torch-distributed") == ["tune_runtime"]
    with pytest.raises(PreflightError) as failed:
        run_preflight(tune_runtime="torchtune")
    assert "(1) tune_runtime: ClusterTrainingRuntime 'torchtune' not found: install" in _problems(
        failed.value
    )
    with pytest.raises(
        PreflightError, match=r"TrainingRuntime 'torch-distributed' not found in namespace team-a"
    ):
        run_preflight(tune_runtime="torch-distributed", tune_runtime_kind="TrainingRuntime")
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    assert run_preflight(tune_runtime="torchtune", tune_backend="local") == [], "skipped for local"


@pytest.mark.slow
def test_every_problem_is_listed_in_one_line(kube_standin, s3, monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(kube_standin.kubeconfig_path))
    with pytest.raises(PreflightError) as failed:
        run_preflight(
            export_destination="s3://no-such-bucket/tuned", s3_endpoint_url=s3.url, tune_runtime="nope"
        )
    message = _problems(failed.value)
    assert message.startswith(
        "pre-flight found 2 problems, no weights were downloaded, nothing was trained: (1) export_destination"
    )
    assert "| (2) tune_runtime: ClusterTrainingRuntime 'nope' not found" in message


# --- the pipeline: the first step fails in seconds, nothing downstream starts ----------------------------------


@pytest.mark.slow
def test_a_bad_destination_fails_the_first_step_and_nothing_downstream_starts(s3, tmp_path, capfd):
    failure, output, seconds = _run_until_a_step_fails(
        tmp_path, capfd, model_uri=str(tmp_path / "model"), data_uri=str(tmp_path / "data.jsonl"),
        export_destination="s3://no-such-bucket/tuned", s3_endpoint_url=s3.url,
    )  # fmt: skip
    assert "Inner task failed: 'preflight'" in failure
    assert output.count("Executing task 'preflight'") == 1, "the step ran once: no retry"
    for downstream in ("model-initialize", "dataset-initialize", "torchtune-finetune"):
        assert f"Executing task '{downstream}'" not in output, f"{downstream} started"
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    assert len(errors) == 1 and "export_destination: bucket 'no-such-bucket' does not exist" in errors[0], (
        errors
    )
    assert "Traceback" not in output
    assert seconds < 30, f"took {seconds:.0f} s"


def test_a_bad_tune_setting_fails_the_first_step_before_model_initialize_starts(tiny_llama, tmp_path, capfd):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"input": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(8)))
    failure, output, _ = _run_until_a_step_fails(
        tmp_path, capfd, model_uri=str(tiny_llama), data_uri=str(data), tune_method="lorra", tune_device="cpu",
        tune_gpus_per_node=0,
    )  # fmt: skip
    assert "Inner task failed: 'preflight'" in failure
    for downstream in ("model-initialize", "dataset-initialize", "torchtune-finetune"):
        assert f"Executing task '{downstream}'" not in output, f"{downstream} started"
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    assert len(errors) == 1 and "(1) tune_method: must be one of full, lora, qlora, dora (got 'lorra'): did you " \
        "mean 'lora'?" in errors[0], errors  # fmt: skip


@pytest.mark.slow
def test_an_s3_model_is_resolved_from_its_config_and_tokenizer_alone(s3, tiny_llama):
    bucket = boto3.client("s3", endpoint_url=s3.url)
    for path in (p for p in tiny_llama.rglob("*") if p.is_file()):
        bucket.upload_file(str(path), "models", f"base/tiny/{path.relative_to(tiny_llama).as_posix()}")
    assert run_preflight(model_uri="s3://models/base/tiny", s3_endpoint_url=s3.url, **LOCAL) == [
        "model_uri",
        "model",
    ]
    fetched = {p.split("?")[0] for m, p, status in s3.requests if m == "GET" and status == 200}
    assert (
        "/models/base/tiny/config.json" in fetched and "/models/base/tiny/original/tokenizer.model" in fetched
    )
    assert not [p for p in fetched if p.endswith(".safetensors")], fetched


def test_the_kueue_queue_must_exist_on_the_cluster(kube_standin, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(kube_standin.kubeconfig_path))
    kube_standin.add_local_queue("team-queue")
    queued = {"tune_runtime": "torch-distributed", "settings": {"tune_queue_name": "team-queue"}}
    assert run_preflight(**queued) == ["tune_runtime", "tune_queue_name"]
    with pytest.raises(PreflightError) as failed:
        run_preflight(tune_runtime="torch-distributed", settings={"tune_queue_name": "gpu-queue"})
    assert (
        "(1) tune_queue_name: Kueue LocalQueue 'gpu-queue' not found in namespace team-a (or Kueue is not "
        "installed): `kubectl get localqueues -n team-a` lists the queues" in _problems(failed.value)
    )
    with pytest.raises(PreflightError) as failed:
        run_preflight(tune_runtime="torch-distributed", settings={"tune_queue_name": "GPU_queue"})
    assert "(1) tune_queue_name: must name a Kueue object" in _problems(failed.value)
    assert not kube_standin.requests_for("GET", "localqueues", name="GPU_queue"), (
        "a bad name is not looked up"
    )
