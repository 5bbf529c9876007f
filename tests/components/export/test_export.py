"""export: a real (tiny) torchtune fine-tune exported to a local path, to S3 (moto's server) and to the Hub
(the hub stand-in, through the real huggingface_hub client): layout, model card, checksums, dtype conversion,
torchtune load-back with identical logits, no-op re-export, refused conflicts, overwrite, resumed uploads."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.storage import publish
from kfp_finetune.components.export.export import ExportError, export_model
from tests.support.hub_standin import HubStandin
from tests.support.sources import ROOT, hub_env, moto_s3, result, run_python, use_s3_credentials

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finetuned(tiny_llama, tiny_dataset, tmp_path_factory):
    """A workspace holding the base model and one 2-step LoRA run, which saves only its adapter (the default), with
    the metadata finetune would output; and `reference`: the same run asked to save torchtune's merged weights
    too (save_adapter_weights_only=False: the recipe's own merge at the epoch end)."""
    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
    from kfp_finetune.components.torchtune_finetune.backends.local import run_local
    from kfp_finetune.components.torchtune_finetune.outputs import finalize_checkpoint

    workspace = tmp_path_factory.mktemp("workspace")
    base = workspace / "models" / "base"
    shutil.copytree(tiny_llama, base)
    runs = {}
    for name, adapter_only in (("r1", None), ("reference", False)):
        config = TorchtuneConfig(
            method="lora", device="cpu", batch_size=2, gradient_accumulation_steps=1, max_steps_per_epoch=2,
            seed=0, save_adapter_weights_only=adapter_only,
        )  # fmt: skip
        runs[name] = resolve_run(config, base, tiny_dataset["train.jsonl"], workspace / "runs" / name)
        run_local(tune_command(runs[name].recipe, runs[name].yaml_path), echo=lambda _: None)
    checkpoint = finalize_checkpoint(runs["r1"].run_dir, method="lora", base_model="org/tiny-llama")
    assert checkpoint.merged_dir is None
    metadata = {
        "workspace_path": "runs/r1/adapter",
        "merged_path": "",
        "adapter_path": "runs/r1/adapter",
        "run_dir": "runs/r1",
        "base_model": "org/tiny-llama",
        "base_model_path": "models/base",
        "base_model_revision": "0123abcd",
        "dataset_source": "s3://data/reverse/train.jsonl",
        "recipe": runs["r1"].recipe,
        "config": runs["r1"].config_name,
        "method": "lora",
        "epochs": 1,
        "steps": 2,
        "final_loss": 5.5,
        "min_loss": 5.25,
        "tokens_per_second": 1234.5,
    }
    return SimpleNamespace(
        workspace=workspace, metadata=metadata, reference=runs["reference"].run_dir / "epoch_0"
    )


def export(finetuned, destination, **kwargs):
    out = SimpleNamespace(path=str(Path(tempfile.mkdtemp()) / "exported"), metadata={}, uri="")
    res = export_model(
        workspace=finetuned.workspace, model_metadata=finetuned.metadata, destination=str(destination),
        run_name="nightly-retune-42", run_id="run-uuid-42", output=out, **kwargs,
    )  # fmt: skip
    return res, out


def load_logits(model_dir: Path):
    """Load an HF model folder the way evaluate does (torchtune builder + HF checkpointer); logits of a fixed
    token sequence."""
    import torch
    from omegaconf import OmegaConf
    from torchtune import config, training

    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir

    model_dir = inspect_model_dir(model_dir)
    model = config.instantiate(OmegaConf.create(model_dir.model_node()))
    with tempfile.TemporaryDirectory() as scratch:
        checkpointer = config.instantiate(OmegaConf.create(model_dir.checkpointer_node(scratch)))
        state = checkpointer.load_checkpoint()[training.MODEL_KEY]
    dtypes = {t.dtype for t in state.values()}
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return model(torch.arange(1, 33).unsqueeze(0)), dtypes, model


def tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# --- local path ---------------------------------------------------------------------------------------------


def test_merged_export_to_a_path_loads_back_with_identical_logits(finetuned, tmp_path):
    import torch

    dest = tmp_path / "pvc" / "tuned"
    res, out = export(finetuned, dest, format="merged", eval_metrics={"tuned_eval_loss": 0.5, "passed": True})

    merged = finetuned.workspace / "runs/r1/merged"
    assert res.state == "created" and out.uri == str(dest)
    assert tree(dest) == sorted(tree(merged) + ["README.md", "checksums.sha256"])
    assert not {"adapter_config.json", "adapter_model.safetensors"} & set(tree(dest))
    expected, _, _ = load_logits(merged)
    exported, _, _ = load_logits(dest)
    assert torch.equal(exported, expected)

    lines = [
        line for line in (dest / "checksums.sha256").read_text().splitlines() if not line.startswith("#")
    ]
    assert len(lines) == len(tree(dest)) - 1
    for line in lines:
        digest, name = line.split("  ")
        assert hashlib.sha256((dest / name).read_bytes()).hexdigest() == digest
    meta = out.metadata
    assert meta["manifest_sha256"] == hashlib.sha256((dest / "checksums.sha256").read_bytes()).hexdigest()
    assert (
        meta["files"]["README.md"]["sha256"] == hashlib.sha256((dest / "README.md").read_bytes()).hexdigest()
    )
    assert meta["total_bytes"] == sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    assert (meta["format"], meta["base_model"], meta["state"]) == ("merged", "org/tiny-llama", "created")
    assert meta["metrics"] == {"final_loss": 5.5, "min_loss": 5.25, "tuned_eval_loss": 0.5}
    assert json.loads(Path(out.path).read_text())["kind"] == "exported-model"

    card = (dest / "README.md").read_text()
    for fact in ("base_model: org/tiny-llama", "0123abcd", "s3://data/reverse/train.jsonl", "| method | lora |",
                 "| LoRA rank | 64 |", "| tuned_eval_loss | 0.5 |", "nightly-retune-42", "run-uuid-42"):  # fmt: skip
        assert fact in card, fact
    assert "passed" not in card  # only numbers go into the metrics table

    again, _ = export(finetuned, dest, format="merged", eval_metrics={"tuned_eval_loss": 0.5})
    assert (again.state, again.uploaded) == ("unchanged", [])
    assert not list((finetuned.workspace / "runs/r1").glob("exports/.*"))  # staging cleaned up


def test_a_merged_export_of_an_adapter_only_run_publishes_torchtunes_merged_model(finetuned, tmp_path):
    """The run saved no merged weights (no GPU idled at its epoch end); the export merged its adapter on CPU into
    what torchtune's recipe writes when it merges (the reference run): the same files, bit for bit, and
    transformers loads it with the reference's logits."""
    transformers = pytest.importorskip("transformers")
    import torch
    from safetensors.torch import load_file

    assert not list((finetuned.workspace / "runs/r1/epoch_0").glob("model*")), (
        "training wrote no merged weights"
    )
    dest = tmp_path / "merged"
    export(finetuned, dest, format="merged")

    reference = finetuned.reference
    adapter_files = {"adapter_config.json", "adapter_model.safetensors", "adapter_model.pt"}
    assert tree(dest) == sorted({*tree(reference), "README.md", "checksums.sha256"} - adapter_files)
    for shard in reference.glob("model*.safetensors"):
        ours, theirs = load_file(dest / shard.name), load_file(shard)
        assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in theirs), shard.name
    merged_only = (
        tmp_path / "reference"
    )  # transformers would read a folder with adapter_config.json as PEFT's
    shutil.copytree(reference, merged_only, ignore=shutil.ignore_patterns(*adapter_files))
    tokens = torch.arange(1, 33).unsqueeze(0)
    with torch.no_grad():
        exported = transformers.AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)(tokens).logits
        expected = transformers.AutoModelForCausalLM.from_pretrained(merged_only, dtype=torch.float32)
        assert torch.equal(exported, expected(tokens).logits)


