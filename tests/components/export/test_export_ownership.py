"""export touches only what it owns: overwrite deletes only the files the previous export's manifest
(checksums.sha256) at that destination lists, files no export wrote there survive (a user's notes, other models
under the same folder or S3 prefix), the root of a disk or bucket is refused, and hidden leftovers of an
interrupted run are removed by the next one.

Real files and boto3 against moto's S3 server; the exported model is a small stand-in folder (no training)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.workspace import atomic_dir
from kfp_finetune.components.export import export as export_module
from kfp_finetune.components.export.export import ExportError, export_model
from tests.support.sources import moto_s3, use_s3_credentials

FOREIGN = {  # what others keep in the shared destination: never touched by an export
    "NOTES.md": b"the team's notes, not written by any export\n",
    "other-model/model.safetensors": b"another team's weights",
}


def model(tmp_path: Path, version: int) -> SimpleNamespace:
    """A workspace with a merged model. Version 2 changes the weights and drops `tokenizer.model`."""
    workspace = tmp_path / f"ws{version}"
    merged = workspace / "runs/r1/merged"
    merged.mkdir(parents=True, exist_ok=True)
    (merged / "config.json").write_text('{"model_type": "llama"}')
    (merged / "model.safetensors").write_bytes(b"weights v%d" % version)
    if version == 1:
        (merged / "tokenizer.model").write_bytes(b"old tokenizer")
    meta = {"merged_path": "runs/r1/merged", "run_dir": "runs/r1", "base_model": "org/base", "method": "full"}
    return SimpleNamespace(workspace=workspace, metadata=meta)


def export(m: SimpleNamespace, destination: str, **kwargs):
    return export_model(
        workspace=m.workspace, model_metadata=m.metadata, destination=destination, format="merged", **kwargs
    )


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- a shared local folder -----------------------------------------------------------------------------------


def test_overwrite_in_a_shared_folder_deletes_only_what_the_previous_export_wrote(tmp_path):
    shared = tmp_path / "shared"
    for rel, body in FOREIGN.items():
        (shared / rel).parent.mkdir(parents=True, exist_ok=True)
        (shared / rel).write_bytes(body)

    first = export(model(tmp_path, 1), str(shared))
    assert first.state == "created"  # files no export wrote are no conflict
    assert tree(shared) == {**FOREIGN, **{p: (shared / p).read_bytes() for p in first.files}}
    v2 = model(tmp_path, 2)

    with pytest.raises(storage.DestinationConflict, match="export_overwrite=true") as err:
        export(v2, str(shared))
    assert "tokenizer.model (not part of this export)" in str(err.value)
    assert "NOTES.md" not in str(err.value) and "other-model" not in str(err.value)

    second = export(v2, str(shared), overwrite=True)
    assert second.state == "replaced"
    assert not (shared / "tokenizer.model").exists()  # the earlier export's file, listed in its manifest
    assert tree(shared) == {**FOREIGN, **{p: (shared / p).read_bytes() for p in second.files}}
    assert (shared / "model.safetensors").read_bytes() == b"weights v2"


def test_without_a_previous_manifest_nothing_is_deleted(tmp_path):
    """Files that look like an export's but that no manifest lists were not written by one: kept."""
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "tokenizer.model").write_bytes(b"someone's tokenizer")
    res = export(model(tmp_path, 2), str(dest), overwrite=True)
    assert res.state == "created" and (dest / "tokenizer.model").read_bytes() == b"someone's tokenizer"


# --- a shared S3 prefix --------------------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    use_s3_credentials(monkeypatch)
    with moto_s3() as endpoint:
        # moto's backend lives in the process: start each test from an empty server.
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST")).close()
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="models")
        yield endpoint, client


def s3_tree(client, prefix: str) -> dict[str, bytes]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket="models", Prefix=prefix + "/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    return {
        k[len(prefix) + 1 :]: client.get_object(Bucket="models", Key=k)["Body"].read() for k in sorted(keys)
    }


