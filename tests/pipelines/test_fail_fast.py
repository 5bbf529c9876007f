"""Errors in seconds: bad input fails its step at once with one clear line, only transient errors are retried
(in-process, counted against real servers), and the pipelines carry no KFP-level retry that would repeat a typo."""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

import json
import re
import time
import urllib.error

import pytest
import yaml
from kfp import compiler, local

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.errors import usage_errors
from kfp_finetune.components._shared.kube.client import is_retryable
from kfp_finetune.pipelines import PIPELINES, finetune_pipeline
from tests.support.fault_proxy import FaultProxy
from tests.support.sources import moto_s3, use_s3_credentials

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- no KFP-level retries -------------------------------------------------------------------------------------


def _tasks(spec: dict):
    for dag in [spec["root"], *spec["components"].values()]:
        yield from (dag.get("dag") or {}).get("tasks", {}).items()


@pytest.mark.parametrize("name", sorted(PIPELINES))
@pytest.mark.slow
def test_only_the_fine_tune_has_a_kfp_retry_policy(name, tmp_path):
    """KFP cannot tell a typo from a network blip: a retry policy repeats a permanent error for minutes. The one
    exception is the fine-tune, which sorts its own failures (attempts.py: only preemption, eviction and node loss
    train again, from the newest checkpoint)."""
    target = tmp_path / f"{name}.yaml"
    compiler.Compiler().compile(PIPELINES[name], str(target))
    spec = next(yaml.safe_load_all(target.read_text()))
    tasks = dict(_tasks(spec))
    assert tasks, "the pipeline has tasks"
    retried = sorted(task for task, body in tasks.items() if "retryPolicy" in body)
    assert retried in ([], ["torchtune-finetune"]), f"tasks with a KFP retry policy: {retried}"
    if "torchtune-finetune" in tasks:
        assert retried == ["torchtune-finetune"]


# --- bad input fails its step at once, with one clear line ----------------------------------------------------


def _run_until_a_step_fails(tmp_path, capfd, **arguments):
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "pipeline_root"),
        workspace_root=str(tmp_path / "workspace"),
    )
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="finished with status .*FAILURE") as failed:
        finetune_pipeline(
            **{"export_destination": str(tmp_path / "exported"), "tune_backend": "local", **arguments}
        )
    seconds = time.monotonic() - started
    return _ANSI.sub("", str(failed.value)), _ANSI.sub("", capfd.readouterr().out), seconds


def _qa_file(tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": f"a{i}"}) + "\n" for i in range(20)))
    return path


@pytest.mark.parametrize(
    "case, failing_step, error",
    [
        ("data_uri typo", "dataset-initialize", r"error: .*trian\.jsonl.*no such file or directory"),
        ("missing column", "dataset-initialize", r"error: .*'input'.*\['question', 'answer'\].*column_map"),
        ("model_uri typo", "preflight", r"error: .*model_uri: .*tiny-lama.*no such file or directory"),
    ],
)
@pytest.mark.slow
def test_bad_input_fails_its_step_at_once_with_one_clear_message(
    case, failing_step, error, tiny_llama, tiny_dataset, tmp_path, capfd
):
    data_uri = {
        "data_uri typo": str(tiny_dataset["train.jsonl"].parent / "trian.jsonl"),
        "missing column": str(_qa_file(tmp_path)),
    }.get(case, str(tiny_dataset["train.jsonl"]))
    model_uri = str(tiny_llama.parent / "tiny-lama") if case == "model_uri typo" else str(tiny_llama)

    failure, output, seconds = _run_until_a_step_fails(
        tmp_path, capfd, model_uri=model_uri, data_uri=data_uri
    )

    assert f"Inner task failed: '{failing_step}'" in failure
    assert output.count(f"Executing task '{failing_step}'") == 1, "the step ran once: no retry"
    assert "Executing task 'torchtune-finetune'" not in output, "nothing downstream started"
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    assert len(errors) == 1 and re.search(error, errors[0]), errors
    assert "Traceback" not in output, "a known error is one line, not a traceback"
    assert seconds < 30, f"took {seconds:.0f} s"  # generous: it takes about 2 s here


def test_a_usage_error_prints_one_line_and_anything_else_keeps_its_traceback(capsys):
    with pytest.raises(SystemExit) as ended, usage_errors(storage.StorageError):
        raise storage.StorageError("s3://bucket/data: no such object. Check the prefix.")
    assert ended.value.code == 1
    assert capsys.readouterr().err == "error: s3://bucket/data: no such object. Check the prefix.\n"
    with pytest.raises(KeyError), usage_errors(storage.StorageError):
        raise KeyError("a bug")
    assert capsys.readouterr().err == ""


# --- only transient errors are retried, in-process ------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server behind a proxy that counts requests and injects 503 SlowDown bursts."""
    import boto3

    use_s3_credentials(monkeypatch)
    monkeypatch.setenv("KFP_FINETUNE_RETRY_DELAY", "0.05")
    with moto_s3() as endpoint, FaultProxy(endpoint) as proxy:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="data")
        client.put_object(Bucket="data", Key="sets/train.jsonl", Body=b'{"input": "a", "output": "b"}\n')
        yield proxy


