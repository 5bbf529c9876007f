"""The S3 server pre-flight's tests share: moto's S3 server behind a fault proxy that records every request, with
a `models` bucket, and S3 users whose IAM policy moto enforces."""

import json
import urllib.request
import uuid

import boto3
import pytest

from tests.support.fault_proxy import FaultProxy
from tests.support.sources import moto_s3, use_s3_credentials


@pytest.fixture
def s3(monkeypatch):
    """The proxy in front of moto (`url`, `requests`); `s3.upstream` is moto itself, for the tests' own setup."""
    use_s3_credentials(monkeypatch)
    monkeypatch.setenv("KFP_FINETUNE_RETRY_DELAY", "0.05")
    with moto_s3() as endpoint, FaultProxy(endpoint) as proxy:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="models")
        proxy.upstream = endpoint
        yield proxy


@pytest.fixture
def s3_user(s3, monkeypatch):
    """`s3_user(*actions)` puts the credentials of a new IAM user allowed only `actions` on the `models` bucket in
    the environment, and from then on moto checks every request against IAM as AWS does (its `reset-auth`
    switch, which the fixture turns off again)."""
    iam = boto3.client("iam", endpoint_url=s3.upstream)
    users = []

    def make(*actions: str) -> None:
        name = f"preflight-{uuid.uuid4().hex[:8]}"  # moto keeps one IAM backend per process
        iam.create_user(UserName=name)
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": list(actions),
                    "Resource": ["arn:aws:s3:::models", "arn:aws:s3:::models/*"],
                }
            ],
        }
        iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        if not users:
            _reset_auth(s3.upstream, "0")
        users.append(name)

    yield make
    if users:
        _reset_auth(s3.upstream, "inf")


def _reset_auth(endpoint: str, count: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=count.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},  # a form body would be parsed away before moto reads it
    )
    urllib.request.urlopen(request, timeout=10).close()  # noqa: S310 (moto on 127.0.0.1)