@pytest.mark.slow
def test_overwrite_under_a_shared_s3_prefix_deletes_only_what_the_previous_export_wrote(tmp_path, s3):
    endpoint, client = s3
    for rel, body in FOREIGN.items():
        client.put_object(Bucket="models", Key=f"team/{rel}", Body=body)
    client.put_object(Bucket="models", Key="team-b/model.safetensors", Body=b"beside the prefix")

    first = export(model(tmp_path, 1), "s3://models/team", s3_endpoint_url=endpoint)
    assert first.state == "created"
    assert set(s3_tree(client, "team")) == set(FOREIGN) | set(first.files)

    with pytest.raises(storage.DestinationConflict, match=r"tokenizer.model \(not part of this export\)"):
        export(model(tmp_path, 2), "s3://models/team", s3_endpoint_url=endpoint)

    second = export(model(tmp_path, 2), "s3://models/team", s3_endpoint_url=endpoint, overwrite=True)
    assert second.state == "replaced"
    after = s3_tree(client, "team")
    assert set(after) == set(FOREIGN) | set(second.files) and "tokenizer.model" not in after
    assert {k: after[k] for k in FOREIGN} == FOREIGN
    assert after["model.safetensors"] == b"weights v2"
    body = client.get_object(Bucket="models", Key="team-b/model.safetensors")["Body"].read()
    assert body == b"beside the prefix"


class Killed(BaseException):
    """The step's pod killed mid-way (not an Exception: nothing may catch it)."""


@pytest.mark.slow
def test_s3_overwrite_killed_after_its_deletions_is_finished_by_the_next_run(tmp_path, s3, monkeypatch):
    """An overwrite killed right after its first batch of changes: whatever it left, the rerun still knows which
    files the earlier export wrote and removes them; the team's files stay."""
    endpoint, client = s3
    client.put_object(Bucket="models", Key="team/NOTES.md", Body=FOREIGN["NOTES.md"])
    export(model(tmp_path, 1), "s3://models/team", s3_endpoint_url=endpoint)
    real_put = storage.s3.put

    def put_then_die(dest, src, records, remove, **kw):
        real_put(dest, src, records, remove, **kw)
        raise Killed

    monkeypatch.setattr(storage.s3, "put", put_then_die)
    with pytest.raises(Killed):
        export(model(tmp_path, 2), "s3://models/team", s3_endpoint_url=endpoint, overwrite=True)
    monkeypatch.setattr(storage.s3, "put", real_put)

    res = export(model(tmp_path, 2), "s3://models/team", s3_endpoint_url=endpoint, overwrite=True)
    assert res.state in ("replaced", "resumed")
    assert set(s3_tree(client, "team")) == {"NOTES.md"} | set(res.files)


# --- roots are refused ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "destination",
    [
        "/",
        "//",
        "///",
        "/..",
        "file:///",
        "file:////",
        "file:///.",
        "s3://models",
        "s3://models/",
        "s3://m//",
    ],
)
def test_the_root_of_a_disk_or_bucket_is_refused(tmp_path, destination):
    with pytest.raises(ExportError, match="root of a disk or bucket; name a folder"):
        export(model(tmp_path, 1), destination, s3_endpoint_url="http://127.0.0.1:9")
    assert not (tmp_path / "ws1/runs/r1/exports").exists()  # refused before staging


def test_a_link_to_the_root_is_refused_and_a_hub_repo_root_is_fine(tmp_path):
    (tmp_path / "disk").symlink_to("/")
    with pytest.raises(storage.StorageError, match="root of a disk or bucket"):
        storage.publish_directory(tmp_path, str(tmp_path / "disk"))
    for uri in ("//", "file:////"):  # also for callers of storage other than export
        with pytest.raises(storage.StorageError, match="root of a disk or bucket"):
            storage.publish_directory(tmp_path, uri)
    storage.refuse_root(storage.parse_uri("hf://org/repo"))  # the repo is ours
    assert storage.parse_uri("//data/x").path == "/data/x"


# --- leftovers of an interrupted run -------------------------------------------------------------------------


def test_leftovers_of_an_interrupted_export_are_removed_by_the_next_run(tmp_path):
    m = model(tmp_path, 1)
    dest = tmp_path / "dest"
    export(m, str(dest))
    # What a killed rerun leaves: a staging folder in the workspace and a half-copied file at the destination.
    stage = m.workspace / "runs/r1/exports/.export.tmp-dead1234"
    stage.mkdir(parents=True)
    (stage / "model.safetensors").write_bytes(b"staged")
    (dest / ".model.safetensors.part-dead1234").write_bytes(b"wei")
    res = export(m, str(dest))
    assert res.state == "unchanged"  # nothing to copy, and still cleaned
    assert not list(dest.rglob(".*")) and not (m.workspace / "runs/r1/exports").exists()


