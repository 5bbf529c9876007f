import urllib.request

import boto3
import pytest
from botocore.config import Config

from tests.support.fault_proxy import FaultProxy
from tests.support.sources import moto_s3, use_s3_credentials


@pytest.fixture
def s3_store(monkeypatch):
    """moto's S3 server behind a fault proxy, with a bucket "store": `client` (talks to moto directly, sends no
    CRC, as tools that send none), `proxy` (point the code under test at `proxy.url`), `endpoint` (moto)."""
    from types import SimpleNamespace

    use_s3_credentials(monkeypatch)
    monkeypatch.setenv("KFP_FINETUNE_RETRY_DELAY", "0.01")
    with moto_s3() as endpoint, FaultProxy(endpoint) as proxy:
        # moto keeps its buckets in process-wide state: start from an empty store, whatever ran before.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
        client = boto3.client(
            "s3", endpoint_url=endpoint, config=Config(request_checksum_calculation="when_required")
        )
        client.create_bucket(Bucket="store")
        yield SimpleNamespace(proxy=proxy, client=client, endpoint=endpoint)