def _listings(proxy: FaultProxy) -> list[int]:
    return [status for method, path, status in proxy.requests if method == "GET" and "list-type=2" in path]


@pytest.mark.parametrize(
    "uri, message",
    [
        ("s3://no-such-bucket/sets", "bucket 'no-such-bucket' does not exist"),
        ("s3://data/setz", "no objects"),
    ],
)
def test_a_missing_bucket_or_prefix_is_asked_for_once(s3, uri, message):
    with pytest.raises(storage.StorageError, match=message):
        storage.list_files(uri, endpoint_url=s3.url)
    assert len(_listings(s3)) == 1, s3.requests


@pytest.mark.slow
def test_a_503_burst_is_retried_until_it_passes(s3):
    s3.fail_next(4)  # all of botocore's own attempts (1 + max_attempts=3 retries): our retry takes over
    listing = storage.list_files("s3://data/sets", endpoint_url=s3.url)
    assert [f.path for f in listing.files] == ["train.jsonl"]
    assert _listings(s3) == [503, 503, 503, 503, 200]


@pytest.mark.slow
def test_a_503_burst_longer_than_every_attempt_fails_with_the_servers_answer(s3, monkeypatch):
    monkeypatch.setenv("KFP_FINETUNE_RETRIES", "2")
    s3.fail_next(100)
    with pytest.raises(Exception, match="SlowDown"):
        storage.list_files("s3://data/sets", endpoint_url=s3.url)
    assert _listings(s3) == [503] * 8, "our 2 attempts of botocore's 4"


def _http_error(code: int) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("https://example.org/x", code, "status", {}, None)


@pytest.mark.parametrize(
    "code, transient", [(400, False), (401, False), (403, False), (404, False), (408, True), (429, True),
                        (500, True), (503, True)],
)  # fmt: skip
def test_storage_retries_only_timeouts_throttling_and_server_errors(code, transient):
    assert storage.is_transient(_http_error(code)) is transient


def test_a_validation_error_raised_while_handling_a_network_error_is_permanent():
    try:
        try:
            raise ConnectionResetError("peer reset")
        except ConnectionResetError:
            raise ValueError("invalid storage URI 's3:/x'") from None
    except ValueError as error:
        assert error.__context__ is not None
        assert storage.is_transient(error) is False
    try:
        raise ConnectionResetError("peer reset")
    except ConnectionResetError as error:
        assert storage.is_transient(error) is True


@pytest.mark.parametrize(
    "status, retried", [(400, False), (403, False), (404, False), (409, False), (422, False), (408, True),
                        (429, True), (500, True), (503, True), (0, True)],
)  # fmt: skip
def test_kubernetes_calls_retry_only_timeouts_throttling_and_server_errors(status, retried):
    from kubernetes.client.exceptions import ApiException

    assert is_retryable(ApiException(status=status)) is retried


def test_kubernetes_client_validation_errors_are_permanent():
    from kubernetes.client.exceptions import ApiValueError
    from urllib3.exceptions import LocationValueError, ProtocolError

    assert is_retryable(LocationValueError("No host specified.")) is False
    assert is_retryable(ApiValueError("Missing the required parameter `name`")) is False
    assert is_retryable(ProtocolError("Connection aborted.")) is True
