"""Integrity proven (issue 16 item 4): bytes of the right size but corrupted, and streams that end early yet look
complete, served by the hub stand-in and by a proxy in front of moto's S3 server. model-initialize,
dataset-initialize and the export's publish step detect each with an error naming the file and the expected and
actual checksum, re-fetch a one-time corruption, and leave nothing that looks finished."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.config import Config

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage.checksums import git_blob_sha1, md5_file
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.tiny.dataset import build_tiny_dataset
from tests.components.export import test_export
from tests.support.fault_proxy import FaultProxy
from tests.support.hub_standin import HubStandin
from tests.support.sources import hub_env, moto_s3, result, run_python, use_s3_credentials, write_fake_model

finetuned = test_export.finetuned  # the module-scoped fixture: a workspace holding one tiny LoRA run


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def nothing_finished(workspace: Path, area: str) -> None:
    """No entry folder, no manifest, no temp folder: only the area and hidden stable partial folders (kept for a
    retry to resume, never with a manifest) may remain."""
    left = sorted(
        p.relative_to(workspace).as_posix()
        for p in workspace.rglob("*")
        if not any(part.endswith(".partial") for part in p.relative_to(workspace).parts[1:-1])
    )
    left = [p for p in left if not p.endswith(".partial") or p.count("/") != 1]
    assert left in ([], [area]), left
    assert not list(workspace.rglob("manifest.json"))


# --- hf:// model-initialize ------------------------------------------------------------------------------------

INIT_MODEL = """
import json, sys
from types import SimpleNamespace
from kfp_finetune.components.model_initialize.initialize import initialize_model
out = SimpleNamespace(path=sys.argv[1], metadata={})
try:
    initialize_model(sys.argv[2], sys.argv[3], max_workers=2, output_model=out)
    print(json.dumps({"metadata": out.metadata}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc), "metadata": out.metadata}))