def test_old_copies_of_an_interrupted_replace_are_removed_by_the_next_one(tmp_path):
    final = tmp_path / "models/base"
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    # Killed between its two renames, a replace leaves the previous copy under a hidden name.
    old = final.parent / ".base.old-dead1234"
    os.rename(final, old)
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("2")
    assert sorted(p.name for p in final.parent.iterdir()) == ["base"]
    assert (final / "a").read_text() == "2"


# --- a manifest is ours only when an export wrote it ---------------------------------------------------------


def users_folder() -> dict[str, bytes]:
    """A user's model folder with the checksums file `sha256sum * > checksums.sha256` writes: no header line."""
    files = {
        "README.md": b"# our team's model\n",
        "config.json": b'{"model_type": "mistral", "note": "the user\'s own"}',
        "other-model/model.safetensors": b"another model's weights",
        "other-model/config.json": b'{"model_type": "qwen2"}',
    }
    sums = "".join(f"{hashlib.sha256(body).hexdigest()}  {rel}\n" for rel, body in sorted(files.items()))
    return {**files, "checksums.sha256": sums.encode()}


def test_a_users_checksums_readme_config_and_other_model_survive_overwrite_byte_for_byte(tmp_path):
    dest = tmp_path / "dest"
    for rel, body in users_folder().items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(body)

    with pytest.raises(storage.DestinationConflict) as refused:
        export(model(tmp_path, 1), str(dest), overwrite=True)

    message = str(refused.value)
    assert "README.md" in message and "config.json" in message and "checksums.sha256" in message, message
    assert "other-model" not in message and "never replaces" in message and "\n" not in message
    assert tree(dest) == users_folder()


@pytest.mark.slow
def test_a_users_files_under_a_shared_s3_prefix_survive_overwrite_byte_for_byte(tmp_path, s3):
    endpoint, client = s3
    for rel, body in users_folder().items():
        client.put_object(Bucket="models", Key=f"team/{rel}", Body=body)

    with pytest.raises(storage.DestinationConflict, match=r"README\.md.*config\.json.*never replaces"):
        export(model(tmp_path, 1), "s3://models/team", s3_endpoint_url=endpoint, overwrite=True)

    assert s3_tree(client, "team") == users_folder()


def test_a_users_checksums_file_alone_is_not_taken_for_an_exports_manifest(tmp_path):
    """The user's checksums file lists files beside the export: none of them is ever deleted by an overwrite,
    and the user's checksums file is not replaced either (the export names it and writes nothing)."""
    dest = tmp_path / "dest"
    users = {k: v for k, v in users_folder().items() if k.startswith("other-model/")}
    for rel, body in users.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(body)
    sums = "".join(f"{hashlib.sha256(b).hexdigest()}  {rel}\n" for rel, b in sorted(users.items()))
    (dest / "checksums.sha256").write_text(sums)

    with pytest.raises(
        storage.DestinationConflict, match=r"holds checksums\.sha256, not written by an export"
    ):
        export(model(tmp_path, 1), str(dest), overwrite=True)
    assert tree(dest) == {**users, "checksums.sha256": sums.encode()}


def test_a_users_file_identical_to_an_exported_one_is_not_adopted(tmp_path):
    """A user's copy of the model's config.json (same bytes) is still the user's: listing it in our manifest
    would let a later overwrite delete it, so the export names it and writes nothing."""
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json").write_text('{"model_type": "llama"}')

    with pytest.raises(storage.DestinationConflict, match=r"holds config\.json, not written by an export"):
        export(model(tmp_path, 1), str(dest), overwrite=True)
    assert tree(dest) == {"config.json": b'{"model_type": "llama"}'}


