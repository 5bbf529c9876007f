"""Training on dataset-initialize's packs: the same loss curve as torchtune's own packing; else a logged fallback."""

import pytest

from kfp_finetune.components._shared.contract import DatasetSplit
from kfp_finetune.components._shared.torchtune import sample_packing
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.torchtune_finetune.backends.local import run_local
from kfp_finetune.components.torchtune_finetune.finetune import (
    ArtifactInput,
    component_settings,
    run_finetune,
)
from kfp_finetune.components.torchtune_finetune.packed_data import COMPONENT
from kfp_finetune.components.torchtune_finetune.packs import use_packs
from kfp_finetune.tiny.dataset import build_tiny_dataset

pytestmark = pytest.mark.slow
MAX_SEQ_LEN = 64
INSTRUCT = "torchtune.datasets.instruct_dataset"


def torchtune_packs(dataset: dict) -> bool:
    """The node has torchtune pack the instruct rows (through sample_packing.py, as a resolved run packs)."""
    return (dataset["_component_"], dataset["builder"], dataset["packed"]) == (
        sample_packing.COMPONENT,
        INSTRUCT,
        True,
    )


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("packs")
    return build_tiny_dataset(root / "tiny", train_rows=300, eval_rows=10)["train.jsonl"]


def _initialize(source, tiny_llama, **masking):
    """dataset-initialize with the base model, into one workspace (the same dataset entry each time)."""
    workspace = source.parent.parent / "ws"
    result = initialize_dataset(
        str(source),
        str(workspace),
        base_model_path=tiny_llama,
        max_seq_len=MAX_SEQ_LEN,
        num_proc=2,
        **masking,
    )
    return workspace, result


@pytest.fixture(scope="module")
def packed_split(source, tiny_llama):
    workspace, result = _initialize(source, tiny_llama)
    split = DatasetSplit.from_metadata(result.train_metadata, input_name="train_data")
    return workspace, result.path / "train", split


def _cfg(**more):
    return TorchtuneConfig(
        device="cpu", batch_size=2, gradient_accumulation_steps=1, max_steps_per_epoch=4, seed=0,
        packed=True, max_seq_len=MAX_SEQ_LEN, **more,
    )  # fmt: skip


def test_same_losses_as_torchtunes_own_packing(packed_split, tiny_llama, tmp_path, log_lines):
    workspace, train_dir, split = packed_split
    own = resolve_run(_cfg(), tiny_llama, train_dir, tmp_path / "own")
    ours = resolve_run(
        _cfg(), tiny_llama, train_dir, tmp_path / "ours", packs=lambda c: use_packs(c, split, workspace)
    )
    assert torchtune_packs(own.config["dataset"])
    assert ours.config["dataset"]["_component_"] == COMPONENT
    assert any("training on dataset-initialize's" in line for line in log_lines)
    losses = {}
    for name, run in (("own", own), ("ours", ours)):
        result = run_local(tune_command(run.recipe, run.yaml_path), echo=lambda _: None)
        losses[name] = [s.loss for s in result.steps]
    assert len(losses["ours"]) == 4
    assert losses["ours"] == pytest.approx(losses["own"], rel=1e-5, abs=1e-6)


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"max_seq_len": 128}, "max_seq_len 128 differs"),
        ({"packed": False}, "packing is off"),
    ],
)
def test_packs_made_otherwise_are_not_used(packed_split, tiny_llama, tmp_path, log_lines, settings, why):
    workspace, train_dir, split = packed_split
    cfg = _cfg()
    for key, value in settings.items():
        setattr(cfg, key, value)
    run = resolve_run(cfg, tiny_llama, train_dir, tmp_path, packs=lambda c: use_packs(c, split, workspace))
    dataset = run.config["dataset"]
    assert torchtune_packs(dataset) if cfg.packed else dataset["_component_"] == INSTRUCT
    assert any(why in line and "torchtune tokenizes" in line for line in log_lines)


def test_another_template_is_not_used(packed_split, tiny_llama, tmp_path, log_lines):
    workspace, train_dir, split = packed_split
    cfg = _cfg()
    cfg.dataset.train_on_input = True
    run = resolve_run(cfg, tiny_llama, train_dir, tmp_path, packs=lambda c: use_packs(c, split, workspace))
    assert run.config["dataset"]["_component_"] != COMPONENT
    assert any("template or masking differs" in line for line in log_lines)


