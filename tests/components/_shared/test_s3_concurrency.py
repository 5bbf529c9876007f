"""S3 transfers really use many connections: boto3 against moto's S3 server behind the recording proxy, whose
barrier holds requests until N are in flight at once (no timing: a client that never has N in flight leaves the
proxy's `peak` below N after the barrier gives up)."""

from __future__ import annotations

from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage import s3 as s3_scheme
from tests.support.fault_proxy import FaultProxy
from tests.support.sources import moto_s3, use_s3_credentials

IN_FLIGHT = 32


@pytest.fixture
def s3(monkeypatch):
    use_s3_credentials(monkeypatch)
    with moto_s3() as endpoint, FaultProxy(endpoint) as proxy:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="store")
        yield SimpleNamespace(proxy=proxy, client=client)


@pytest.mark.slow
def test_a_download_of_many_objects_has_32_requests_in_flight(s3, tmp_path):
    for i in range(40):
        s3.client.put_object(Bucket="store", Key=f"data/shard-{i:02d}.parquet", Body=f"rows {i}".encode())
    s3.proxy.barrier(IN_FLIGHT, "GET")
    listing = storage.list_files("s3://store/data", endpoint_url=s3.proxy.url)
    # The components' default max_workers (8): the S3 module itself sizes the parallelism to its pool.
    records = storage.download(listing, [f.path for f in listing.files], tmp_path / "out", max_workers=8)
    assert len(records) == 40
    assert s3.proxy.peak >= IN_FLIGHT, f"at most {s3.proxy.peak} GETs in flight at once"


@pytest.mark.slow
def test_a_multipart_upload_has_32_parts_in_flight(s3, tmp_path, monkeypatch):
    # S3's smallest part (5 MiB) keeps the file small; the pool and concurrency are the real settings.
    part = 5 << 20
    monkeypatch.setattr(s3_scheme, "PART_SIZE", part)
    src = tmp_path / "model"
    src.mkdir()
    with open(src / "model.safetensors", "wb") as f:
        f.truncate(IN_FLIGHT * part)
    s3.proxy.barrier(IN_FLIGHT, "PUT", query="partNumber=")
    result = storage.publish_directory(src, "s3://store/models/m", endpoint_url=s3.proxy.url)
    assert result.uploaded == ["model.safetensors"]
    parts = [r for r in s3.proxy.requests if r[0] == "PUT" and "partNumber=" in r[1]]
    assert len(parts) == IN_FLIGHT
    assert s3.proxy.peak >= IN_FLIGHT, f"at most {s3.proxy.peak} UploadPart requests in flight at once"
