"""What a retried download keeps of an earlier attempt's partial folder (issue 24 items 2 and 9). The source is
moto's S3 with multipart uploads, which state no checksum of the content (the ETag is no MD5): the journal an
earlier attempt wrote is then the only record of what a leftover held, and it counts only for bytes hashed again
in this attempt."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage import checksums
from kfp_finetune.components._shared.workspace import PARTIAL_JOURNAL
from tests.support.sources import damage_in_place, upload_multipart

NAMES = ["a.bin", "b.bin", "c.bin"]


def gets(proxy, key: str) -> int:
    return sum(1 for m, p, _ in proxy.requests if m == "GET" and p.split("?")[0] == f"/store/{key}")


@pytest.fixture
def interrupted(s3_store, tmp_path):
    """An attempt that verified a.bin and b.bin into `dest` (journaled) and failed on c.bin, as a killed or failed
    step leaves its partial folder; returns (s3_store, listing, source folder, dest)."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for name in NAMES:
        (src / name).write_bytes(rng.bytes(1 << 16))
    upload_multipart(s3_store.client, src, "store", "data")
    listing = storage.list_files("s3://store/data", endpoint_url=s3_store.proxy.url)
    # Multipart: the ETag is no MD5, and no checksum was sent.
    assert not any(f.md5 or f.sha256 for f in listing.files), listing.files
    dest = tmp_path / "dest"
    s3_store.proxy.truncate("store/data/c.bin", times=2)
    with pytest.raises(storage.IntegrityError, match="c.bin"):
        storage.download(listing, NAMES, dest)
    journaled = [json.loads(line)["path"] for line in (dest / PARTIAL_JOURNAL).read_text().splitlines()]
    assert sorted(journaled) == ["a.bin", "b.bin"] and not (dest / "c.bin").exists()
    return s3_store, listing, src, dest


def retry(interrupted) -> dict[str, storage.FileRecord]:
    s3_store, listing, src, dest = interrupted
    checksums.hashed.clear()
    records = {r.path: r for r in storage.download(listing, NAMES, dest)}
    for name in NAMES:
        assert (dest / name).read_bytes() == (src / name).read_bytes()
        assert records[name].sha256 == hashlib.sha256((src / name).read_bytes()).hexdigest()
    return records


def truncate_and_extend_sparse(path: Path) -> None:
    """Cut to half and extend back to the size (the tail reads as zeros), mtime set back."""
    stat = path.stat()
    os.truncate(path, stat.st_size // 2)
    os.truncate(path, stat.st_size)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.mark.parametrize("damage", [damage_in_place, truncate_and_extend_sparse])
@pytest.mark.slow
def test_a_journaled_file_damaged_with_its_size_and_mtime_kept_is_fetched_again(interrupted, damage):
    s3_store, _, _, dest = interrupted
    damage(dest / "a.bin")
    retry(interrupted)
    assert gets(s3_store.proxy, "data/a.bin") == 2  # the journal's word was not taken for it
    assert gets(s3_store.proxy, "data/b.bin") == 1  # kept: hashed in this attempt and found as journaled


@pytest.mark.slow
def test_a_journaled_file_rewritten_in_place_is_fetched_again(interrupted):
    s3_store, _, _, dest = interrupted
    (dest / "a.bin").write_bytes(b"\0" * (dest / "a.bin").stat().st_size)  # same size, a new mtime
    retry(interrupted)
    assert gets(s3_store.proxy, "data/a.bin") == 2 and gets(s3_store.proxy, "data/b.bin") == 1


@pytest.mark.slow
def test_a_leftover_of_the_right_size_that_no_journal_vouches_for_is_fetched_again(interrupted):
    s3_store, _, src, dest = interrupted
    (dest / PARTIAL_JOURNAL).unlink()  # a leftover whose source states no checksum: its size proves nothing
    (dest / "a.bin").write_bytes((src / "a.bin").read_bytes()[::-1])
    retry(interrupted)
    assert gets(s3_store.proxy, "data/a.bin") == 2 and gets(s3_store.proxy, "data/b.bin") == 2


@pytest.mark.slow
def test_kept_files_are_hashed_once_in_the_retry(interrupted):
    s3_store, _, _, dest = interrupted
    kept = os.stat(dest / "b.bin")
    retry(interrupted)
    assert gets(s3_store.proxy, "data/b.bin") == 1
    assert checksums.hashed[(kept.st_dev, kept.st_ino)] == kept.st_size  # once: the journal is not the proof


def test_content_a_source_states_nothing_about_but_its_size_is_never_taken_as_unchanged(tmp_path):
    """An https server without ETag / Last-Modified: a journal entry or an earlier fingerprint cannot be tied to
    this version, so neither counts."""
    from kfp_finetune.components._shared.storage.fetch import Journal

    remote = storage.RemoteFile("train.jsonl", 9, "https://host/train.jsonl")
    listing = storage.Listing(storage.parse_uri("https://host/train.jsonl"), [remote])
    assert listing.fingerprint(["train.jsonl"]) != listing.fingerprint(["train.jsonl"])
    journal = Journal(tmp_path / PARTIAL_JOURNAL)
    journal.add(storage.FileRecord("train.jsonl", 9, "0" * 64), remote)
    assert journal.recorded_sha256(remote) is None
    remote.stated = {"last_modified": "Tue, 14 Nov 2023 22:13:20 GMT"}
    journal.add(storage.FileRecord("train.jsonl", 9, "0" * 64), remote)
    assert journal.recorded_sha256(remote) == "0" * 64


@pytest.mark.slow
def test_an_s3_version_id_and_whole_object_sha256_are_part_of_the_identity(s3_store, tmp_path):
    """What only a HEAD states: a versioned bucket's version id, and the x-amz-checksum-sha256 of an object put
    whole, which is its sha256: a leftover is then proven by S3's own checksum, with no journal."""
    client = s3_store.client
    client.put_bucket_versioning(Bucket="store", VersioningConfiguration={"Status": "Enabled"})
    data = np.random.default_rng(1).bytes(1 << 15)
    client.put_object(Bucket="store", Key="v/a.bin", Body=data, ChecksumAlgorithm="SHA256")
    listing = storage.list_files("s3://store/v", endpoint_url=s3_store.proxy.url)
    before = listing.fingerprint(["a.bin"])
    (remote,) = listing.files
    assert remote.sha256 == hashlib.sha256(data).hexdigest() and remote.stated["version_id"]
    assert remote.stated["checksum_sha256"]

    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "a.bin").write_bytes(data)  # a leftover, no journal: S3's sha256 vouches for it
    (record,) = storage.download(listing, ["a.bin"], dest)
    assert record.sha256 == remote.sha256 and gets(s3_store.proxy, "v/a.bin") == 0

    client.put_object(
        Bucket="store", Key="v/a.bin", Body=data, ChecksumAlgorithm="SHA256"
    )  # same bytes again
    again = storage.list_files("s3://store/v", endpoint_url=s3_store.proxy.url)
    assert again.fingerprint(["a.bin"]) != before  # another version, though its bytes are the same