class _Captured(Exception):
    pass


class _CaptureConfig:
    """A backend that keeps the resolved config the fine-tune step would train with, and stops there."""

    name, devices, nodes = "capture", 1, 1

    def gpus_available(self) -> bool:
        return False

    def prepare(self, run_dir, *, resume_point=None) -> None:
        pass

    def run(self, resolved, *, total_steps):
        raise _Captured(resolved.config)


def _step_config(workspace, tiny_llama, train_metadata: dict, **parameters) -> dict:
    """The config the fine-tune step resolves from these component parameters and train_data metadata."""
    settings = component_settings(
        {"method": "lora", "device": "cpu", "batch_size": 2, "max_steps_per_epoch": 2, "packed": True,
         "max_seq_len": MAX_SEQ_LEN, **parameters}
    )  # fmt: skip
    with pytest.raises(_Captured) as captured:
        run_finetune(
            workspace=workspace, train_data=ArtifactInput(dict(train_metadata)),
            base_model=ArtifactInput({"workspace_path": str(tiny_llama)}), settings=settings, run_id="r",
            task_name="packs", backend=_CaptureConfig(),
        )  # fmt: skip
    return captured.value.args[0]


@pytest.mark.parametrize(
    ("made_with", "run_with"),
    [
        ({"train_on_input": True}, {"train_on_input": "true"}),
        ({"new_system_prompt": "Reverse it."}, {"new_system_prompt": "Reverse it."}),
    ],
)
def test_a_run_with_other_masking_trains_on_packs_made_with_it(
    packed_split, source, tiny_llama, log_lines, made_with, run_with
):
    """The same pipeline parameter feeds both steps: packs made with train_on_input=True (new_system_prompt) are
    used by a run with it, in the same dataset entry as the default packs; the default ones are not."""
    workspace, _, default = packed_split
    _, made = _initialize(source, tiny_llama, **made_with)
    assert made.train_metadata["pack_fingerprint"] != default.pack_fingerprint
    assert made.train_metadata["packs"] != default.to_metadata()["packs"]  # another folder, not reused

    config = _step_config(workspace, tiny_llama, made.train_metadata, **run_with)
    assert config["dataset"]["_component_"] == COMPONENT
    assert not any("not training on dataset-initialize's packs" in line for line in log_lines)

    config = _step_config(workspace, tiny_llama, default.to_metadata(), **run_with)
    assert torchtune_packs(config["dataset"])
    assert any("template or masking differs" in line and "torchtune tokenizes" in line for line in log_lines)


def test_a_long_prompt_dataset_trains_on_its_packs_with_the_default_max_seq_len(
    tiny_llama, tmp_path, log_lines
):
    """dataset-initialize keeps the 99th percentile's pack length under a prompt longer than it (the row is left
    out); the fine-tune step's default max_seq_len, from the stats it recorded, is the same length: the packs are
    used, not torchtune's."""
    from kfp_finetune.components.torchtune_finetune.finetune import recorded_lengths
    from tests.support.long_prompt import write_jsonl

    source = write_jsonl(tmp_path / "long-prompt.jsonl")
    result = initialize_dataset(
        str(source), str(tmp_path / "ws"), eval_fraction=0.0, base_model_path=tiny_llama
    )
    split = DatasetSplit.from_metadata(result.train_metadata, input_name="train_data")
    assert split.token_stats["p99"] < split.max_seq_len == 256 < split.token_stats["prompt_max"]
    # Packed, one epoch, as set: 100 rows in a few packs plan fewer than MIN_OPTIMIZER_STEPS, and left to the
    # defaults they would train unpacked (run_length.py).
    run = resolve_run(
        TorchtuneConfig(method="lora", device="cuda", epochs=1, overrides={"dataset.packed": True}), tiny_llama,
        result.path / "train", tmp_path / "run", write=False, token_lengths=recorded_lengths(split),
        packs=lambda c: use_packs(c, split, tmp_path / "ws"),
    )  # fmt: skip
    assert run.config["tokenizer"]["max_seq_len"] == split.max_seq_len
    assert run.config["dataset"]["_component_"] == COMPONENT
    assert not any("not training on dataset-initialize's packs" in line for line in log_lines)
