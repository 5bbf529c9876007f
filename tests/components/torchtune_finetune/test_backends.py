"""The backend interface (backends/__init__.py), the shared SIGTERM/SIGINT handling (_shared/cancel.py) and the
divergence check both backends apply to torchtune's metric lines (metrics.py)."""

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_finetune.components._shared.cancel import Interrupted, StopSignals, raise_interrupted
from kfp_finetune.components._shared.metrics_file import collect_steps, parse_metric_line
from kfp_finetune.components._shared.torchtune.config import ConfigError
from kfp_finetune.components._shared.torchtune.resolve import ResolvedRun
from kfp_finetune.components._shared.torchtune.resume import RECIPE_PATH
from kfp_finetune.components.torchtune_finetune.backends import backend_for
from kfp_finetune.components.torchtune_finetune.backends import local as local_backend
from kfp_finetune.components.torchtune_finetune.backends.local import LocalBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.entrypoint import node_command
from kfp_finetune.components.torchtune_finetune.metrics import (
    LossDiverged,
    divergence,
    first_divergence,
    summarize,
)


def test_backend_for_picks_by_name_and_rejects_unknown_names():
    assert isinstance(backend_for("local"), LocalBackend)
    assert isinstance(backend_for("trainjob", run_id="r1", task_name="t"), TrainJobBackend)
    with pytest.raises(ConfigError, match="backend must be one of trainjob, local"):
        backend_for("slurm")


def test_backend_for_hands_both_backends_the_persistent_compile_root():
    root = "/kfp-finetune/model-cache/compile"
    assert backend_for("local", persistent_compile_root=root).persistent_compile_root == root
    trainjob = backend_for("trainjob", run_id="r1", task_name="t", persistent_compile_root=root)
    assert trainjob.persistent_compile_root == root


def test_local_backend_trains_on_one_node_and_one_device_without_gpus():
    with pytest.raises(ConfigError, match="num_nodes must be 1"):
        backend_for("local", nodes=2)
    backend = backend_for("local", devices=4)
    assert (backend.name, backend.devices, backend.nodes) == ("local", 1, 1)


def test_a_cpu_build_of_torch_is_known_without_importing_it(tmp_path):
    """The local step picks its device without the seconds torch takes to import where torch was built for no GPU
    (its version.py says so); any other build, or a version.py it cannot read, is asked (torch.cuda)."""
    torch = pytest.importorskip("torch")
    code = "import sys; from {0} import _cuda_available; print(_cuda_available(), 'torch' in sys.modules)"
    said = subprocess.run(
        [sys.executable, "-c", code.format(local_backend.__name__)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    gpu_build = torch.version.cuda is not None or torch.version.hip is not None
    assert said == [str(torch.cuda.is_available()), str(gpu_build)]
    version = tmp_path / "version.py"
    version.write_text(
        "from typing import Optional\ncuda: Optional[str] = '12.8'\nhip = None\nxpu = f'{1}'\n"
    )
    assert local_backend._torch_build(version) == {"cuda": "12.8", "hip": None}
    assert local_backend._torch_build(tmp_path / "missing.py") == {}


def test_local_backend_prepare_clears_an_earlier_attempt(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    (run_dir / "epoch_0").mkdir(parents=True)
    LocalBackend().prepare(run_dir)
    assert not run_dir.exists()


def test_trainjob_backend_manifest_is_what_build_trainjob_makes():
    pod = tj.NodePodSettings(resources={"limits": {"nvidia.com/gpu": "2"}})
    backend = TrainJobBackend(pod=pod, devices=2, nodes=2, run_id="run-1", task_name="finetune", timeout=60)
    resolved = ResolvedRun(
        "lora_finetune_distributed", "c", {}, Path("/ws/runs/x/c.yaml"), Path("/ws/runs/x"), None, True
    )
    name = tj.trainjob_name("run-1", "finetune")
    command = node_command(
        ["tune", "run", *tj.torchrun_args(name), RECIPE_PATH, "--config", "/ws/runs/x/c.yaml"], "torchtune"
    )
    assert backend.job_name == name and backend.gpus_available()
    assert backend.manifest(resolved) == tj.build_trainjob(
        name, command, num_nodes=2, num_proc_per_node=2, pod=pod, active_deadline_seconds=60, run_id="run-1",
        task_name="finetune",
    )  # fmt: skip


def test_stop_signals_call_back_and_restore_the_previous_handlers():
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    with StopSignals(seen.append) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGTERM] and signals.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_raise_interrupted_stops_the_main_thread_and_restore_is_idempotent():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as raised, StopSignals(raise_interrupted) as signals:
        os.kill(os.getpid(), signal.SIGINT)
    signals.restore()
    assert raised.value.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is before


def test_disabled_stop_signals_install_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals(lambda _: None, enabled=False):
        assert signal.getsignal(signal.SIGTERM) is before


# --- divergence ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("nan", "nan"), ("NaN", "nan"), ("-nan", "nan"), ("inf", "inf"), ("Infinity", "inf"), ("-inf", "-inf")],
)
def test_a_non_finite_loss_in_a_disklogger_line_is_a_divergence(raw, expected):
    line = f"Step 7 | loss:{raw} lr:0.0003 tokens_per_second_per_gpu:812.5 "
    diverged = divergence(parse_metric_line(line))
    assert isinstance(diverged, LossDiverged) and (diverged.step, str(diverged.loss)) == (7, expected)
    message = str(diverged)
    assert "\n" not in message
    assert message.startswith(f"loss diverged at step 7 (loss={expected}): training stopped; usual causes:")
    for fix in ("tune_learning_rate", "dtype bf16", 'tune_overrides {"clip_grad_norm": 1.0}'):
        assert fix in message


def test_finite_losses_and_lines_without_a_loss_are_no_divergence():
    for line in ("Step 1 | loss:2.31 lr:0.0003", "Step 2 | lr:nan", "Step 3 | tokens_per_second_per_gpu:inf"):
        assert divergence(parse_metric_line(line)) is None
    steps = collect_steps(
        ["Step 1 | loss:2.3", "Step 2 | loss:1.9", "Step 3 | loss:nan", "Step 4 | loss:inf"]
    )
    assert first_divergence(steps[:2]) is None
    assert first_divergence(steps).step == 3


def test_summary_of_a_run_without_a_finite_loss_has_no_loss_and_raises_nothing():
    steps = collect_steps(["Step 1 | loss:nan tokens_per_second_per_gpu:10", "Step 2 | loss:inf"])
    summary = summarize(steps)
    assert summary == {"logged_steps": 2.0, "tokens_per_second": 10.0}
    assert all(
        math.isfinite(v) for v in summarize(collect_steps(["Step 1 | loss:2", "Step 2 | loss:nan"])).values()
    )
