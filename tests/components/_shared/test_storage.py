"""Storage URIs against real clients: hf:// through huggingface_hub and the hub stand-in, s3:// through boto3
and moto's S3 server, local paths. Nothing reaches the internet."""

from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import boto3
import pytest

from kfp_finetune.components._shared import storage
from tests.support.hub_standin import HubStandin
from tests.support.sources import hub_env, moto_s3, result, run_python, use_s3_credentials, write_fake_model

# --- URI parsing --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("hf://org/repo", {"scheme": "hf", "repo_id": "org/repo", "path": "", "revision": None}),
        ("hf://org/repo@v1.0", {"repo_id": "org/repo", "revision": "v1.0"}),
        (
            "hf://org/repo/sub/dir@refs/pr/1",
            {"repo_id": "org/repo", "path": "sub/dir", "revision": "refs/pr/1"},
        ),
        ("hf://datasets/org/data@v2", {"repo_id": "org/data", "repo_type": "dataset", "revision": "v2"}),
        ("s3://bucket", {"scheme": "s3", "bucket": "bucket", "path": ""}),
        ("s3://bucket/a/b/", {"bucket": "bucket", "path": "a/b"}),
        ("file:///data/models/x", {"scheme": "file", "path": "/data/models/x"}),
        ("/mnt/pvc/x/../y", {"scheme": "file", "path": "/mnt/pvc/y"}),
        (
            "https://example.org/d/train.jsonl",
            {"scheme": "https", "path": "https://example.org/d/train.jsonl"},
        ),
    ],
)
def test_parse_uri_accepts_supported_forms(uri, expected):
    parsed = storage.parse_uri(uri)
    for key, value in expected.items():
        assert getattr(parsed, key) == value


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "gs://bucket/x",
        "relative/path",
        "hf://onlyorg",
        "hf://org/repo@",
        "s3://",
        "file://relative",
        "https://h",
    ],
)
def test_parse_uri_rejects_malformed_with_the_supported_forms(uri):
    with pytest.raises(ValueError) as err:
        storage.parse_uri(uri)
    for form in ("hf://", "s3://", "file://", "https://"):
        assert form in str(err.value)


# --- retries ------------------------------------------------------------------------------------------------


def test_with_retries_retries_transient_errors_only():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert storage.with_retries(flaky, what="flaky", base_delay=0.01) == "ok"
    assert len(calls) == 3

    def broken():
        calls.append(1)
        raise PermissionError("no")

    calls.clear()
    with pytest.raises(PermissionError):
        storage.with_retries(broken, what="broken", base_delay=0.01)
    assert len(calls) == 1


def test_offline_hub_is_a_clear_error_not_retried():
    """The test session is offline (tests/conftest.py): the hub client refuses, and we say why at once."""
    import huggingface_hub.constants

    if not huggingface_hub.constants.HF_HUB_OFFLINE:
        pytest.skip("this session was started with HF_HUB_OFFLINE=0")
    with pytest.raises(storage.StorageError, match="HF_HUB_OFFLINE is set"):
        storage.with_retries(lambda: storage.list_files("hf://org/repo"), what="offline", base_delay=60)


# --- local --------------------------------------------------------------------------------------------------


def test_local_folder_and_single_file(tmp_path):
    src = write_fake_model(tmp_path / "src")
    listing = storage.list_files(f"file://{src}")
    paths = sorted(f.path for f in listing.files)
    assert "config.json" in paths and "original/tokenizer.model" in paths
    records = storage.download(listing, ["config.json", "model.safetensors"], tmp_path / "out")
    assert [r.path for r in records] == ["config.json", "model.safetensors"]
    data = (src / "model.safetensors").read_bytes()
    assert records[1].sha256 == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == data

    single = storage.list_files(str(src / "config.json"))
    assert [f.path for f in single.files] == ["config.json"]
    with pytest.raises(storage.StorageError, match="no such file"):
        storage.list_files(str(tmp_path / "missing"))


def test_fingerprint_changes_when_a_local_file_changes(tmp_path):
    src = write_fake_model(tmp_path / "src")
    before = storage.list_files(str(src)).fingerprint(["config.json"])
    (src / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert storage.list_files(str(src)).fingerprint(["config.json"]) != before


# --- s3 through moto's server -------------------------------------------------------------------------------


@pytest.fixture
def s3(tmp_path, monkeypatch):
    use_s3_credentials(monkeypatch)
    with moto_s3() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="models")
        src = write_fake_model(tmp_path / "s3src")
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            client.upload_file(str(path), "models", f"tiny/{path.relative_to(src).as_posix()}")
        client.put_object(Bucket="models", Key="tiny2/other.json", Body=b"{}")  # must not match prefix "tiny"
        yield endpoint, src


