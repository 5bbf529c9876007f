"""A default run learns or says why (issue 23 item 1): 60 alpaca rows with every default train at least
MIN_OPTIMIZER_STEPS optimizer steps, none at lr 0, and change the weights; a run that changes nothing fails the
step; data too small for a run that learns are refused in one line. Real torchtune on CPU, the step's own entry
point (run_finetune with the local backend) on dataset-initialize's output. The same 60 rows through the README's
`kfp-finetune run-local` command, every step under kfp.local, learn, pass the gate and export the tuned model
(tests/cli/test_readme_commands.py)."""

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.metrics_file import read_metrics_file
from kfp_finetune.components._shared.torchtune import lr_schedule
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run
from kfp_finetune.components._shared.torchtune.run_length import MIN_OPTIMIZER_STEPS, planned_steps
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.torchtune_finetune.backends import backend_for
from kfp_finetune.components.torchtune_finetune.finetune import (
    ArtifactInput,
    component_settings,
    run_finetune,
)
from kfp_finetune.components.torchtune_finetune.weights import (
    WeightsUnchanged,
    is_zero,
    tensors,
)
from tests.support.little_data import alpaca_rows

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sixty_rows(tmp_path_factory, tiny_llama):
    """dataset-initialize on 60 alpaca rows with its pipeline defaults (5 % held out): 57 training rows."""
    root = tmp_path_factory.mktemp("sixty")
    workspace = root / "ws"
    result = initialize_dataset(
        str(alpaca_rows(root / "alpaca.jsonl", 60)), str(workspace), eval_fraction=0.05,
        base_model_path=tiny_llama,
    )  # fmt: skip
    assert result.train_metadata["num_rows"] == 57
    return workspace, result.train_metadata


def finetune(workspace, train_metadata, tiny_llama, task, **parameters):
    """The step as its component calls it: every parameter at its default unless given (device=cpu here)."""
    return run_finetune(
        workspace=workspace, train_data=ArtifactInput(dict(train_metadata)),
        base_model=ArtifactInput({"workspace_path": str(tiny_llama)}),
        settings=component_settings({"method": "lora", "device": "cpu", **parameters}), run_id="learns",
        task_name=task, backend=backend_for("local"),
    )  # fmt: skip


def test_sixty_rows_with_every_default_plan_the_floor_with_no_step_at_lr_0(tiny_llama, tmp_path):
    """Before: 57 rows / (batch 4 x accumulation 8) = 1 optimizer step, at lr 0 (torchtune's first warmup step)."""
    data = alpaca_rows(tmp_path / "alpaca.jsonl", 57)
    run = resolve_run(
        TorchtuneConfig(method="lora", device="cpu"), tiny_llama, data, tmp_path / "run", write=False
    )
    c = run.config
    steps = planned_steps(c, run.world, run.token_lengths)
    assert steps >= MIN_OPTIMIZER_STEPS
    assert steps == 57 // c["batch_size"] // c["gradient_accumulation_steps"] * c["epochs"]
    assert c["gradient_accumulation_steps"] == 1  # accumulation given up before the micro-batch
    scheduler = c["lr_scheduler"]
    assert scheduler["_component_"] == lr_schedule.COMPONENT
    multipliers = [lr_schedule.lr_multiplier(s, scheduler["num_warmup_steps"], steps) for s in range(steps)]
    assert min(multipliers) > 0
    reasons = {choice.setting: choice.reason for choice in run.defaults}
    assert (
        "MIN_OPTIMIZER_STEPS" in reasons["optimizer steps"]
        and "plan 1 optimizer step(s)" in reasons["batch_size"]
    )


def test_sixty_rows_with_every_default_change_the_weights(sixty_rows, tiny_llama):
    workspace, train = sixty_rows
    result = finetune(workspace, train, tiny_llama, "defaults")
    logged = read_metrics_file(result.run.metrics_path)
    assert len(logged) >= MIN_OPTIMIZER_STEPS
    # torchtune logs the lr after the scheduler's step: step N + 1 trained with the rate logged at step N (the
    # last one logged is the rate after the run, 0 at the cosine's end), step 1 with the schedule's first.
    scheduler = result.run.config["lr_scheduler"]
    assert scheduler["_component_"] == lr_schedule.COMPONENT
    assert lr_schedule.lr_multiplier(0, scheduler["num_warmup_steps"], len(logged)) > 0
    assert all(s.values["lr"] > 0 for s in logged[:-1])
    lora_b = [t for name, t in tensors(result.checkpoint.adapter_dir) if "lora_b" in name.lower()]
    assert lora_b and not any(is_zero(t) for t in lora_b)
    assert result.checkpoint.merged_dir is None  # an adapter run saves only its adapter: export merges it
    assert result.metrics["steps"] == len(logged)


def test_a_run_that_leaves_the_weights_unchanged_fails_the_step(sixty_rows, tiny_llama):
    """lr 0 (only reachable through overrides: tune_learning_rate refuses it) trains steps that change nothing."""
    workspace, train = sixty_rows
    with pytest.raises(WeightsUnchanged) as failed:
        finetune(
            workspace, train, tiny_llama, "lora-lr-0", overrides={"optimizer.lr": 0.0}, epochs=1, batch_size=4,
            max_steps_per_epoch=2,
        )  # fmt: skip
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("training did not change the model: all ") and "lora_B matrices" in message
    assert "2 optimizer step(s) logged" in message and "tune_learning_rate" in message


def test_too_little_data_is_refused_in_one_line_with_the_fix(tiny_llama, tmp_path):
    data = alpaca_rows(tmp_path / "six.jsonl", 6)
    with pytest.raises(ConfigError) as refused:
        resolve_run(
            TorchtuneConfig(method="lora", device="cpu"), tiny_llama, data, tmp_path / "run", write=False
        )
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "too little training data for a run that learns: 6 rows over batch 1 x accumulation 1"
    )
    assert f"plan 18 optimizer step(s), fewer than the {MIN_OPTIMIZER_STEPS}" in message
    assert "tune_epochs, tune_batch_size or tune_gradient_accumulation_steps explicitly" in message
    # Seven rows reach the floor in three epochs; a setting the user gives accepts a short run, with a warning.
    seven = resolve_run(
        TorchtuneConfig(method="lora", device="cpu"), tiny_llama, alpaca_rows(tmp_path / "seven.jsonl", 7),
        tmp_path / "run", write=False,
    )  # fmt: skip
    assert (seven.config["epochs"], seven.config["batch_size"]) == (3, 1)
    short = resolve_run(
        TorchtuneConfig(method="lora", device="cpu", epochs=1),
        tiny_llama,
        data,
        tmp_path / "run",
        write=False,
    )
    warning = next(c for c in short.defaults if c.warning)
    assert short.config["epochs"] == 1 and warning.setting == "optimizer steps" and warning.value == 6
    assert "kept as set (tune_epochs): raise tune_epochs or add rows" in warning.reason


def test_a_full_fine_tune_that_leaves_the_weights_unchanged_fails_the_step(sixty_rows, tiny_llama):
    """torchtune writes the merged weights anew (its own file names, fp32 here): the values decide."""
    workspace, train = sixty_rows
    with pytest.raises(WeightsUnchanged) as failed:
        finetune(
            workspace, train, tiny_llama, "full-lr-0", method="full", overrides={"optimizer.lr": 0.0}, epochs=1,
            batch_size=4,
            max_steps_per_epoch=2,
        )  # fmt: skip
    message = str(failed.value)
    assert "\n" not in message and message.startswith("training did not change the model: the ")
    assert "tensors of " in message and "equal the base model's (2 optimizer step(s) logged" in message
