"""The adapter merged after training (_shared/torchtune/merge.py) is what torchtune's LoRA recipe writes at an epoch
end: real tiny LoRA / DoRA / QLoRA runs on CPU that save both, compared tensor for tensor and file for file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.merge import MERGED_DIR, merge_adapter, merged_model_dir
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
from kfp_finetune.components.torchtune_finetune.backends.local import run_local
from kfp_finetune.components.torchtune_finetune.outputs import finalize_checkpoint

pytestmark = pytest.mark.slow

ADAPTER_FILES = {"adapter_model.pt", "adapter_model.safetensors", "adapter_config.json"}


def train(model_dir: Path, data: Path, run_dir: Path, **settings):
    cfg = TorchtuneConfig(
        device="cpu", batch_size=2, gradient_accumulation_steps=1, max_steps_per_epoch=2, seed=0, **settings
    )
    run = resolve_run(cfg, model_dir, data, run_dir)
    run_local(tune_command(run.recipe, run.yaml_path), echo=lambda _: None)
    return run


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v for path in sorted(folder.glob("model*.safetensors")) for k, v in load_file(path).items()}


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def assert_same_model(merged: Path, torchtune_epoch: Path) -> None:
    """Bitwise-equal tensors (same names, dtypes, shards) and the files torchtune's epoch folder holds, less the
    adapter and the recipe's own state."""
    assert files(merged) == files(torchtune_epoch) - ADAPTER_FILES
    ours, theirs = weights(merged), weights(torchtune_epoch)
    assert list(ours) == list(theirs)
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name
        assert (
            ours[name].view(-1).view(dtype=_int_of(tensor)).equal(tensor.view(-1).view(dtype=_int_of(tensor)))
        ), name
    for index in merged.glob("*.index.json"):
        assert json.loads(index.read_text()) == json.loads((torchtune_epoch / index.name).read_text())


def _int_of(tensor):
    """The integer dtype of the tensor's width: compares bits, so -0.0 != 0.0 and NaN == NaN."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory):
    """dim 256: QLoRA's NF4 blocks need LoRA'd weights with numel divisible by 64 * 256."""
    from kfp_finetune.tiny.model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("wide") / "llama3_2", family="llama3_2", dim=256)


# method -> the model: DoRA on Qwen2.5 (biases beside the magnitude), QLoRA on a model wide enough for NF4.
CASES = {"lora": "tiny_llama", "dora": "tiny_qwen", "qlora": "wide_llama"}


@pytest.mark.parametrize("method", list(CASES))
def test_the_merge_writes_what_torchtunes_recipe_writes(method, tiny_dataset, tmp_path, request):
    base = request.getfixturevalue(CASES[method])
    run = train(
        base, tiny_dataset["train.jsonl"], tmp_path / "run", method=method, save_adapter_weights_only=False
    )
    epoch = run.run_dir / "epoch_0"
    assert (epoch / "model.safetensors.index.json").is_file(), "torchtune merged at the epoch end, as asked"

    merge_adapter(base, run.config, epoch / "adapter_model.pt", tmp_path / "ours")

    assert_same_model(tmp_path / "ours", epoch)


def test_an_adapter_run_saves_no_merged_weights_and_the_run_merges_once(tiny_llama, tiny_dataset, tmp_path):
    both = train(tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "both", method="lora",
                 save_adapter_weights_only=False)  # fmt: skip
    run = train(tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run", method="lora")

    assert run.config["save_adapter_weights_only"] is True
    assert not list((run.run_dir / "epoch_0").glob("model*")), "no merged weights written while training"
    checkpoint = finalize_checkpoint(run.run_dir, method="lora", base_model="org/tiny")
    assert checkpoint.merged_dir is None and checkpoint.adapter_dir is not None

    merged = merged_model_dir(run.run_dir, tiny_llama)
    assert merged == run.run_dir / MERGED_DIR
    assert_same_model(merged, both.run_dir / "epoch_0")  # training is deterministic: the same adapter
    stamp = {p: p.stat().st_mtime_ns for p in merged.iterdir()}
    assert merged_model_dir(run.run_dir, tiny_llama) == merged
    assert {p: p.stat().st_mtime_ns for p in merged.iterdir()} == stamp, "a second consumer reuses the merge"

    finalize_checkpoint(run.run_dir, method="lora", base_model="org/tiny")  # a retried step's new adapter
    assert not merged.exists(), "a merge of an earlier attempt's adapter is never reused"


def test_the_module_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import kfp_finetune.components._shared.torchtune.merge as m; print(m.MERGED_DIR)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == MERGED_DIR, out.stderr