@pytest.mark.slow
def test_s3_list_and_download_with_custom_endpoint(s3, tmp_path):
    endpoint, src = s3
    listing = storage.list_files("s3://models/tiny", endpoint_url=endpoint)
    paths = {f.path for f in listing.files}
    assert "config.json" in paths and "original/tokenizer.model" in paths and "other.json" not in paths
    assert all(f.md5 for f in listing.files)  # single-part uploads: the ETag is the content MD5
    records = storage.download(listing, ["config.json", "original/tokenizer.model"], tmp_path / "out")
    assert (tmp_path / "out" / "original" / "tokenizer.model").read_bytes() == (
        src / "original" / "tokenizer.model"
    ).read_bytes()
    assert records[0].sha256 == hashlib.sha256((src / "config.json").read_bytes()).hexdigest()


@pytest.mark.slow
def test_publish_to_s3_and_back(s3, tmp_path):
    endpoint, src = s3
    published = storage.publish_directory(src, "s3://models/exported/v1", endpoint_url=endpoint)
    listing = storage.list_files("s3://models/exported/v1", endpoint_url=endpoint)
    assert sorted(f.path for f in listing.files) == [r.path for r in published.records]
    back = storage.download(listing, [r.path for r in published.records], tmp_path / "back")
    assert back == published.records  # same paths, sizes and sha256 after the round trip
    with pytest.raises(storage.StorageError, match="bucket 'nope' does not exist"):
        storage.publish_directory(src, "s3://nope/x", endpoint_url=endpoint)


@pytest.mark.slow
def test_s3_endpoint_from_env(s3, monkeypatch):
    endpoint, _ = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    assert storage.list_files("s3://models/tiny/config.json").files[0].path == "config.json"


def test_s3_missing_bucket_names_the_bucket(s3):
    endpoint, _ = s3
    with pytest.raises(storage.StorageError, match="bucket 'nope' does not exist"):
        storage.list_files("s3://nope/x", endpoint_url=endpoint)


@pytest.mark.slow
def test_s3_bad_credentials_are_reported_without_leaking_them(s3, monkeypatch):
    endpoint, _ = s3
    secret = "not-the-real-secret-123"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    # moto checks signatures only once auth is switched on (its reset-auth API; 0 unauthenticated actions).
    _moto_auth(endpoint, b"0")
    try:
        with pytest.raises(storage.StorageError, match="rejected the credentials") as err:
            storage.list_files("s3://models/tiny", endpoint_url=endpoint)
        assert secret not in str(err.value)
    finally:
        _moto_auth(endpoint, b"inf")


def _moto_auth(endpoint: str, unauthenticated_actions: bytes) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=unauthenticated_actions,
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request).close()


# --- hf:// through huggingface_hub and the hub stand-in -------------------------------------------------------

# One child process runs a list of scenarios (the hub client reads HF_ENDPOINT at import) and prints one JSON
# object: per scenario the listing (commit, files) and downloaded sha256s, or the error.
HF_SCENARIOS = """
    import json, sys
    from kfp_finetune.components._shared import storage

    def attempt(uri, paths, dest):
        try:
            listing = storage.list_files(uri)
            out = {"commit": listing.commit_sha, "revision": listing.revision,
                   "files": {f.path: [f.size, f.sha256, f.git_blob_sha1] for f in listing.files}}
            if paths is not None:
                out["records"] = {r.path: r.sha256 for r in storage.download(listing, paths, dest)}
            return out
        except Exception as exc:
            return {"error": type(exc).__name__, "message": str(exc)}

    scenarios, out_dir = json.loads(sys.argv[1]), sys.argv[2]
    print(json.dumps({key: attempt(uri, paths, f"{out_dir}/{key}") for key, uri, paths in scenarios}))
"""


def run_scenarios(endpoint: str, tmp, scenarios: list, token: str | None = None) -> dict:
    env = hub_env(endpoint, tmp, token=token)
    return result(run_python(HF_SCENARIOS, env, json.dumps(scenarios), str(tmp / f"out-{token}")))


