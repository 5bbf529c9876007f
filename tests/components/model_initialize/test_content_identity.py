"""Identity by content (issue 24 items 1-2): a base model re-uploaded to the same S3 prefix with the same file sizes
(a retrained model of the same architecture, uploaded multipart, so S3 states no MD5) reaches the next run, with
the model cache and without; a retry after the source changed never mixes two versions; a cache entry or a
workspace copy changed in place (same size, mtime set back) is found, discarded and filled again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components.model_initialize.initialize import initialize_model
from tests.support.sources import damage_in_place, upload_multipart, write_fake_model

SHARDS = [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]


def model_versions(tmp_path: Path) -> tuple[Path, Path]:
    """Two trainings of one architecture: every file has the same size, the weights differ."""
    old = write_fake_model(tmp_path / "old", shards=4, extra_bin=False, seed=0)
    new = write_fake_model(tmp_path / "new", shards=4, extra_bin=False, seed=1)
    for path in old.rglob("*"):
        if path.is_file():
            assert path.stat().st_size == (new / path.relative_to(old)).stat().st_size
    assert (old / SHARDS[0]).read_bytes() != (new / SHARDS[0]).read_bytes()
    return old, new


def gets(proxy, key: str) -> int:
    return sum(1 for m, p, _ in proxy.requests if m == "GET" and p.split("?")[0] == f"/store/{key}")


def same_weights(model_dir: Path, src: Path) -> bool:
    return all((model_dir / s).read_bytes() == (src / s).read_bytes() for s in SHARDS)


@pytest.mark.slow
def test_a_model_re_uploaded_with_the_same_sizes_reaches_the_next_run_through_the_cache(s3_store, tmp_path):
    old, new = model_versions(tmp_path)
    upload_multipart(s3_store.client, old, "store", "base")
    cache = str(tmp_path / "cache")
    first = initialize_model("s3://store/base", str(tmp_path / "ws1"), name="m", cache_path=cache,
                             s3_endpoint_url=s3_store.endpoint, task_id="run-1")  # fmt: skip
    assert same_weights(first.path, old)
    upload_multipart(s3_store.client, new, "store", "base")
    second = initialize_model("s3://store/base", str(tmp_path / "ws2"), name="m", cache_path=cache,
                              s3_endpoint_url=s3_store.endpoint, task_id="run-2")  # fmt: skip
    assert second.metadata["cache"]["hit"] is False and second.metadata["cache"]["bytes_fetched"] > 0
    assert same_weights(second.path, new)
    assert second.manifest["fingerprint"] != first.manifest["fingerprint"]
    assert same_weights(Path(first.metadata["cache"]["entry"]), old)  # the entry another run may train from


@pytest.mark.slow
def test_a_model_re_uploaded_with_the_same_sizes_reaches_a_re_run_into_the_same_workspace(s3_store, tmp_path):
    old, new = model_versions(tmp_path)
    upload_multipart(s3_store.client, old, "store", "base")
    workspace = str(tmp_path / "ws")
    first = initialize_model("s3://store/base", workspace, name="m", s3_endpoint_url=s3_store.endpoint)
    upload_multipart(s3_store.client, new, "store", "base")
    again = initialize_model("s3://store/base", workspace, name="m", s3_endpoint_url=s3_store.endpoint)
    assert again.path == first.path and not again.skipped
    assert same_weights(again.path, new)


@pytest.mark.slow
def test_a_retry_after_the_source_changed_fetches_the_new_version_whole(s3_store, tmp_path, log_lines):
    """A first attempt ends with shards 1-2 verified in the partial folder and 3-4 failed (as a kill leaves it);
    the model is re-uploaded; the retry must not keep shards 1-2 of the old model beside 3-4 of the new one."""
    old, new = model_versions(tmp_path)
    upload_multipart(s3_store.client, old, "store", "base")
    for shard in SHARDS[2:]:
        s3_store.proxy.truncate(f"store/base/{shard}", times=2)
    workspace = tmp_path / "ws"
    with pytest.raises(storage.IntegrityError):
        initialize_model("s3://store/base", str(workspace), name="m", s3_endpoint_url=s3_store.proxy.url)
    partial = workspace / "models" / ".m.partial"
    assert all((partial / s).read_bytes() == (old / s).read_bytes() for s in SHARDS[:2])

    upload_multipart(s3_store.client, new, "store", "base")
    res = initialize_model("s3://store/base", str(workspace), name="m", s3_endpoint_url=s3_store.proxy.url)
    assert same_weights(res.path, new)
    assert any("changed at the source since an earlier attempt" in line and SHARDS[0] in line
               for line in log_lines), log_lines  # fmt: skip
    assert all(gets(s3_store.proxy, f"base/{s}") == 2 for s in SHARDS[:2])  # fetched again, not kept


@pytest.mark.slow
def test_an_object_replaced_during_the_fetch_is_refused_not_mixed(s3_store, tmp_path):
    """Listed, then replaced before its bytes are read: the read is pinned to the listed ETag (If-Match)."""
    old, new = model_versions(tmp_path)
    upload_multipart(s3_store.client, old, "store", "base")
    listing = storage.list_files("s3://store/base", endpoint_url=s3_store.endpoint)
    listing.settle([SHARDS[0]])  # its HEAD, before the replacement: only the pinned GET can notice
    upload_multipart(s3_store.client, new, "store", "base")
    with pytest.raises(
        storage.SourceChanged, match=f"{SHARDS[0]} .*replaced at the source after it was listed"
    ):
        storage.download(listing, [SHARDS[0]], tmp_path / "out")


def test_a_cache_entry_changed_in_place_is_found_discarded_and_filled_again(tmp_path, log_lines):
    src = write_fake_model(tmp_path / "src", shards=4, extra_bin=False)
    cache = str(tmp_path / "cache")

    def run(i: int):
        return initialize_model(
            str(src), str(tmp_path / f"ws{i}"), name="m", cache_path=cache, task_id=f"r{i}"
        )

    run(1)
    hit = run(2)  # a verified hit: its files are now proven as they are
    assert hit.metadata["cache"]["hit"] is True
    entry = Path(hit.metadata["cache"]["entry"])
    for path in (entry / SHARDS[1], hit.path / "model.safetensors.index.json"):
        assert not path.stat().st_mode & 0o222  # read-only: a non-root step cannot write through its link
    damage_in_place(hit.path / SHARDS[1])  # a step edits its workspace copy: the shared inode changes
    assert (entry / SHARDS[1]).read_bytes() != (src / SHARDS[1]).read_bytes()

    third = run(3)
    assert third.metadata["cache"]["hit"] is False and third.metadata["cache"]["bytes_fetched"] > 0
    assert any("no longer hold the bytes" in line and SHARDS[1] in line for line in log_lines), log_lines
    assert same_weights(third.path, src) and same_weights(entry, src)
    assert run(4).metadata["cache"]["hit"] is True


def test_a_workspace_copy_changed_in_place_is_not_reused(tmp_path, workspace):
    src = write_fake_model(tmp_path / "src", shards=4, extra_bin=False)
    first = initialize_model(str(src), str(workspace), name="m")
    assert initialize_model(str(src), str(workspace), name="m").skipped  # verified and reused
    damage_in_place(first.path / SHARDS[2])
    again = initialize_model(str(src), str(workspace), name="m")
    assert not again.skipped and same_weights(again.path, src)


def test_a_local_source_changed_in_place_with_its_mtime_kept_is_a_new_cache_entry(tmp_path):
    src = write_fake_model(tmp_path / "src", shards=4, extra_bin=False)
    cache = str(tmp_path / "cache")
    first = initialize_model(str(src), str(tmp_path / "ws1"), name="m", cache_path=cache, task_id="r1")
    damage_in_place(src / SHARDS[3])  # a retrained shard written over the old one, the mtime preserved
    second = initialize_model(str(src), str(tmp_path / "ws2"), name="m", cache_path=cache, task_id="r2")
    assert second.metadata["cache"]["hit"] is False
    assert second.metadata["cache"]["entry"] != first.metadata["cache"]["entry"]
    assert same_weights(second.path, src)


def test_an_https_file_replaced_with_the_same_size_is_another_identity_and_never_mixed(tmp_path, monkeypatch):
    """https states Last-Modified (and ETag where the server sends one): a file replaced by one of the same size
    changes the fingerprint, and a replacement between listing and fetch is refused."""
    from tests.support.sources import https_server

    served = tmp_path / "served"
    served.mkdir()
    data = served / "train.jsonl"
    data.write_text('{"a": 1}\n')
    os.utime(data, (1_700_000_000, 1_700_000_000))
    with https_server(served, tmp_path, monkeypatch) as server:
        listing = storage.list_files(f"{server.url}/train.jsonl")
        assert listing.files[0].stated["last_modified"]
        data.write_text('{"a": 2}\n')
        os.utime(data, (1_700_000_100, 1_700_000_100))
        again = storage.list_files(f"{server.url}/train.jsonl")
        assert again.fingerprint(["train.jsonl"]) != listing.fingerprint(["train.jsonl"])
        with pytest.raises(storage.SourceChanged, match="changed at the source after it was listed"):
            storage.download(listing, ["train.jsonl"], tmp_path / "out")
        assert [r.size for r in storage.download(again, ["train.jsonl"], tmp_path / "out2")] == [9]


def test_a_non_root_step_cannot_write_through_its_link_into_the_cache(tmp_path):
    """Mode 0444 on the shared inode: a step running as an ordinary user that owns the files (here: uid 65534 when
    the tests run as root) gets EACCES opening its workspace copy for writing; the cache entry stays as fetched."""
    import shutil
    import subprocess
    import tempfile

    src = write_fake_model(tmp_path / "src", shards=4, extra_bin=False)
    shared = Path(
        tempfile.mkdtemp(prefix="kfp-cache-test-")
    )  # outside pytest's 0700 tree: reachable by uid 65534
    try:
        shared.chmod(0o755)
        res = initialize_model(str(src), str(shared / "ws"), name="m", cache_path=str(shared / "cache"))
        for folder in (shared, shared / "ws", shared / "ws" / "models"):
            folder.chmod(0o755)
        target = res.path / SHARDS[0]
        user = None
        if (
            os.geteuid() == 0
        ):  # the step that fetched and the step that writes run as one user: the file's owner
            os.chown(target, 65534, 65534)
            user = lambda: os.setuid(65534)  # noqa: E731
        write_in_place = ["sh", "-c", 'printf x 1<>"$1"', "sh", str(target)]  # open O_RDWR, no truncation
        proc = subprocess.run(write_in_place, preexec_fn=user, capture_output=True, text=True)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc.stderr
        assert same_weights(Path(res.metadata["cache"]["entry"]), src)
    finally:
        shutil.rmtree(shared)
