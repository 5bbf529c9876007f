"""Resume, exactly: training killed at a random step (SIGTERM with its grace, or SIGKILL) and started again on the
same run folder continues from its newest checkpoint, and every step's loss and learning rate equal an
uninterrupted run's — full and LoRA (with dropout: the RNG is restored too), real torchtune on CPU.

Equal losses at every step after the resume are the proof that the weights, the optimizer state and the data order
are the uninterrupted run's: a batch drawn out of order, or one dropout mask drawn differently, changes them. CPU
float32 on the tiny kit is bitwise reproducible, so they are compared for equality.
"""

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_finetune.components._shared.metrics_file import read_metrics_file, read_resume_points
from kfp_finetune.components._shared.torchtune import face as torchtune_face
from kfp_finetune.components._shared.torchtune import resume
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
from kfp_finetune.components.torchtune_finetune.backends.local import LocalBackend, run_local

pytestmark = pytest.mark.slow

STEPS = 6  # 2 epochs x 3 optimizer steps (x 2 batches accumulated): a resume in either epoch
EVERY = 2  # checkpoint_every_steps
SEED = 20261127


def resolved(model_dir, data, run_dir, method, **settings):
    cfg = TorchtuneConfig(
        device="cpu", method=method, batch_size=2, gradient_accumulation_steps=2, max_steps_per_epoch=3, epochs=2,
        seed=0, checkpoint_every_steps=EVERY, **settings,
    )  # fmt: skip
    if method == "lora":
        cfg.lora.lora_dropout = 0.1
    return resolve_run(cfg, model_dir, data, run_dir)


def kill_at(run, step: int, signum: int) -> int:
    """Run the local backend's command and send `signum` once step `step` is logged; the exit code."""
    command = tune_command(run.recipe, run.yaml_path)
    command[0] = str(Path(sys.executable).parent / "tune")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=run.run_dir
    )
    for line in process.stdout:
        if f"Step {step} |" in line:
            process.send_signal(signum)
    return process.wait(timeout=300)


def curve(run_dir):
    return [(s.step, s.loss, s.values["lr"]) for s in read_metrics_file(run_dir / "logs" / "metrics.txt")]


@pytest.fixture(scope="module")
def uninterrupted(tiny_llama, tiny_dataset, tmp_path_factory):
    runs = {}
    for method in ("full", "lora"):
        run = resolved(
            tiny_llama, tiny_dataset["train.jsonl"], tmp_path_factory.mktemp(method) / "run", method
        )
        run_local(tune_command(run.recipe, run.yaml_path), cwd=run.run_dir)
        runs[method] = curve(run.run_dir)
        assert [step for step, _, _ in runs[method]] == list(range(1, STEPS + 1))
    return runs


CASES = [(method, signum) for method in ("full", "lora") for signum in (signal.SIGTERM, signal.SIGKILL)]


@pytest.mark.parametrize(("method", "signum"), CASES, ids=[f"{m}-{s.name}" for m, s in CASES])
def test_training_killed_at_a_random_step_continues_exactly(
    method, signum, uninterrupted, tiny_llama, tiny_dataset, tmp_path
):
    killed_at = random.Random(f"{SEED}-{method}-{signum.name}").randint(EVERY, STEPS - 1)
    why = f"{method}, {signum.name} after step {killed_at} (seed {SEED})"
    run = resolved(tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run", method)

    code = kill_at(run, killed_at, signum)

    point = resume.latest(run.run_dir)
    if signum == signal.SIGTERM:
        # Within the grace period: a checkpoint at the next step boundary, then exit as SIGTERM ends a process.
        assert code == 143, why
        assert point.reason == "SIGTERM" and point.step in (killed_at, killed_at + 1), why
    else:
        assert code == -signal.SIGKILL, why
        assert point.reason == "interval" and point.step == killed_at // EVERY * EVERY, why

    # The retry: the local backend keeps a run folder with a complete checkpoint, and trains on.
    LocalBackend().prepare(run.run_dir, resume_point=torchtune_face.resume_point)
    again = resolved(tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run", method)
    result = run_local(tune_command(again.recipe, again.yaml_path), cwd=again.run_dir)

    assert [s.step for s in result.steps] == list(range(point.step + 1, STEPS + 1)), why  # only what was left
    assert curve(run.run_dir) == uninterrupted[method], why  # every step's loss and lr
    assert read_resume_points(run.run_dir / "logs" / "metrics.txt") == [point.step], why
    assert (run.run_dir / "epoch_1").is_dir(), why  # the final checkpoint, as an uninterrupted run writes it


def test_a_kill_before_the_first_checkpoint_starts_over(tiny_llama, tiny_dataset, uninterrupted, tmp_path):
    run = resolved(tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run", "lora")
    assert kill_at(run, 1, signal.SIGKILL) == -signal.SIGKILL
    assert resume.latest(run.run_dir) is None
    LocalBackend().prepare(
        run.run_dir, resume_point=torchtune_face.resume_point
    )  # nothing to resume from: cleared
    assert not run.run_dir.exists()


def test_resume_off_writes_no_checkpoint_and_a_sigterm_ends_training(tiny_llama, tiny_dataset, tmp_path):
    run = resolved(tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run", "lora", resume=False)
    assert kill_at(run, 3, signal.SIGTERM) == -signal.SIGTERM  # not caught: no checkpoint to save first
    assert not resume.resume_root(run.run_dir).exists()
    LocalBackend().prepare(run.run_dir, resume_point=None)
    assert not run.run_dir.exists()
