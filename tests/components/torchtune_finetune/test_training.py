"""Real torchtune on CPU: every method on tiny models of each family in the kit, through the local launcher."""

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kfp_finetune.components._shared.metrics_file import read_metrics_file
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
from kfp_finetune.components.torchtune_finetune.backends.local import TrainingFailed, run_local
from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wide_models(tmp_path_factory):
    """dim-256 models: QLoRA's NF4 blocks need LoRA'd weights with numel divisible by 64 * 256."""
    from kfp_finetune.tiny.model import build_tiny_model

    root = tmp_path_factory.mktemp("wide")
    return {
        family: build_tiny_model(root / family, family=family, dim=256)
        for family in {family for method, family in METHOD_CASES if method == "qlora"}
    }


def train(model_dir, data, run_dir, **settings):
    cfg = TorchtuneConfig(
        device="cpu", batch_size=2, gradient_accumulation_steps=1, max_steps_per_epoch=3, seed=0
    )
    for key, value in settings.items():
        setattr(cfg, key, value)
    run = resolve_run(cfg, model_dir, data, run_dir)
    lines = []
    result = run_local(tune_command(run.recipe, run.yaml_path), echo=lines.append)
    return run, result, lines


# family -> the tiny kit's fixture
TINY = {
    "llama3_2": "tiny_llama",
    "qwen2_5": "tiny_qwen",
    "qwen3": "tiny_qwen3",
    "gemma3": "tiny_gemma3",
    "smollm2": "tiny_smollm2",
    "mistral_nemo": "tiny_mistral_nemo",
}


# Every method on every family it has its own path for: full on every family and LoRA on Llama 3.2 learn the task
# in test_loss_falls_on_the_synthetic_task (which checks their checkpoints as this test does); LoRA on the other
# families; DoRA and QLoRA (their own builders' paths) on the families whose layouts differ for them: Qwen2.5
# (biases the DoRA magnitude must ignore), Qwen3 and Gemma 3 (head_dim above hidden/heads; q/k norms; local
# layers), Llama 3.2 and Mistral-Nemo (head_dim below hidden/heads) for QLoRA.
LEARNING_CASES = [
    ("llama3_2", "full", 0.5), ("qwen2_5", "full", 0.5), ("qwen3", "full", 0.5), ("gemma3", "full", 0.5),
    ("smollm2", "full", 0.5), ("mistral_nemo", "full", 0.6), ("llama3_2", "lora", 0.95),
]  # fmt: skip
METHOD_CASES = [
    *(("lora", family) for family in TINY if family != "llama3_2"),
    *(("dora", family) for family in ("qwen2_5", "qwen3", "gemma3")),
    *(("qlora", family) for family in ("llama3_2", "qwen3", "mistral_nemo")),
]


def assert_trained_and_checkpointed(run, result, lines, method: str, steps: int) -> None:
    """Every step ran with a finite loss, was shown and logged, and the epoch's checkpoint is the method's."""
    assert [s.step for s in result.steps] == list(range(1, steps + 1))
    assert all(math.isfinite(s.loss) for s in result.steps)
    assert any(re.match(rf"progress: step {steps}\b", line) for line in lines)
    assert [s.step for s in read_metrics_file(run.metrics_path)] == list(range(1, steps + 1))
    epoch = run.run_dir / "epoch_0"
    names = {p.name for p in epoch.iterdir()}
    merged_files = {"model-00001-of-00001.safetensors", "model.safetensors.index.json"}
    adapter_files = {"adapter_model.safetensors", "adapter_model.pt", "adapter_config.json"}
    assert "config.json" in names
    if method == "full":
        assert merged_files <= names and not adapter_files & names
    else:  # no merged weights while training: export and evaluate merge the adapter (_shared/torchtune/merge.py)
        assert adapter_files <= names and not merged_files & names


@pytest.mark.parametrize(("method", "family"), METHOD_CASES, ids=[f"{m}-{f}" for m, f in METHOD_CASES])
def test_every_method_trains_and_writes_its_checkpoint(
    method, family, wide_models, tiny_dataset, tmp_path, request
):
    model_dir = wide_models[family] if method == "qlora" else request.getfixturevalue(TINY[family])
    run, result, lines = train(model_dir, tiny_dataset["train.jsonl"], tmp_path / "run", method=method)
    assert_trained_and_checkpointed(run, result, lines, method, steps=3)


@pytest.mark.parametrize(("family", "method", "ratio"), LEARNING_CASES)
def test_loss_falls_on_the_synthetic_task(family, method, ratio, tiny_dataset, tmp_path, request):
    """Full fine-tuning learns the task fast; LoRA on a randomly initialised base learns slowly but surely; both
    write the method's checkpoint. Mistral-Nemo's format trains the answer and its end token alone, without the
    assistant header the others train (learned first): its mean loss falls less (measured: 6.15 -> 3.33 over the
    40 steps)."""
    model_dir = request.getfixturevalue(TINY[family])
    run, result, lines = train(
        model_dir, tiny_dataset["train.jsonl"], tmp_path / "run",
        method=method, batch_size=16, max_steps_per_epoch=40, learning_rate=3e-3, num_warmup_steps=5,
    )  # fmt: skip
    assert_trained_and_checkpointed(run, result, lines, method, steps=40)
    losses = [s.loss for s in result.steps]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < ratio * first, f"loss did not fall clearly: first steps {first:.3f}, last steps {last:.3f}"


