"""model-initialize: file selection, verification, atomic writes, skip-if-present, hf:// end to end."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components.model_initialize.initialize import (
    ModelVerificationError,
    initialize_model,
    select_files,
)
from tests.support.hub_standin import HubStandin
from tests.support.sources import (
    ROOT,
    hub_env,
    moto_s3,
    result,
    run_python,
    use_s3_credentials,
    write_fake_model,
)


def artifact(tmp_path: Path) -> SimpleNamespace:
    return SimpleNamespace(path=str(tmp_path / "artifacts" / "model"), metadata={})


def test_select_files_prefers_safetensors_and_skips_other_frameworks():
    repo = [
        "config.json",
        "model.safetensors",
        "pytorch_model.bin",
        "tf_model.h5",
        "flax_model.msgpack",
        "original/tokenizer.model",
        "original/consolidated.00.pth",
        "tokenizer.json",
        "README.md",
        "merges.txt",
    ]
    assert select_files(repo) == [
        "config.json",
        "merges.txt",
        "model.safetensors",
        "original/tokenizer.model",
        "tokenizer.json",
    ]
    no_safetensors = [p for p in repo if p != "model.safetensors"]
    assert "pytorch_model.bin" in select_files(no_safetensors)
    assert "original/consolidated.00.pth" not in select_files(no_safetensors)
    assert select_files(["a.pth", "config.json"]) == ["a.pth", "config.json"]
    assert select_files(repo, ["*.json"]) == ["config.json", "tokenizer.json"]


def test_local_model_is_copied_verified_and_described(tmp_path, workspace, log_lines):
    src = write_fake_model(tmp_path / "src", shards=2)
    out = artifact(tmp_path)
    res = initialize_model(str(src), str(workspace), name="base", output_model=out)
    model_dir = workspace / "models" / "base"
    assert res.path == model_dir and not res.skipped
    names = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())
    assert names == [
        "config.json",
        "generation_config.json",
        "manifest.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "original/tokenizer.model",
        "original_repo_id.json",
        "tokenizer.json",
    ]
    assert json.loads((model_dir / "original_repo_id.json").read_text()) == {"repo_id": str(src)}
    meta = out.metadata
    assert meta["workspace_path"] == "models/base"
    assert meta["source_uri"] == str(src) and meta["model_type"] == "llama"
    assert meta["weight_format"] == "safetensors" and meta["num_files"] == 7
    assert meta["total_bytes"] == sum(f["size"] for f in meta["files"])
    assert all(len(f["sha256"]) == 64 for f in meta["files"])
    assert json.loads(Path(out.path).read_text())["fingerprint"] == res.manifest["fingerprint"]
    assert not list((workspace / "models").glob(".*"))  # no temp or partial dirs left
    progress = [line for line in log_lines if line.startswith(f"fetch {src}: done: ")]
    assert progress and "7/7 files" in progress[0] and "64.7 KiB / 64.7 KiB" in progress[0]
    assert progress[0].endswith("/s")


def test_rerun_skips_transfer_and_a_changed_source_is_fetched_again(tmp_path, workspace, log_lines):
    src = write_fake_model(tmp_path / "src", family="qwen")
    first = initialize_model(f"file://{src}", str(workspace), base_model_id="Qwen/Qwen2.5-0.5B")
    assert first.path.name == "src" and first.manifest["repo_id"] == "Qwen/Qwen2.5-0.5B"
    again = initialize_model(f"file://{src}", str(workspace), base_model_id="Qwen/Qwen2.5-0.5B")
    assert again.skipped and again.metadata["reused_existing_copy"] is True
    assert any("matching manifest: skipping the transfer" in line for line in log_lines)

    (src / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    changed = initialize_model(f"file://{src}", str(workspace), base_model_id="Qwen/Qwen2.5-0.5B")
    assert not changed.skipped
    assert json.loads((changed.path / "config.json").read_text())["hidden_size"] == 8

    # A copy whose file was damaged after the fact (size differs) is not reused either.
    (changed.path / "vocab.json").write_text("{}")
    assert not initialize_model(f"file://{src}", str(workspace), base_model_id="Qwen/Qwen2.5-0.5B").skipped


def test_a_family_reading_tokenizer_json_alone_is_verified_with_it(tmp_path, workspace):
    """SmolLM2's repos ship no SentencePiece or tiktoken file: its family reads tokenizer.json (a Llama 2 or 3 layout
    without its tokenizer file stays refused: the previous test)."""
    src = write_fake_model(tmp_path / "src", extra_bin=False)
    shutil.rmtree(src / "original")
    smollm2 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True,
               "vocab_size": 49152}  # fmt: skip
    (src / "config.json").write_text(json.dumps(smollm2))
    result = initialize_model(str(src), str(workspace), name="smollm2")
    assert (result.path / "tokenizer.json").is_file() and result.manifest["model_type"] == "llama"


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "config.json").unlink(), "config.json is missing"),
        (lambda d: (d / "config.json").write_text("{not json"), "config.json does not parse"),
        (lambda d: (d / "model-00002-of-00002.safetensors").unlink(), "missing: model-00002-of-00002"),
        (
            lambda d: (d / "original" / "tokenizer.model").unlink(),
            "no tokenizer for config.json's `model_type` 'llama'",
        ),
        (
            lambda d: (d / "model-00001-of-00002.safetensors").write_bytes(
                (d / "model-00001-of-00002.safetensors").read_bytes()[:-100]
            ),
            "model-00001-of-00002.safetensors is",
        ),
    ],
)
def test_verification_failures_name_the_problem_and_leave_nothing(tmp_path, workspace, damage, message):
    src = write_fake_model(tmp_path / "src", shards=2, extra_bin=False)
    damage(src)
    with pytest.raises(ModelVerificationError, match=message) as err:
        initialize_model(str(src), str(workspace), name="broken")
    assert str(src) in str(err.value)
    assert not (workspace / "models" / "broken").exists()
    # An unusable source leaves no partial folder either: no retry of the same source can resume into a model.
    assert list((workspace / "models").glob(".*")) == []


def test_qwen_needs_vocab_and_merges(tmp_path, workspace):
    src = write_fake_model(tmp_path / "src", family="qwen")
    (src / "merges.txt").unlink()
    with pytest.raises(ModelVerificationError, match=r"vocab.json\+merges.txt"):
        initialize_model(str(src), str(workspace))


def test_leftovers_of_a_killed_run_are_not_reused(tmp_path, workspace):
    src = write_fake_model(tmp_path / "src")
    models = workspace / "models"
    (models / ".base.tmp-deadbeef").mkdir(parents=True)  # temp dir of a killed attempt
    (models / ".base.tmp-deadbeef" / "model.safetensors").write_bytes(b"partial")
    (models / "base").mkdir()  # a folder without a manifest is not a complete copy
    (models / "base" / "config.json").write_text("{}")
    res = initialize_model(str(src), str(workspace), name="base")
    assert not res.skipped and (res.path / "manifest.json").is_file()
    assert not (models / ".base.tmp-deadbeef").exists()
    assert (res.path / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()


INIT_FROM_HUB = """
    import json
    from types import SimpleNamespace
    from kfp_finetune.components.model_initialize.initialize import initialize_model
    out = SimpleNamespace(path=%r, metadata={})
    res = initialize_model(%r, %r, max_workers=4, output_model=out)
    print(json.dumps(out.metadata))
