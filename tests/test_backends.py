"""The backend interface (backends/__init__.py) and the shared SIGTERM/SIGINT handling (_shared/cancel.py)."""

import os
import signal
from pathlib import Path

import pytest

from kfp_finetune.components._shared.cancel import Interrupted, StopSignals, raise_interrupted
from kfp_finetune.components.torchtune_finetune.backends import backend_for
from kfp_finetune.components.torchtune_finetune.backends.local import LocalBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.config import ConfigError
from kfp_finetune.components.torchtune_finetune.resolve import ResolvedRun


def test_backend_for_picks_by_name_and_rejects_unknown_names():
    assert isinstance(backend_for("local"), LocalBackend)
    assert isinstance(backend_for("trainjob", run_id="r1", task_name="t"), TrainJobBackend)
    with pytest.raises(ConfigError, match="backend must be one of trainjob, local"):
        backend_for("slurm")


def test_local_backend_trains_on_one_node_and_one_device_without_gpus():
    with pytest.raises(ConfigError, match="num_nodes must be 1"):
        backend_for("local", nodes=2)
    backend = backend_for("local", devices=4)
    assert (backend.name, backend.devices, backend.nodes) == ("local", 1, 1)


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
    command = [
        "tune",
        "run",
        *tj.torchrun_args(name),
        "lora_finetune_distributed",
        "--config",
        "/ws/runs/x/c.yaml",
    ]
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