def test_qwen_with_a_max_seq_len_that_cuts_nothing_trains_as_without_one(tiny_qwen, tiny_dataset, tmp_path):
    """The task's rows are ~20 tokens, so max_seq_len=64 cuts nothing: the step losses must be those of a run
    without it. torchtune 0.6.1's own Qwen tokenizer would leave every end token out of the loss."""
    losses = {}
    for max_seq_len in (None, 64):
        _, result, _ = train(
            tiny_qwen, tiny_dataset["train.jsonl"], tmp_path / f"run-{max_seq_len}",
            method="full", max_steps_per_epoch=2, max_seq_len=max_seq_len,
        )  # fmt: skip
        losses[max_seq_len] = [s.loss for s in result.steps]
    assert len(losses[64]) == 2
    assert losses[64] == pytest.approx(losses[None], rel=1e-5)


def test_a_diverging_run_is_stopped_at_its_first_nan_loss(tiny_llama, tiny_dataset, tmp_path):
    """A learning rate of 1e12 sends the tiny model's loss to nan at step 2 (seed 0, fp32 on CPU). The run is
    planned for 200 steps (~10s more): the child is stopped there, before it writes any checkpoint."""
    cfg = TorchtuneConfig(
        device="cpu", batch_size=2, gradient_accumulation_steps=1, max_steps_per_epoch=200, seed=0,
        learning_rate=1e12, num_warmup_steps=0,
    )  # fmt: skip
    run = resolve_run(cfg, tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run")
    lines = []
    with pytest.raises(LossDiverged) as raised:
        run_local(tune_command(run.recipe, run.yaml_path), echo=lines.append, total_steps=200)

    assert (raised.value.step, str(raised.value.loss)) == (2, "nan")
    assert str(raised.value).startswith("loss diverged at step 2 (loss=nan): training stopped; usual causes:")
    logged = read_metrics_file(run.metrics_path)
    assert logged[0].step == 1 and math.isfinite(logged[0].loss) and math.isnan(logged[1].loss)
    assert len(logged) < 200 and not any(line.startswith("progress: step 200/200") for line in lines)
    assert not (run.run_dir / "epoch_0").exists(), "stopped before the end of the epoch: no checkpoint"


def test_failure_reports_exit_code_and_last_lines(tmp_path):
    script = "import sys\nfor i in range(80): print(f'line {i}')\nsys.exit(3)"
    with pytest.raises(TrainingFailed, match="exit code 3") as failure:
        run_local([sys.executable, "-c", script], echo=lambda _: None)
    assert failure.value.returncode == 3
    assert failure.value.tail[-1] == "line 79"
    assert len(failure.value.tail) == 50
    assert "line 79" in str(failure.value)


# A local child as the node entrypoint's --local path arms it (stop_with_step), then says which signal stopped it.
STOPPED_CHILD = """
import os, signal, sys, time
from kfp_finetune.components.torchtune_finetune.entrypoint import stop_with_step

def stopped(signum, frame):
    open({marker!r}, "w").write(signal.Signals(signum).name)
    sys.exit(143)

signal.signal(signal.SIGTERM, stopped)
stop_with_step()
open({pid_file!r}, "w").write(str(os.getpid()))
time.sleep(120)
"""


def wait_for_file(path, what: str, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)
    return path.read_text()


def test_a_step_killed_outright_still_stops_its_training_child(tmp_path):
    """SIGKILL gives the step no chance to stop its child, which runs in its own session: the child asked the
    kernel for a SIGTERM when the step is gone, and gets one (a TrainJob stops the same way without its lease)."""
    marker, pid_file = tmp_path / "stopped-by", tmp_path / "child.pid"
    child = STOPPED_CHILD.format(marker=str(marker), pid_file=str(pid_file))
    launcher = textwrap.dedent(f"""
        import sys
        from kfp_finetune.components.torchtune_finetune.backends.local import run_local
        run_local([sys.executable, "-c", {child!r}])
    """)
    step = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.DEVNULL)
    wait_for_file(pid_file, "the training child never started")
    step.kill()
    step.wait(timeout=60)
    assert wait_for_file(marker, "the child outlived its step") == "SIGTERM"


def test_a_child_whose_step_is_already_gone_stops_at_once(tmp_path):
    """The step may die before the child asks to stop with it: the child finds another parent and stops itself."""
    marker, pid_file = tmp_path / "stopped-by", tmp_path / "child.pid"
    from kfp_finetune.components.torchtune_finetune.entrypoint import STEP_PID_ENV

    child = subprocess.run(
        [sys.executable, "-c", STOPPED_CHILD.format(marker=str(marker), pid_file=str(pid_file))],
        env={**os.environ, STEP_PID_ENV: "1"},  # not this child's parent: as if the step had died already
        timeout=60,
    )
    assert child.returncode == 143 and marker.read_text() == "SIGTERM"
    assert not pid_file.exists(), "stopped before going on"


def test_sigterm_stops_the_training_process_group(tmp_path):
    pid_file = tmp_path / "child.pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); print('ready', flush=True); time.sleep(120)"
    launcher = textwrap.dedent(f"""
        import sys
        from kfp_finetune.components.torchtune_finetune.backends.local import TrainingFailed, run_local
        try:
            run_local([sys.executable, "-c", {child!r}])
        except TrainingFailed as err:
            print("FAILED:", err, flush=True)
            sys.exit(1)
    """)
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the training child never started"
        time.sleep(0.1)
    parent.send_signal(signal.SIGTERM)
    out, _ = parent.communicate(timeout=60)
    assert parent.returncode == 1
    assert "FAILED: training stopped by signal SIGTERM" in out
    child_pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child_pid, 0)
