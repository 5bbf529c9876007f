"""Untrusted sources: hostile remote names are refused before anything is written, and a URI's credentials
(query string, userinfo) never reach a log line, an error, metadata, a manifest or a folder name.

Real clients against real servers: boto3 against moto's S3 server (S3 allows `..` in keys), urllib against a
local HTTPS server."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage.names import check_remote_name, write_target
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.tiny.dataset import build_tiny_dataset
from tests.support import sources
from tests.support.sources import moto_s3, use_s3_credentials, write_fake_model

# --- hostile names, one by one ------------------------------------------------------------------------------

HOSTILE = {
    "../escaped": "'..' segment",
    "a/../../escaped": "'..' segment",
    "a/..": "'..' segment",
    "/etc/passwd": "absolute",
    "a//b": "empty or '.' segment",
    "a/./b": "empty or '.' segment",
    "a/": "empty or '.' segment",
    "": "empty",
    "a\\..\\..\\escaped": "backslash",
    "a\\b": "backslash",
    "a\x00b": "NUL or control character",
    "a\nb": "NUL or control character",
    "a\x1b[31mb": "NUL or control character",
    "a\x7fb": "NUL or control character",
}


@pytest.mark.parametrize("name", list(HOSTILE), ids=[repr(n) for n in HOSTILE])
def test_each_hostile_form_is_refused_naming_the_key_and_the_source(name, tmp_path):
    with pytest.raises(storage.HostileName, match=HOSTILE[name]) as refused:
        check_remote_name(name, key=f"prefix/{name}", source="s3://bucket/prefix")
    assert repr(f"prefix/{name}") in str(refused.value) and "s3://bucket/prefix" in str(refused.value)
    with pytest.raises(storage.HostileName):
        write_target(tmp_path / "dest", name, key=name, source="s3://bucket/prefix")
    assert not (tmp_path / "dest").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["a", "a/b/c.json", "..a", "a..b/c", ".hidden/x", "ünïcode/ß.txt", "a b"])
def test_ordinary_names_are_written_inside_the_destination(name, tmp_path):
    target = write_target(tmp_path / "dest", name, key=name, source="s3://bucket")
    assert target == (tmp_path / "dest" / name).resolve() and target.parent.is_dir()


def test_a_name_through_a_symlinked_folder_that_leaves_the_destination_is_refused(tmp_path):
    (tmp_path / "dest").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "dest" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(storage.HostileName, match="resolves outside the destination"):
        write_target(tmp_path / "dest", "link/x", key="link/x", source="file:///src")


# --- hostile S3 keys through both initializers (moto's server) -----------------------------------------------

HOSTILE_KEYS = {
    "dotdot": "../../escaped.json",
    "absolute": "/escaped.json",
    "backslash": "a\\..\\..\\escaped.json",
    "control": "escaped\x01.json",
    "dot": "./escaped.json",
}


@pytest.fixture
def s3(tmp_path, monkeypatch):
    use_s3_credentials(monkeypatch)
    with moto_s3() as endpoint:
        yield endpoint, boto3.client("s3", endpoint_url=endpoint)


def _entries(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


@pytest.mark.parametrize("kind", list(HOSTILE_KEYS))
@pytest.mark.parametrize("initializer", ["model", "dataset"])
@pytest.mark.slow
def test_hostile_s3_keys_are_refused_by_both_initializers_before_anything_is_written(
    s3, tmp_path, initializer, kind
):
    endpoint, client = s3
    bucket = f"{initializer}-{kind}"  # moto's state outlives its server: a bucket of our own
    client.create_bucket(Bucket=bucket)
    if initializer == "model":
        upload = write_fake_model(tmp_path / "upload", extra_bin=False)
    else:
        upload = build_tiny_dataset(tmp_path / "upload", train_rows=8, eval_rows=2)["train.jsonl"].parent
    for path in sorted(p for p in upload.rglob("*") if p.is_file()):
        client.upload_file(str(path), bucket, f"data/{path.relative_to(upload).as_posix()}")
    # S3 keeps the key exactly: data/../../escaped.json lists as ../../escaped.json relative to the prefix.
    key = f"data/{HOSTILE_KEYS[kind]}"
    client.put_object(Bucket=bucket, Key=key, Body=b'{"planted": true}')
    # Deep enough that ../../ from the entry's temp folder stays inside tmp_path, where we can look.
    workspace = tmp_path / "a" / "b" / "workspace"
    workspace.mkdir(parents=True)
    before = _entries(tmp_path)

    init = initialize_model if initializer == "model" else initialize_dataset
    with pytest.raises(storage.HostileName) as refused:
        init(f"s3://{bucket}/data", str(workspace), name="entry", s3_endpoint_url=endpoint)

    assert repr(key) in str(refused.value) and f"s3://{bucket}/data" in str(refused.value)
    assert not [p for p in tmp_path.rglob("*") if "escaped" in p.name]  # nowhere: not in any parent folder
    added = sorted(set(_entries(tmp_path)) - set(before))
    assert all(not entry.endswith("entry") and ".entry." not in entry for entry in added), added  # no partial


# --- credentials in URIs -------------------------------------------------------------------------------------

SECRETS = ("AKIAPLANTEDKEYID0001", "plantedsignature0123456789abcdef", "plantedsessiontoken", "plantedpass")


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("https://h/x.jsonl?X-Amz-Signature=s", "https://h/x.jsonl?<redacted>"),
        ("https://user:pass@h:8443/x.jsonl", "https://<redacted>@h:8443/x.jsonl"),
        ("https://user:pass@h/x?y=1#frag", "https://<redacted>@h/x?<redacted>"),
        ("s3://key:secret@bucket/p", "s3://<redacted>@bucket/p"),
        ("hf://org/repo@main", "hf://org/repo@main"),  # a revision, not userinfo: after the first '/'
        ("hf://org/repo?token=t", "hf://org/repo?<redacted>"),
        ("/data/x?y.jsonl", "/data/x?<redacted>"),
        ("s3://bucket/plain", "s3://bucket/plain"),
    ],
)
def test_redact_uri(uri, shown):
    assert storage.redact_uri(uri) == shown


def test_a_refused_uri_with_userinfo_is_shown_redacted():
    with pytest.raises(ValueError, match="bucket name") as refused:
        storage.parse_uri("s3://AKIAPLANTEDKEYID0001:plantedpass@bucket/data")
    assert not [s for s in SECRETS if s in str(refused.value)]
    assert "s3://<redacted>@bucket/data" in str(refused.value)


@pytest.fixture
def https_server(tmp_path, monkeypatch):
    """A local HTTPS server serving `tmp_path/www`; the query string reaches it: it is the credential."""
    served = tmp_path / "www"
    served.mkdir()
    with sources.https_server(served, tmp_path, monkeypatch) as server:
        yield SimpleNamespace(url=server.url, root=served, requests=server.requests)


def _leaks(root: Path, texts: list[str]) -> list[str]:
    """Where a planted secret appears: a path's name, a file's content, or one of `texts`."""
    found = [f"{p} (name)" for p in root.rglob("*") if any(s in p.name for s in SECRETS)]
    found += [f"{p} (content)" for p in root.rglob("*") if p.is_file() and any(s.encode() in p.read_bytes() for s in SECRETS)]  # fmt: skip
    found += [f"{text[:200]!r}" for text in texts if any(s in text for s in SECRETS)]
    return found


def test_a_presigned_https_uri_leaves_no_credential_in_logs_metadata_manifest_or_folder_names(
    tmp_path, workspace, https_server, log_lines, capfd
):
    (https_server.root / "train.jsonl").write_text(
        "".join(json.dumps({"input": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(12))
    )
    presigned = (
        f"{https_server.url}/train.jsonl?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        f"&X-Amz-Credential={SECRETS[0]}%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
        f"&X-Amz-Security-Token={SECRETS[2]}&X-Amz-Signature={SECRETS[1]}"
    )
    art = tmp_path / "art"
    out = {
        "output_train": SimpleNamespace(path=str(art / "train"), metadata={}),
        "output_eval": SimpleNamespace(path=str(art / "eval"), metadata={}),
    }
    res = initialize_dataset(presigned, str(workspace), eval_fraction=0.25, **out)

    assert any(SECRETS[1] in r for r in https_server.requests)  # the secret was used where it belongs
    assert res.path.name == "train"  # the entry is named from the URL's path alone
    assert res.train_metadata["source_uri"] == f"{https_server.url}/train.jsonl?<redacted>"
    recorded = [json.dumps(res.train_metadata), json.dumps(res.eval_metadata), json.dumps(res.manifest)]
    recorded += [json.dumps(o.metadata) for o in out.values()]
    captured = capfd.readouterr()
    assert log_lines and any("<redacted>" in line for line in log_lines)
    assert not _leaks(workspace, log_lines + recorded + [captured.out, captured.err])
    assert not _leaks(art, [])

    # A failed fetch's error names the source, redacted.
    with pytest.raises(storage.StorageError, match="HTTP 404") as missing:
        initialize_dataset(presigned.replace("train.jsonl", "gone.jsonl"), str(workspace))
    assert "<redacted>" in str(missing.value) and not _leaks(workspace, [str(missing.value)])