"""


@pytest.mark.slow
def test_hf_model_end_to_end_with_commit_and_repo_id(tmp_path, workspace):
    src = write_fake_model(tmp_path / "src", shards=2)
    with HubStandin() as hub:
        repo = hub.add_repo("meta-llama/Tiny-3.2", {"main": src, "v1": src})
        code = INIT_FROM_HUB % (str(tmp_path / "art"), "hf://meta-llama/Tiny-3.2@v1", str(workspace))
        meta = result(run_python(code, hub_env(hub.endpoint, tmp_path)))
        gets = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert meta["commit_sha"] == repo.revisions["v1"].commit and meta["revision"] == "v1"
    assert meta["repo_id"] == "meta-llama/Tiny-3.2" and meta["workspace_path"] == "models/Tiny-3.2"
    model_dir = workspace / "models" / "Tiny-3.2"
    assert json.loads((model_dir / "original_repo_id.json").read_text()) == {"repo_id": "meta-llama/Tiny-3.2"}
    assert not any(p.endswith((".bin", ".h5", ".pth", "README.md")) for p in gets)
    assert not list(model_dir.glob(".*"))  # no hub client folder, no journal


@pytest.mark.slow
def test_hf_download_killed_midway_resumes_keeping_verified_files(tmp_path, workspace):
    """A step killed while the weights are half-sent, then retried: the files that had landed (and verify against
    the hub's sha256 / git blob ids) are not requested again; one cut short in the partial folder is."""
    src = write_fake_model(tmp_path / "src")
    landed = ["config.json", "generation_config.json", "original/tokenizer.model", "tokenizer.json"]
    with HubStandin() as hub:
        hub.add_repo("org/tiny", src)
        hub.fail_once("model.safetensors", "stall")
        env = hub_env(hub.endpoint, tmp_path)
        code = INIT_FROM_HUB % (str(tmp_path / "art"), "hf://org/tiny", str(workspace))
        child = subprocess.Popen([sys.executable, "-c", code.replace("\n    ", "\n")], env=env, cwd=ROOT)
        models = workspace / "models"
        partial = models / ".tiny.partial"
        deadline = time.monotonic() + 60  # a bound on waiting for a condition, not a timing assumption
        while not (
            hub.gets_of("/model.safetensors") and all((partial / name).is_file() for name in landed)
        ):  # the other files are in place (each is moved there complete) and the weights are stalled
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()
        # What a killed step leaves: the partial folder, never the entry.
        assert not (models / "tiny").exists()
        (partial / "tokenizer.json").write_bytes(b"{")  # cut off mid-write
        hub.release()
        meta = result(run_python(code, env))
        gets = {name: hub.gets_of("/" + name) for name in [*landed, "model.safetensors"]}
    assert meta["reused_existing_copy"] is False
    assert gets == {**dict.fromkeys(landed, 1), "tokenizer.json": 2, "model.safetensors": 2}, gets
    for name in [*landed, "model.safetensors"]:
        assert (models / "tiny" / name).read_bytes() == (src / name).read_bytes()
    assert not list(models.glob(".*"))  # partial folder renamed into place; no journal or hub scratch inside
    assert not list((models / "tiny").glob(".*"))


@pytest.mark.slow
def test_s3_model_with_custom_endpoint(tmp_path, workspace, monkeypatch):
    use_s3_credentials(monkeypatch)
    src = write_fake_model(tmp_path / "src", family="qwen")
    with moto_s3() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="models")
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            client.upload_file(str(path), "models", f"qwen/tiny/{path.relative_to(src).as_posix()}")
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # as a pipeline sets it from a Secret
        res = initialize_model("s3://models/qwen/tiny", str(workspace), base_model_id="Qwen/Tiny")
    assert res.path == workspace / "models" / "tiny"
    assert {f["path"] for f in res.manifest["files"]} == {
        "config.json",
        "generation_config.json",
        "merges.txt",
        "model.safetensors",
        "vocab.json",
    }
    assert json.loads((res.path / "original_repo_id.json").read_text()) == {"repo_id": "Qwen/Tiny"}


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["tiny_llama", "tiny_qwen"])
def test_tiny_kit_models_pass_verification(request, workspace, fixture):
    """The offline tiny models torchtune trains on (kfp_finetune.tiny) are accepted as they are."""
    src = request.getfixturevalue(fixture)
    res = initialize_model(str(src), str(workspace), name=fixture, base_model_id=f"tiny/{fixture}")
    copied = {f["path"] for f in res.manifest["files"]}
    assert "config.json" in copied and res.manifest["weight_format"] == "safetensors"
    if fixture == "tiny_llama":
        assert "original/tokenizer.model" in copied and res.manifest["model_type"] == "llama"
    else:
        assert {"vocab.json", "merges.txt"} <= copied and res.manifest["model_type"] == "qwen2"