def test_the_manifest_names_its_export_and_sha256sum_checks_it(tmp_path):
    dest = tmp_path / "dest"
    res = export(
        model(tmp_path, 1), str(dest), run_name="nightly", run_id="r-1", task_name="export", task_id="7"
    )

    first = (dest / "checksums.sha256").read_text().splitlines()[0]
    assert first.startswith("# kfp-finetune export: run nightly (id r-1), task export (id 7), at 20"), first
    check = subprocess.run(["sha256sum", "-c", "--strict", "checksums.sha256"], cwd=dest, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert res.manifest_sha256 == hashlib.sha256((dest / "checksums.sha256").read_bytes()).hexdigest()


def test_the_same_export_a_day_later_is_unchanged_and_keeps_the_first_exports_line(tmp_path, monkeypatch):
    """Only the manifest's first line (its time) differs: the destination holds this content already, so
    nothing is written and the manifest keeps naming the export that wrote the files."""
    days = iter(
        [
            "run r (id 1), task export, at 2026-01-01T00:00:00Z",
            "run r (id 1), task export, at 2026-01-02T00:00:00Z",
        ]
    )
    monkeypatch.setattr(export_module, "_identity", lambda *args: next(days))
    dest = tmp_path / "dest"
    export(model(tmp_path, 1), str(dest))
    before = tree(dest)

    again = export(model(tmp_path, 1), str(dest))

    assert again.state == "unchanged" and again.uploaded == [] and tree(dest) == before
    assert "2026-01-01" in (dest / "checksums.sha256").read_text().splitlines()[0]
    assert again.manifest_sha256 == hashlib.sha256(before["checksums.sha256"]).hexdigest()
    assert again.files["checksums.sha256"]["sha256"] == again.manifest_sha256


@pytest.mark.parametrize("scheme", ["local", "s3"])
@pytest.mark.slow
def test_an_export_killed_while_copying_leaves_its_files_owned_and_incomplete(
    tmp_path, s3, monkeypatch, scheme
):
    """Killed after its content was written but before the finished manifest: the destination holds the
    incomplete claim (`sha256sum -c` fails on it), and a different later export may still replace the files."""
    endpoint, client = s3
    module = storage.local if scheme == "local" else storage.s3
    where = str(tmp_path / "dest") if scheme == "local" else "s3://models/team"
    read = (lambda: tree(tmp_path / "dest")) if scheme == "local" else (lambda: s3_tree(client, "team"))
    real_put, calls = module.put, []

    def put_then_die(dest, src, records, remove, **kw):
        real_put(dest, src, records, remove, **kw)
        calls.append([r.path for r in records])
        if any(r.path == "model.safetensors" for r in records):  # the content is there, the manifest is not
            raise Killed

    monkeypatch.setattr(module, "put", put_then_die)
    with pytest.raises(Killed):
        export(model(tmp_path, 1), where, s3_endpoint_url=endpoint)
    monkeypatch.setattr(module, "put", real_put)

    assert calls[0] == ["checksums.sha256"]  # the claim came first
    left = read()
    claim = left["checksums.sha256"].decode()
    assert "(incomplete" in claim.splitlines()[0] and "# owns: tokenizer.model" in claim
    if scheme == "local":
        check = subprocess.run(
            ["sha256sum", "-c", "checksums.sha256"], cwd=tmp_path / "dest", capture_output=True
        )
        assert check.returncode != 0

    res = export(model(tmp_path, 2), where, s3_endpoint_url=endpoint, overwrite=True)
    assert res.state == "replaced" and set(read()) == set(res.files)  # v1's tokenizer.model removed
    assert "(incomplete" not in read()["checksums.sha256"].decode().splitlines()[0]


def test_an_export_killed_while_copying_is_finished_by_a_plain_retry(tmp_path, monkeypatch):
    """Its own incomplete manifest is no conflict: the retry (no overwrite) sends only what is missing."""
    dest = tmp_path / "dest"
    real_put = storage.local.put

    def put_then_die(dest, src, records, remove, **kw):
        real_put(dest, src, records, remove, **kw)
        if any(r.path == "model.safetensors" for r in records):
            raise Killed

    monkeypatch.setattr(storage.local, "put", put_then_die)
    with pytest.raises(Killed):
        export(model(tmp_path, 1), str(dest))
    monkeypatch.setattr(storage.local, "put", real_put)

    res = export(model(tmp_path, 1), str(dest))
    assert res.state == "resumed" and res.uploaded == ["checksums.sha256"]
    check = subprocess.run(["sha256sum", "-c", "--strict", "checksums.sha256"], cwd=dest, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_checksums_file_of_an_older_export_is_named_with_the_way_out(tmp_path):
    dest = tmp_path / "dest"
    export(model(tmp_path, 1), str(dest))
    manifest = dest / "checksums.sha256"
    manifest.write_text(
        "".join(line + "\n" for line in manifest.read_text().splitlines()[1:])
    )  # no first line

    with pytest.raises(
        storage.DestinationConflict, match="older kfp-finetune export's: delete that export's files"
    ):
        export(model(tmp_path, 2), str(dest), overwrite=True)