@pytest.fixture(scope="module")
def hf_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf")
    v1 = write_fake_model(tmp / "v1", seed=1)
    main = write_fake_model(tmp / "main", seed=2)
    with HubStandin() as hub:
        repo = hub.add_repo("org/tiny", {"main": main, "v1.0": v1})
        hub.add_repo("org/gated", main, gated=True, tokens=("hf_good",))
        hub.add_repo("org/private", main, private=True, tokens=("hf_good",))
        hub.fail_once("model.safetensors", "drop")  # first GET of the main weights is cut half-way
        hub.fail_once("config.json", "500")  # first GET of config.json answers 500
        anonymous = [
            ["main", "hf://org/tiny", ["config.json", "model.safetensors", "original/tokenizer.model"]],
            ["v1", "hf://org/tiny@v1.0", ["model.safetensors"]],
            ["sha", f"hf://org/tiny@{repo.revisions['v1.0'].commit}", None],
            ["sub", "hf://org/tiny/original", ["tokenizer.model"]],
            ["bad_revision", "hf://org/tiny@nope", None],
            ["missing_repo", "hf://org/missing", None],
            ["gated_no_token", "hf://org/gated", None],
            ["private_no_token", "hf://org/private", None],
        ]
        yield {
            "anonymous": run_scenarios(hub.endpoint, tmp, anonymous),
            "wrong_token": run_scenarios(hub.endpoint, tmp, [["gated", "hf://org/gated", None]], "hf_wrong"),
            "good_token": run_scenarios(
                hub.endpoint, tmp, [["gated", "hf://org/gated", ["config.json"]]], "hf_good"
            ),
            "hub": hub,
            "repo": repo,
            "main": main,
            "v1": v1,
        }


@pytest.mark.slow
def test_hf_revision_resolves_to_commit_sha(hf_results):
    out, repo = hf_results["anonymous"], hf_results["repo"]
    assert out["main"]["commit"] == repo.revisions["main"].commit
    assert out["v1"]["commit"] == repo.revisions["v1.0"].commit != out["main"]["commit"]
    assert out["v1"]["revision"] == "v1.0"
    assert out["sha"]["commit"] == repo.revisions["v1.0"].commit
    v1_weights = (hf_results["v1"] / "model.safetensors").read_bytes()
    assert out["v1"]["records"]["model.safetensors"] == hashlib.sha256(v1_weights).hexdigest()


@pytest.mark.slow
def test_hf_lfs_files_carry_sha256_and_small_files_a_git_blob_id(hf_results):
    files = hf_results["anonymous"]["main"]["files"]
    weights = (hf_results["main"] / "model.safetensors").read_bytes()
    assert files["model.safetensors"] == [len(weights), hashlib.sha256(weights).hexdigest(), None]
    size, sha256, blob = files["config.json"]
    assert sha256 is None and len(blob) == 40


def test_hf_mid_download_failures_are_retried(hf_results):
    out, hub = hf_results["anonymous"]["main"], hf_results["hub"]
    weights = (hf_results["main"] / "model.safetensors").read_bytes()
    assert out["records"]["model.safetensors"] == hashlib.sha256(weights).hexdigest()
    assert hub.gets_of("/model.safetensors") >= 2  # dropped, then fetched again
    statuses = [s for m, p, s in hub.requests if m == "GET" and p.endswith("/config.json")]
    assert statuses[0] == 500 and statuses[-1] == 200


def test_hf_sub_path(hf_results):
    out = hf_results["anonymous"]["sub"]
    assert set(out["files"]) == {"tokenizer.model", "consolidated.00.pth"}
    assert "tokenizer.model" in out["records"]


def test_hf_errors_name_the_repo_and_what_to_do(hf_results):
    out = hf_results["anonymous"]
    assert out["bad_revision"]["error"] == "StorageError"
    assert (
        "revision 'nope' not found" in out["bad_revision"]["message"]
        and "org/tiny" in out["bad_revision"]["message"]
    )
    assert "'org/missing'" in out["missing_repo"]["message"] and "not found" in out["missing_repo"]["message"]
    assert (
        "gated (401)" in out["gated_no_token"]["message"]
        and "HF_TOKEN is not set" in out["gated_no_token"]["message"]
    )
    assert (
        "'org/private'" in out["private_no_token"]["message"]
        and "HF_TOKEN" in out["private_no_token"]["message"]
    )
    wrong = hf_results["wrong_token"]["gated"]
    assert "gated" in wrong["message"] and "(403)" in wrong["message"] and "hf_wrong" not in wrong["message"]
    assert "config.json" in hf_results["good_token"]["gated"]["records"]


def test_scheme_modules_import_no_verb_and_the_verbs_branch_on_no_scheme_name():
    import ast
    import re

    package = Path(storage.__file__).parent
    for scheme in ("hf", "s3", "local", "https"):
        tree = ast.parse((package / f"{scheme}.py").read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"fetch", "publish", "schemes"}, (scheme, imported)
    for verb in ("fetch", "publish", "__init__"):
        source = (package / f"{verb}.py").read_text()
        assert not re.search(r"""scheme\s*(==|!=|in|not in)\s*[("']""", source), verb
