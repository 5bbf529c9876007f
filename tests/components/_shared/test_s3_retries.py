"""S3 retries that run out (botocore's `SlowDown … reached max retries`, s3transfer's RetriesExceededError) end in
one clear line naming the object and the status, not a raw traceback naming no key: boto3 against moto's S3
server behind the fault proxy, which answers 503 SlowDown as S3 does under load, or drops a connection half-way."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components.model_initialize.component import model_initialize
from tests.support.fault_proxy import FaultProxy
from tests.support.sources import moto_s3, use_s3_credentials, write_fake_model

ALWAYS = 10_000  # more failures than any retry budget


@pytest.fixture
def s3(monkeypatch, tmp_path):
    """Bucket `retries` holding a model under `base/`, behind the fault proxy; our own retries: one attempt
    (botocore still makes its three)."""
    use_s3_credentials(monkeypatch)
    monkeypatch.setenv("KFP_FINETUNE_RETRIES", "1")
    with moto_s3() as endpoint, FaultProxy(endpoint) as proxy:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="retries")
        model = write_fake_model(tmp_path / "model", extra_bin=False)
        for path in (p for p in model.rglob("*") if p.is_file()):
            client.upload_file(str(path), "retries", f"base/{path.relative_to(model).as_posix()}")
        yield proxy


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


@pytest.mark.slow
def test_a_listing_that_keeps_getting_slow_down_names_the_prefix_and_the_status(s3):
    s3.fail_next(ALWAYS)
    with pytest.raises(storage.StorageError) as gave_up:
        storage.list_files("s3://retries/base", endpoint_url=s3.url)
    assert one_line(gave_up.value).startswith(
        "S3 kept answering SlowDown (HTTP 503) to ListObjectsV2 for s3://retries/base (endpoint "
    )


def test_a_download_that_keeps_getting_503_names_the_key_and_the_status(s3, tmp_path):
    listing = storage.list_files("s3://retries/base", endpoint_url=s3.url)
    s3.fail_next(ALWAYS)
    with pytest.raises(storage.StorageError) as gave_up:
        storage.download(listing, ["model.safetensors"], tmp_path / "out")
    # A HEAD answer has no body, so no error code: the status alone.
    assert one_line(gave_up.value).startswith(
        "S3 kept answering HTTP 503 to HeadObject for s3://retries/base/model.safetensors (endpoint "
    )


@pytest.mark.slow
def test_a_download_whose_connection_keeps_dropping_names_the_key(s3, tmp_path):
    listing = storage.list_files("s3://retries/base", endpoint_url=s3.url)
    s3.drop("retries/base/model.safetensors", times=ALWAYS)
    with pytest.raises(storage.StorageError) as gave_up:
        storage.download(listing, ["model.safetensors"], tmp_path / "out")
    message = one_line(gave_up.value)
    assert message.startswith("reading s3://retries/base/model.safetensors (endpoint "), message
    assert "broke off on every attempt (IncompleteReadError" in message
    drops = [r for r in s3.requests if r[0] == "GET" and r[1].startswith("/retries/base/model.safetensors")]
    assert len(drops) > 1, "s3transfer retried before giving up"


@pytest.mark.slow
def test_an_upload_that_keeps_getting_slow_down_names_the_key_and_the_status(s3, tmp_path):
    folder = tmp_path / "tuned"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    s3.fail_next(ALWAYS, method="PUT")
    with pytest.raises(storage.StorageError) as gave_up:
        storage.publish_directory(folder, "s3://retries/tuned", endpoint_url=s3.url)
    assert one_line(gave_up.value).startswith(
        "S3 kept answering SlowDown (HTTP 503) to PutObject for s3://retries/tuned/"
    )


@pytest.mark.slow
def test_the_step_fails_with_that_one_line_and_no_traceback(s3, tmp_path, capsys):
    s3.fail_next(
        ALWAYS, method="HEAD"
    )  # the listing goes through; every object's transfer starts with a HEAD
    with pytest.raises(SystemExit):
        model_initialize.python_func(
            source_uri="s3://retries/base", workspace_path=str(tmp_path / "ws"), s3_endpoint_url=s3.url,
            model=SimpleNamespace(path=str(tmp_path / "model.json"), metadata={}),
        )  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: S3 kept answering HTTP 503 to HeadObject for s3://retries/base/"), (
        errors
    )