def test_a_credential_in_an_upstream_uri_reaches_neither_the_model_card_nor_the_metadata(finetuned, tmp_path):
    secret = "plantedsignature0123456789abcdef"
    presigned = f"https://data.example/train.jsonl?X-Amz-Credential=AKIAPLANTED&X-Amz-Signature={secret}"
    leaky = SimpleNamespace(
        workspace=finetuned.workspace, metadata={**finetuned.metadata, "dataset_source": presigned}
    )
    dest = tmp_path / "pvc" / "redacted"
    res, out = export(leaky, dest, format="adapter")
    recorded = [p.read_text() for p in dest.rglob("*") if p.suffix in (".md", ".sha256", ".json")]
    recorded += [json.dumps(out.metadata), Path(out.path).read_text(), json.dumps(res.metadata)]
    assert not [text[:200] for text in recorded if secret in text or "AKIAPLANTED" in text]
    assert "https://data.example/train.jsonl?<redacted>" in (dest / "README.md").read_text()


def test_bf16_export_converts_weights_and_keeps_config_and_index_consistent(finetuned, tmp_path):
    import torch
    from safetensors import safe_open

    dest = tmp_path / "bf16"
    res, out = export(finetuned, dest, format="both", dtype="bf16")

    assert "adapter/adapter_config.json" in res.files and "adapter/adapter_model.safetensors" in res.files
    assert json.loads((dest / "config.json").read_text())["torch_dtype"] == "bfloat16"
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    tensor_bytes = 0
    for shard in set(index["weight_map"].values()):
        with safe_open(str(dest / shard), framework="pt") as f:
            assert set(index["weight_map"]) >= set(f.keys())
            tensors = [f.get_tensor(k) for k in f.keys()]  # noqa: SIM118
        assert {t.dtype for t in tensors} == {torch.bfloat16}
        tensor_bytes += sum(t.numel() * t.element_size() for t in tensors)
    assert index["metadata"]["total_size"] == tensor_bytes
    with safe_open(str(dest / "adapter/adapter_model.safetensors"), framework="pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}  # noqa: SIM118
    assert out.metadata["dtype"] == "bfloat16"

    # The bf16 export is the fp32 checkpoint rounded to bf16: exactly those logits.
    exported, dtypes, _ = load_logits(dest)
    assert dtypes == {torch.bfloat16}
    _, _, reference = load_logits(finetuned.workspace / "runs/r1/merged")
    with torch.no_grad():
        for param in reference.parameters():
            param.copy_(param.to(torch.bfloat16).float())
        assert torch.equal(exported, reference(torch.arange(1, 33).unsqueeze(0)))
    # The training run's files were linked, not edited.
    assert (
        json.loads((finetuned.workspace / "runs/r1/merged/config.json").read_text())["torch_dtype"]
        == "float32"
    )


def test_conflicting_path_is_refused_then_overwritten(finetuned, tmp_path):
    dest = tmp_path / "tuned"
    export(finetuned, dest, format="both")
    before = {p: (dest / p).read_bytes() for p in tree(dest)}

    with pytest.raises(storage.DestinationConflict, match="export_overwrite=true") as err:
        export(finetuned, dest, format="merged", dtype="fp16")
    assert "model-00001-of-00001.safetensors (different content)" in str(err.value)
    assert "adapter/adapter_model.safetensors (not part of this export)" in str(err.value)
    assert {p: (dest / p).read_bytes() for p in tree(dest)} == before  # untouched

    res, _ = export(finetuned, dest, format="merged", dtype="fp16", overwrite=True)
    assert res.state == "replaced"
    assert not (dest / "adapter").exists() or not tree(dest / "adapter")
    assert json.loads((dest / "config.json").read_text())["torch_dtype"] == "float16"


def killed_manifest(finished: str) -> str:
    """The manifest an export writes before copying anything (publish.py): its first line marked incomplete,
    then the files it claims, no checksums."""
    first, *lines = finished.splitlines()
    claims = "".join(f"{publish._CLAIM}{line.split('  ', 1)[1]}\n" for line in lines if "  " in line)
    return f"{first}{publish._INCOMPLETE}\n{claims}"


def test_interrupted_copy_to_a_path_is_completed(finetuned, tmp_path):
    dest = tmp_path / "tuned"
    first, _ = export(finetuned, dest, format="adapter")
    # What a killed copy leaves: some files, a half-written temp file, its incomplete manifest (written first).
    (dest / "checksums.sha256").write_text(killed_manifest((dest / "checksums.sha256").read_text()))
    weights = dest / "adapter_model.safetensors"
    (dest / ".adapter_model.safetensors.part-dead1234").write_bytes(weights.read_bytes()[:100])
    weights.unlink()

    res, _ = export(finetuned, dest, format="adapter")
    assert res.state == "resumed"
    assert sorted(res.uploaded) == ["adapter_model.safetensors", "checksums.sha256"]
    assert tree(dest) == sorted(first.files) and not list(dest.glob(".*"))
    assert (
        json.loads((dest / "adapter_config.json").read_text())["base_model_name_or_path"] == "org/tiny-llama"
    )


# --- bad input: clear errors, nothing written ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "destination", "match"),
    [
        ({}, "gs://bucket/model", r"unknown scheme 'gs' \(use Cloud Storage's S3-compatible API"),
        ({}, "relative/dir", "no scheme and not an absolute path"),
        ({}, "https://example.org/model", "use s3://bucket/prefix, hf://org/repo, oci://registry/repository:tag or a path"),
        ({}, "s3://bucket", "name a folder"),
        ({"format": "adapter", "meta": {"method": "full", "adapter_path": ""}}, "/x", "a full fine-tune has no adapter"),
        ({"format": "merged", "meta": {"base_model_path": "models/gone"}}, "/x", "base model .* set export_format=adapter"),
        ({"format": "merged", "meta": {"adapter_path": ""}}, "/x", "neither merged weights nor an adapter"),
        ({"format": "gguf"}, "/x", "format must be one of merged, adapter, both \\(got 'gguf'\\)"),
        ({"dtype": "int4"}, "/x", "dtype must be bf16, fp16 or fp32.*\\(got 'int4'\\)"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_before_anything_is_written(finetuned, tmp_path, change, destination, match):
    meta = {**finetuned.metadata, **change.pop("meta", {})}
    dest = destination if destination != "/x" else str(tmp_path / "never")
    with pytest.raises(ExportError, match=match):
        export_model(workspace=finetuned.workspace, model_metadata=meta, destination=dest, **change)
    assert not (tmp_path / "never").exists()


def test_missing_credentials_are_reported_before_any_upload(finetuned, monkeypatch, tmp_path):
    for key in [k for k in os.environ if k.startswith(("AWS_", "HF_TOKEN"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(storage.StorageError, match="HF_TOKEN is not set"):
        export_model(
            workspace=finetuned.workspace, model_metadata=finetuned.metadata, destination="hf://org/m"
        )
    with pytest.raises(storage.StorageError, match="no S3 credentials"):
        export_model(workspace=finetuned.workspace, model_metadata=finetuned.metadata, destination="s3://b/m")


# --- s3:// --------------------------------------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    use_s3_credentials(monkeypatch)
    with moto_s3() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="models")
        yield endpoint, client


def s3_tree(client, prefix: str) -> dict[str, dict]:
    objects = client.list_objects_v2(Bucket="models", Prefix=prefix + "/").get("Contents", [])
    return {o["Key"][len(prefix) + 1 :]: {"size": o["Size"], "etag": o["ETag"]} for o in objects}


def test_s3_export_verified_rerun_conflict_and_overwrite(finetuned, s3):
    endpoint, client = s3
    res, out = export(finetuned, "s3://models/tiny/v1", format="both", s3_endpoint_url=endpoint)
    assert res.state == "created" and out.metadata["destination"] == "s3://models/tiny/v1"
    assert out.uri != "s3://models/tiny/v1", (
        "KFP would try to upload the artifact into the destination bucket"
    )
    objects = s3_tree(client, "tiny/v1")
    assert sorted(objects) == sorted(res.files)
    head = client.head_object(Bucket="models", Key="tiny/v1/adapter/adapter_model.safetensors")
    assert head["Metadata"]["sha256"] == res.files["adapter/adapter_model.safetensors"]["sha256"]
    body = client.get_object(Bucket="models", Key="tiny/v1/checksums.sha256")["Body"].read()
    assert hashlib.sha256(body).hexdigest() == out.metadata["manifest_sha256"]

    again, _ = export(finetuned, "s3://models/tiny/v1", format="both", s3_endpoint_url=endpoint)
    assert (again.state, again.uploaded) == ("unchanged", [])
    assert s3_tree(client, "tiny/v1") == objects

    with pytest.raises(storage.DestinationConflict):
        export(finetuned, "s3://models/tiny/v1", format="merged", s3_endpoint_url=endpoint)
    assert s3_tree(client, "tiny/v1") == objects

    replaced, _ = export(
        finetuned, "s3://models/tiny/v1", format="merged", overwrite=True, s3_endpoint_url=endpoint
    )
    assert replaced.state == "replaced" and replaced.uploaded == ["README.md", "checksums.sha256"]
    assert sorted(s3_tree(client, "tiny/v1")) == sorted(replaced.files)  # adapter/ removed

    with pytest.raises(storage.StorageError, match="bucket 'nope' does not exist"):
        export(finetuned, "s3://nope/tiny", s3_endpoint_url=endpoint)


def test_s3_interrupted_upload_is_completed(finetuned, s3):
    endpoint, client = s3
    first, _ = export(finetuned, "s3://models/tiny/v2", format="merged", s3_endpoint_url=endpoint)
    # What a killed upload leaves: some objects, and its incomplete manifest (uploaded first).
    finished = client.get_object(Bucket="models", Key="tiny/v2/checksums.sha256")["Body"].read().decode()
    client.put_object(
        Bucket="models", Key="tiny/v2/checksums.sha256", Body=killed_manifest(finished).encode()
    )
    client.delete_object(Bucket="models", Key="tiny/v2/model-00001-of-00001.safetensors")
    kept = {key: body for key, body in s3_tree(client, "tiny/v2").items() if key != "checksums.sha256"}

    res, _ = export(finetuned, "s3://models/tiny/v2", format="merged", s3_endpoint_url=endpoint)
    assert res.state == "resumed"
    assert sorted(res.uploaded) == ["checksums.sha256", "model-00001-of-00001.safetensors"]
    now = s3_tree(client, "tiny/v2")
    assert sorted(now) == sorted(first.files)
    assert all(now[key] == value for key, value in kept.items())


# --- hf:// --------------------------------------------------------------------------------------------------

EXPORT_TO_HUB = """
import json, sys
from types import SimpleNamespace
from kfp_finetune.components.export.export import export_model
out = SimpleNamespace(path=sys.argv[3], metadata={}, uri="")
res = export_model(workspace=sys.argv[1], model_metadata=json.loads(sys.argv[2]), destination=sys.argv[4],
                   format=sys.argv[5], output=out)
print(json.dumps({"state": res.state, "uploaded": res.uploaded, "uri": out.uri, "metadata": out.metadata}))
"""


def test_hf_push_is_private_verified_and_a_rerun_is_a_no_op(finetuned, tmp_path):
    args = [str(finetuned.workspace), json.dumps(finetuned.metadata), str(tmp_path / "art")]
    with HubStandin() as hub:
        env = hub_env(hub.endpoint, tmp_path, token="hf_writer")
        first = result(run_python(EXPORT_TO_HUB, env, *args, "hf://acme/tiny-tuned", "both"))
        repo = hub.repos[("model", "acme/tiny-tuned")]
        commit = repo.revisions["main"].commit
        second = result(run_python(EXPORT_TO_HUB, env, *args, "hf://acme/tiny-tuned", "both"))
        puts = [p for m, p, _ in hub.requests if m == "PUT"]
        conflict = run_python(EXPORT_TO_HUB, env, *args, "hf://acme/tiny-tuned", "merged")
    assert first["state"] == "created" and first["uri"] == "hf://acme/tiny-tuned"
    assert first["metadata"]["commit_sha"] == commit
    assert repo.private and repo.tokens == {"hf_writer"}
    files = repo.revisions["main"].files
    assert sorted(set(files) - {".gitattributes"}) == sorted(first["metadata"]["files"])
    for path, entry in first["metadata"]["files"].items():
        assert files[path].sha256 == entry["sha256"]
    assert files["model-00001-of-00001.safetensors"].lfs and not files["config.json"].lfs
    assert (second["state"], second["uploaded"]) == ("unchanged", [])
    assert repo.revisions["main"].commit == commit  # neither an empty commit nor the refused one
    assert conflict.returncode != 0 and "DestinationConflict" in conflict.stderr
    assert "adapter/adapter_config.json (not part of this export)" in conflict.stderr
    assert (
        len(puts) == len(set(puts)) == sum(f.lfs for f in files.values())
    )  # each LFS object once, first run


def test_hf_push_killed_midway_resumes_without_resending_uploaded_objects(finetuned, tmp_path):
    # Without dtype conversion the staged weights are the run's files: same sha256 (the LFS object ids).
    run = finetuned.workspace / "runs/r1"
    merged_sha = hashlib.sha256((run / "merged/model-00001-of-00001.safetensors").read_bytes()).hexdigest()
    adapter_sha = hashlib.sha256((run / "adapter/adapter_model.safetensors").read_bytes()).hexdigest()
    args = [
        str(finetuned.workspace),
        json.dumps(finetuned.metadata),
        str(tmp_path / "art"),
        "hf://acme/resumed",
    ]
    args.append("both")
    with HubStandin() as hub:
        env = hub_env(hub.endpoint, tmp_path, token="hf_writer")
        hub.fail_once(adapter_sha, "stall")
        child = subprocess.Popen(
            [sys.executable, "-c", EXPORT_TO_HUB, *args], env=env, cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not (hub.puts_of(merged_sha) and hub.stalled) and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert hub.puts_of(merged_sha) == 1 and hub.puts_of(adapter_sha) == 0
        assert sorted(hub.repos[("model", "acme/resumed")].revisions["main"].files) == [".gitattributes"]
        hub.release()
        rerun = result(run_python(EXPORT_TO_HUB, env, *args))
        final = hub.repos[("model", "acme/resumed")].revisions["main"].files
        assert hub.puts_of(merged_sha) == 1 and hub.puts_of(adapter_sha) == 1  # not sent again
    assert sorted(set(final) - {".gitattributes"}) == sorted(rerun["metadata"]["files"])
    assert final["adapter/adapter_model.safetensors"].sha256 == adapter_sha


def test_transformers_and_peft_load_the_export_with_matching_logits(finetuned, tiny_llama, tmp_path):
    """Optional: runs when the test extra's transformers and peft are installed."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    dest = tmp_path / "both"
    export(finetuned, dest, format="both")
    expected, _, _ = load_logits(finetuned.workspace / "runs/r1/merged")
    tokens = torch.arange(1, 33).unsqueeze(0)

    merged = AutoModelForCausalLM.from_pretrained(dest, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with_adapter = PeftModel.from_pretrained(base, dest, subfolder="adapter")
    with torch.no_grad():
        torch.testing.assert_close(merged(tokens).logits, expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(with_adapter(tokens).logits, expected, atol=1e-5, rtol=0)


def test_hf_push_without_write_access_fails_clearly(finetuned, tmp_path):
    someone_elses = tmp_path / "theirs"
    someone_elses.mkdir()
    (someone_elses / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    args = [
        str(finetuned.workspace),
        json.dumps(finetuned.metadata),
        str(tmp_path / "art"),
        "hf://them/model",
    ]
    with HubStandin() as hub:
        repo = hub.add_repo("them/model", someone_elses, tokens=("their_token",))
        proc = run_python(EXPORT_TO_HUB, hub_env(hub.endpoint, tmp_path, token="hf_writer"), *args, "merged")
        assert sorted(repo.revisions["main"].files) == [".gitattributes"]
        assert not [p for m, p, _ in hub.requests if m == "PUT"]
    assert proc.returncode != 0
    assert "access to model repo 'them/model' (hf://them/model) denied (403): check HF_TOKEN" in proc.stderr
    assert "hf_writer" not in proc.stderr  # the token is never logged