"""


@pytest.fixture(scope="module")
def hub_runs(tmp_path_factory):
    """model-initialize from the hub stand-in under each fault, in one hub; {scenario: (outcome, gets, ws)}."""
    tmp = tmp_path_factory.mktemp("hub")
    src = write_fake_model(tmp / "src")
    scenarios = {
        "lfs corrupt once": ("model.safetensors", "corrupt", 1),
        "lfs corrupt": ("model.safetensors", "corrupt", 2),
        "lfs truncated": ("model.safetensors", "truncate", 2),
        "regular corrupt once": ("config.json", "corrupt", 1),
        "regular corrupt": ("config.json", "corrupt", 2),
    }
    runs = {}
    with HubStandin() as hub:
        for i, (scenario, (path, mode, times)) in enumerate(scenarios.items()):
            hub.add_repo(f"org/tiny{i}", src)
            hub.fail_once(path, mode, times=times)
            before = hub.gets_of("/" + path)
            workspace = tmp / f"ws{i}"
            workspace.mkdir()
            proc = run_python(INIT_MODEL, hub_env(hub.endpoint, tmp), str(tmp / f"art{i}"),
                              f"hf://org/tiny{i}", str(workspace))  # fmt: skip
            runs[scenario] = (result(proc), hub.gets_of("/" + path) - before, workspace)
    return src, runs


@pytest.mark.parametrize(
    ("scenario", "checksum"),
    [("lfs corrupt", "sha256"), ("regular corrupt", "git blob id"), ("lfs truncated", "")],
)
@pytest.mark.slow
def test_hub_corruption_that_persists_is_refused_naming_file_and_checksums(hub_runs, scenario, checksum):
    src, runs = hub_runs
    outcome, gets, workspace = runs[scenario]
    name = "model.safetensors" if scenario.startswith("lfs") else "config.json"
    assert outcome["error"] == "IntegrityError" and name in outcome["message"], outcome
    if checksum == "sha256":
        assert f"sha256 {sha256(src / name)} does not match" not in outcome["message"]  # the actual differs
        assert f"the source's {sha256(src / name)}" in outcome["message"]
    elif checksum:
        assert checksum in outcome["message"] and git_blob_sha1(src / name) in outcome["message"]
    else:
        size = (src / name).stat().st_size
        assert f"{size // 2} bytes, the hub states {size}" in outcome["message"]
    assert gets == 2  # fetched, refused, fetched once more, refused
    assert outcome["metadata"] == {}
    nothing_finished(workspace, "models")


@pytest.mark.parametrize("scenario", ["lfs corrupt once", "regular corrupt once"])
@pytest.mark.slow
def test_hub_one_time_corruption_is_fetched_again(hub_runs, scenario):
    src, runs = hub_runs
    outcome, gets, workspace = runs[scenario]
    assert "error" not in outcome, outcome
    name = "model.safetensors" if scenario.startswith("lfs") else "config.json"
    model_dir = workspace / outcome["metadata"]["workspace_path"]
    assert (model_dir / name).read_bytes() == (src / name).read_bytes() and gets == 2
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in manifest["files"]}[name] == sha256(src / name)


INIT_DATASET = """
import json, sys
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
try:
    res = initialize_dataset(sys.argv[1], sys.argv[2])
    print(json.dumps({"rows": res.train_metadata["num_rows"]}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.slow
def test_hub_dataset_files_read_by_datasets_are_checked_and_fetched_again_once(tmp_path):
    build_tiny_dataset(tmp_path / "repo", train_rows=60, eval_rows=6)
    expected = sha256(tmp_path / "repo" / "train.parquet")
    size = (tmp_path / "repo" / "train.parquet").stat().st_size
    outcomes = {}
    with HubStandin() as hub:
        for i, (mode, times) in enumerate([("corrupt", 2), ("truncate", 2), ("corrupt", 1)]):
            hub.add_repo(f"org/reverse{i}", tmp_path / "repo", repo_type="dataset")
            hub.fail_once("train.parquet", mode, times=times)
            workspace = tmp_path / f"ws{i}"
            workspace.mkdir()
            env = hub_env(hub.endpoint, tmp_path)  # one hub cache for all: a damaged copy must not stay in it
            outcome = result(run_python(INIT_DATASET, env, f"hf://org/reverse{i}", str(workspace)))
            outcomes[(mode, times)] = outcome, workspace
    corrupt, workspace = outcomes[("corrupt", 2)]
    assert corrupt["error"] == "IntegrityError", corrupt
    assert "train.parquet is corrupt: sha256" in corrupt["message"] and expected in corrupt["message"]
    nothing_finished(workspace, "datasets")
    truncated, workspace = outcomes[("truncate", 2)]
    assert truncated["error"] == "IntegrityError", truncated
    assert f"train.parquet arrived with {size // 2} bytes, the hub states {size}" in truncated["message"]
    assert "Signature" not in truncated["message"]  # the signed CDN URL the hub client names
    nothing_finished(workspace, "datasets")
    once, _ = outcomes[("corrupt", 1)]
    assert once == {"rows": 60}, once  # the damaged copy was dropped from the hub cache and fetched again


# --- s3:// -----------------------------------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server behind a fault proxy; objects are uploaded without a CRC (as by tools that send none), so
    the only checksum a reader has is the MD5 ETag."""
    use_s3_credentials(monkeypatch)
    monkeypatch.setenv("KFP_FINETUNE_RETRY_DELAY", "0.01")
    with moto_s3() as endpoint, FaultProxy(endpoint) as proxy:
        plain = Config(request_checksum_calculation="when_required")
        client = boto3.client("s3", endpoint_url=endpoint, config=plain)
        client.create_bucket(Bucket="store")
        yield SimpleNamespace(proxy=proxy, client=client, endpoint=endpoint)


def upload(client, folder: Path, prefix: str) -> None:
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        client.upload_file(str(path), "store", f"{prefix}/{path.relative_to(folder).as_posix()}")


def gets(proxy: FaultProxy, key: str) -> int:
    return sum(1 for m, p, _ in proxy.requests if m == "GET" and p.split("?")[0] == f"/store/{key}")


@pytest.mark.slow
def test_s3_model_corrupt_or_truncated_is_refused_and_a_one_time_corruption_fetched_again(s3, tmp_path):
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    upload(s3.client, src, "tiny")
    weights = "store/tiny/model.safetensors"
    for damage, message in [
        (s3.proxy.corrupt, f"MD5 (the S3 ETag) {{}} does not match the source's {md5_file(src / 'model.safetensors')}"),
        (s3.proxy.truncate, "has {} bytes, the source says"),
    ]:  # fmt: skip
        workspace = tmp_path / f"ws-{damage.__name__}"
        damage(weights, times=2)
        with pytest.raises(storage.IntegrityError) as raised:
            initialize_model("s3://store/tiny", str(workspace), s3_endpoint_url=s3.proxy.url)
        assert "model.safetensors" in str(raised.value)
        assert message.split("{}")[-1] in str(raised.value)
        nothing_finished(workspace, "models")
    assert gets(s3.proxy, "tiny/model.safetensors") == 4

    s3.proxy.corrupt(weights)
    res = initialize_model("s3://store/tiny", str(tmp_path / "ws"), s3_endpoint_url=s3.proxy.url)
    assert (res.path / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert gets(s3.proxy, "tiny/model.safetensors") == 6


@pytest.mark.slow
def test_s3_object_with_a_crc_is_refused_by_the_client_check_naming_the_key(s3, tmp_path):
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    boto3.client("s3", endpoint_url=s3.endpoint).upload_file(  # boto3's default: a CRC32 the reader checks
        str(src / "model.safetensors"), "store", "crc/model.safetensors"
    )
    upload(s3.client, src / "original", "crc/original")
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        s3.client.upload_file(str(src / name), "store", f"crc/{name}")
    s3.proxy.corrupt("store/crc/model.safetensors", times=100)
    with pytest.raises(
        storage.IntegrityError, match=r"model\.safetensors \(key crc/model\.safetensors\) is corrupt"
    ):
        initialize_model("s3://store/crc", str(tmp_path / "ws"), s3_endpoint_url=s3.proxy.url)
    nothing_finished(tmp_path / "ws", "models")


@pytest.mark.slow
def test_s3_dataset_corrupt_or_truncated_is_refused_and_a_one_time_corruption_fetched_again(s3, tmp_path):
    build_tiny_dataset(tmp_path / "tiny", train_rows=40, eval_rows=5)
    upload(s3.client, tmp_path / "tiny", "reverse")
    expected = md5_file(tmp_path / "tiny" / "train.parquet")
    for damage in (s3.proxy.corrupt, s3.proxy.truncate):
        workspace = tmp_path / f"ws-{damage.__name__}"
        damage("store/reverse/train.parquet", times=2)
        with pytest.raises(storage.IntegrityError, match=r"train\.parquet") as raised:
            initialize_dataset("s3://store/reverse", str(workspace), s3_endpoint_url=s3.proxy.url)
        if damage == s3.proxy.corrupt:
            assert f"does not match the source's {expected}" in str(raised.value)
        assert not list(workspace.rglob("manifest.json"))
        assert not (workspace / "datasets" / "reverse").exists()
        # Only the file that verified stays, in the stable partial folder a retry resumes from.
        kept = sorted(p.relative_to(workspace).as_posix() for p in workspace.rglob("*.parquet"))
        assert kept == ["datasets/.reverse.partial/eval.parquet"], kept

    s3.proxy.corrupt("store/reverse/train.parquet")
    res = initialize_dataset("s3://store/reverse", str(tmp_path / "ws"), s3_endpoint_url=s3.proxy.url)
    assert res.train_metadata["num_rows"] == 40


@pytest.mark.slow
def test_publish_read_back_of_other_bytes_fails_and_leaves_no_completion_marker(s3, tmp_path):
    """What export does (publish_directory with its checksums file as the marker) when reading back finds other
    content than was uploaded: an error naming the file, and no marker saying the copy is complete (the manifest
    there is the incomplete one that keeps the files owned, with no checksum line in it)."""
    src = tmp_path / "export"
    (src / "adapter").mkdir(parents=True)
    (src / "adapter" / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
    (src / "checksums.sha256").write_text(storage.manifest_text({}, "run r, task t, at now"))
    s3.proxy.corrupt_etag("store/out/adapter/adapter_model.safetensors")
    with pytest.raises(
        storage.StorageError, match=r"verification failed: adapter/adapter_model\.safetensors"
    ):
        storage.publish_directory(
            src, "s3://store/out", manifest="checksums.sha256", endpoint_url=s3.proxy.url
        )
    left = s3.client.get_object(Bucket="store", Key="out/checksums.sha256")["Body"].read().decode()
    assert "(incomplete" in left.splitlines()[0] and "# owns: adapter/adapter_model.safetensors" in left
    assert not [line for line in left.splitlines() if not line.startswith("#")], left


@pytest.mark.slow
def test_export_to_s3_detects_a_read_back_of_other_bytes(finetuned, s3):
    s3.proxy.corrupt_etag("store/exported/adapter/adapter_model.safetensors")
    with pytest.raises(
        storage.StorageError, match=r"verification failed: adapter/adapter_model\.safetensors"
    ):
        test_export.export(finetuned, "s3://store/exported", format="both", s3_endpoint_url=s3.proxy.url)
    left = s3.client.get_object(Bucket="store", Key="exported/checksums.sha256")["Body"].read().decode()
    # Nothing says the copy is complete: the manifest there is the incomplete one, with no checksum line.
    assert "(incomplete" in left.splitlines()[0], left
    assert not [line for line in left.splitlines() if not line.startswith("#")], left
