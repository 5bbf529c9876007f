"""Each exported byte is hashed once after training: finalisation hashes the final files (in parallel) and
records size + sha256 + mtime in the model artifact; export reuses those records for every file it publishes
unchanged, hashes only what it wrote itself or what changed since, and reads the published copy back with the
checksums the destination states (no second local pass). Counted by the one hashing helper (storage.checksums
`hashed`, bytes per inode), against real files and boto3 on moto's S3 server."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components._shared.storage import checksums
from kfp_finetune.components.export.export import export_model
from kfp_finetune.components.torchtune_finetune.outputs import finalize_checkpoint
from tests.support.sources import moto_s3, use_s3_credentials


def inode(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_dev, stat.st_ino


@pytest.fixture
def trained(tmp_path):
    """A LoRA run's last epoch (merged weights in two shards + adapter), finalised as torchtune-finetune does;
    the model metadata it outputs; and what the hashing helper counted during finalisation."""
    workspace = tmp_path / "ws"
    epoch = workspace / "runs" / "r1" / "epoch_0"
    epoch.mkdir(parents=True)
    for name, size in (("model-00001-of-00002.safetensors", 3 << 20), ("model-00002-of-00002.safetensors", 1 << 20),
                       ("adapter_model.safetensors", 1 << 18)):  # fmt: skip
        (epoch / name).write_bytes(os.urandom(size))
    (epoch / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (epoch / "tokenizer.json").write_text("{}")
    (epoch / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16}))
    checksums.hashed.clear()
    checkpoint = finalize_checkpoint(workspace / "runs" / "r1", method="lora", base_model="org/tiny")
    after_training = dict(checksums.hashed)
    metadata = {
        "merged_path": "runs/r1/merged", "adapter_path": "runs/r1/adapter", "run_dir": "runs/r1",
        "base_model": "org/tiny", "method": "lora", "files": json.loads(json.dumps(checkpoint.files)),
    }  # fmt: skip
    return SimpleNamespace(
        workspace=workspace, metadata=metadata, checkpoint=checkpoint, hashed=after_training
    )


def export(trained, destination: str, **kwargs):
    out = SimpleNamespace(path=str(trained.workspace.parent / "out" / "exported"), metadata={}, uri="")
    return export_model(
        workspace=trained.workspace, model_metadata=trained.metadata, destination=destination, format="both",
        output=out, **kwargs,
    )  # fmt: skip


def model_files(trained) -> dict[str, Path]:
    run = trained.workspace / "runs" / "r1"
    return {rel: run / rel for rel in trained.checkpoint.files}


def test_finalisation_hashes_every_final_byte_once_and_records_size_mtime_sha256(trained):
    files = model_files(trained)
    assert sorted(files) == [
        "adapter/adapter_config.json", "adapter/adapter_model.safetensors", "merged/config.json",
        "merged/model-00001-of-00002.safetensors", "merged/model-00002-of-00002.safetensors",
        "merged/tokenizer.json",
    ]  # fmt: skip
    assert trained.hashed == {inode(p): p.stat().st_size for p in files.values()}
    for rel, path in files.items():
        entry = trained.checkpoint.files[rel]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (entry["size"], int(entry["mtime_ns"])) == (path.stat().st_size, path.stat().st_mtime_ns)


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.slow
def test_export_hashes_no_unchanged_byte_again(trained, where, tmp_path, monkeypatch):
    if where == "s3":
        use_s3_credentials(monkeypatch)
        server = moto_s3()
        endpoint = server.__enter__()
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="store")
        destination, kwargs = "s3://store/models/tuned", {"s3_endpoint_url": endpoint}
    else:
        server, destination, kwargs = None, str(tmp_path / "published"), {}
    try:
        checksums.hashed.clear()
        result = export(trained, destination, **kwargs)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    trained_inodes = {inode(p) for p in model_files(trained).values()}
    assert not trained_inodes & set(checksums.hashed), "export hashed a file that training had hashed"
    # What export hashed is what it wrote itself: the model card and the checksums file, once each.
    written = result.files["README.md"]["size"] + result.files["checksums.sha256"]["size"]
    assert sum(checksums.hashed.values()) == written
    assert result.state == "created" and len(result.uploaded) == len(result.files) == 8
    for rel in model_files(trained):
        published = rel.removeprefix("merged/")
        assert result.files[published]["sha256"] == trained.checkpoint.files[rel]["sha256"]


def test_a_file_changed_after_finalisation_is_hashed_again_and_its_new_hash_published(trained, tmp_path):
    shard = trained.workspace / "runs" / "r1" / "merged" / "model-00002-of-00002.safetensors"
    with open(shard, "ab") as f:
        f.write(b"changed after training")
    checksums.hashed.clear()
    result = export(trained, str(tmp_path / "published"))
    new = hashlib.sha256(shard.read_bytes()).hexdigest()
    assert checksums.hashed[inode(shard)] == shard.stat().st_size
    assert result.files["model-00002-of-00002.safetensors"]["sha256"] == new
    listed = (tmp_path / "published" / "checksums.sha256").read_text()
    assert f"{new}  model-00002-of-00002.safetensors\n" in listed
