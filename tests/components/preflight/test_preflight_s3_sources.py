"""Pre-flight checks s3:// sources (model_uri, data_uri) as it checks hf:// ones: the prefix exists and holds
objects, and the credentials in the environment may list and read them, at the endpoint the parameters name;
against moto's S3 server, with moto enforcing IAM policies for the users the tests make."""

import boto3
import pytest

from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

LOCAL = {"tune_backend": "local"}


@pytest.fixture
def data(s3):
    """s3://models/data holding one JSONL file (uploaded to moto directly: not among the recorded requests)."""
    boto3.client("s3", endpoint_url=s3.upstream).put_object(
        Bucket="models", Key="data/train.jsonl", Body=b'{"input": "q", "output": "a"}\n'
    )
    return "s3://models/data"


def refused(**arguments) -> str:
    with pytest.raises(PreflightError) as raised:
        run_preflight(**arguments, **LOCAL)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_an_s3_data_source_is_listed_and_read_at_the_endpoint_given(s3, data):
    assert run_preflight(data_uri=data, s3_endpoint_url=s3.url, **LOCAL) == ["data_uri"]
    sent = [(method, path.split("?")[0]) for method, path, _ in s3.requests]
    assert ("GET", "/models") in sent, s3.requests  # ListObjectsV2 of the prefix, through the endpoint given
    assert ("HEAD", "/models/data/train.jsonl") in sent, s3.requests  # one object's metadata: GetObject
    assert not [p for m, p in sent if m == "GET" and p.endswith("train.jsonl")], "no data downloaded"


def test_a_prefix_without_objects_fails_naming_the_parameter_and_the_secret(s3):
    message = refused(data_uri="s3://models/no/such/prefix", s3_endpoint_url=s3.url, s3_secret="team-s3")
    assert "(1) data_uri: no objects under s3://models/no/such/prefix (endpoint http://127.0.0.1" in message
    assert "s3_secret, 'team-s3'" in message


@pytest.mark.slow
def test_a_missing_bucket_fails_before_the_model_is_fetched(s3):
    message = refused(model_uri="s3://no-such-bucket/base", s3_endpoint_url=s3.url)
    assert (
        "pre-flight found 1 problem" in message
        and "(1) model_uri: bucket 'no-such-bucket' does not exist" in message
    )
    assert not [p for m, p, _ in s3.requests if m == "GET" and "config.json" in p], "no model check after it"


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        (
            ["s3:ListBucket"],
            "data_uri: the S3 credentials may list s3://models/data (endpoint http://127.0.0.1",
        ),
        (["s3:GetObject"], "data_uri: access denied to s3://models/data"),
    ],
    ids=["list-only", "read-only"],
)
@pytest.mark.slow
def test_credentials_that_cannot_list_or_read_the_source_fail(s3, data, s3_user, actions, expected):
    s3_user(*actions)
    message = refused(data_uri=data, s3_endpoint_url=s3.url)
    assert expected in message
    if actions == ["s3:ListBucket"]:
        assert "HEAD data/train.jsonl: 403): grant s3:GetObject on the prefix" in message


@pytest.mark.slow
def test_credentials_that_may_list_and_read_pass(s3, data, s3_user):
    s3_user("s3:ListBucket", "s3:GetObject")
    assert run_preflight(data_uri=data, s3_endpoint_url=s3.url, **LOCAL) == ["data_uri"]


def test_credentials_s3_does_not_know_are_named(s3, data, s3_user, monkeypatch):
    s3_user("s3:ListBucket", "s3:GetObject")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    message = refused(data_uri=data, s3_endpoint_url=s3.url)
    assert "data_uri: S3 rejected the credentials for s3://models/data" in message
    assert "SignatureDoesNotMatch" in message and "not-the-secret" not in message
