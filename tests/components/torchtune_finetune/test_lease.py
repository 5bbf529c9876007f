"""The step's lease on its TrainJob (lease.py): a node pod's trainer stops when the step that launched it is
SIGKILLed and nobody renews the lease; it trains on while the lease is renewed or after it was released."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kfp_finetune.components.torchtune_finetune.lease import (
    LEASE_FILE,
    Lease,
    LeaseRenewer,
    read_lease,
    write_lease,
)
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube


def trainer_script(run_dir: Path) -> str:
    """A stand-in trainer: guarded by the lease as the node entrypoint is, then busy for a minute."""
    return textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from kfp_finetune.components.torchtune_finetune.lease import guard_with_lease
        guard_with_lease(Path({str(run_dir)!r}), poll=0.05)
        print("training", flush=True)
        time.sleep(60)
        """
    )


def start_trainer(run_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", trainer_script(run_dir)],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(10)


@pytest.mark.slow
def test_a_lapsed_lease_stops_the_trainer_saying_why(tmp_path):
    write_lease(tmp_path / LEASE_FILE, Lease("step-pod-1", 1, duration=1.0))
    trainer = start_trainer(tmp_path)
    try:
        assert trainer.wait(30) == -signal.SIGTERM
        error = trainer.stderr.read()
    finally:
        finish(trainer)
    assert "the pipeline step that launched this TrainJob (step-pod-1) stopped renewing its lease" in error
    assert "stopping the training so that it does not run unobserved" in error


class Log(list):
    def warning(self, *args) -> None:
        self.append(args)


@pytest.mark.slow
def test_a_renewed_or_released_lease_lets_the_trainer_run(tmp_path):
    lease = LeaseRenewer(tmp_path / LEASE_FILE, "step-pod-1", duration=1.0, log=Log())
    lease.start()  # renews every 0.1 s
    trainer = start_trainer(tmp_path)
    try:
        time.sleep(3)  # three lease durations
        assert trainer.poll() is None
        lease.release()
        assert read_lease(tmp_path / LEASE_FILE).released
        time.sleep(2)
        assert trainer.poll() is None  # a released lease stops nothing (e.g. a TrainJob kept on purpose)
    finally:
        finish(trainer)


@pytest.mark.slow
def test_no_lease_no_watchdog(tmp_path):
    trainer = start_trainer(tmp_path)
    try:
        time.sleep(1)
        assert trainer.poll() is None
    finally:
        finish(trainer)


LAUNCHER = """
import json, sys
from pathlib import Path
import kubernetes
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobLauncher
manifest, kubeconfig, lease = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
api = kubernetes.config.new_client_from_config(config_file=kubeconfig)
TrainJobLauncher(manifest, api, namespace="team-a", tick=0.05, lease_path=Path(lease), lease_duration=2.0).run()
"""


@pytest.mark.parametrize("killed", [True, False])
@pytest.mark.slow
def test_a_sigkilled_step_leaves_no_trainjob_training(kube, tmp_path, killed):
    """The step's process is SIGKILLed (OOM, eviction) while its TrainJob trains: without a renewal the node pods
    stop within the lease's duration and the TrainJob fails, freeing its nodes. Alive, the step sees it complete."""
    kube.execute()  # node commands run as local processes, the launcher in its own process
    kube.scenario(None, Scenario(pending_seconds=0.05))
    job = base.manifest()
    script = trainer_script(tmp_path).replace("time.sleep(60)", "time.sleep(60 if KILLED else 4)")
    job["spec"]["trainer"]["command"] = [sys.executable, "-c", f"KILLED = {killed}\n{script}"]
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            LAUNCHER,
            json.dumps(job),
            str(kube.kubeconfig_path),
            str(tmp_path / LEASE_FILE),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        pod = kube.wait_for_pod(NAME, lambda p: p["status"]["phase"] == "Running", timeout=30)
        if not killed:
            assert launcher.wait(60) == 0
            assert kube.trainjob(NAME) is None  # completed and deleted by the cleanup policy
            assert read_lease(tmp_path / LEASE_FILE).released
            return
        launcher.kill()  # SIGKILL: no handler, no cleanup
        launcher.wait(10)
        job = kube.wait_for_trainjob(NAME, condition="Failed", timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert job["status"]["conditions"][0]["reason"] == "FailedJobs"
    assert "stopped renewing its lease" in kube.pod_log(pod["metadata"]["name"])


@pytest.mark.slow
def test_the_node_entrypoint_stops_tune_run_when_the_lease_lapses(tiny_llama, tiny_dataset, tmp_path):
    """The real node command (entrypoint: checks, then `tune run`) under a lease nobody renews: the watchdog it
    starts stops the training and says why in the node log."""
    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
    from kfp_finetune.components.torchtune_finetune.entrypoint import MODULE

    run = resolve_run(
        TorchtuneConfig(method="lora", device="cpu", epochs=50), tiny_llama, tiny_dataset["train.jsonl"],
        tmp_path / "run",
    )  # fmt: skip
    write_lease(Path(run.yaml_path).parent / LEASE_FILE, Lease("step-pod-1", 1, duration=1.0))
    node = subprocess.run(
        [sys.executable, "-m", MODULE, *tune_command(run.recipe, run.yaml_path)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    assert node.returncode != 0
    assert "stopped renewing its lease" in node.stderr
    assert not list(Path(run.yaml_path).parent.glob("epoch_*")), "training was stopped before its first epoch"
