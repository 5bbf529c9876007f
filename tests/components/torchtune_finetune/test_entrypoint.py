"""The node entrypoint: its checks measure the model layout's parity with transformers (a layout that differs is
refused with one line, CONFIG_REFUSED; a matching one is named with its measured differences; without transformers
the check is skipped with one line), leave the process-wide state training starts from as they found it, and then
`tune run` trains in the same process, which imports torch once."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import random
import signal
import subprocess
import sys

import numpy
import pytest
import torch

from kfp_finetune.components._shared.torchtune import conversions
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
from kfp_finetune.components.torchtune_finetune import entrypoint
from kfp_finetune.components.torchtune_finetune.warm_start import read_startup


@pytest.fixture
def node_argv(tiny_llama, tiny_dataset, tmp_path):
    run = resolve_run(
        TorchtuneConfig(method="lora", device="cpu"),
        tiny_llama,
        tiny_dataset["train.jsonl"],
        tmp_path / "run",
    )
    return tune_command(run.recipe, run.yaml_path)


@pytest.mark.slow
def test_a_layout_that_computes_another_model_is_refused_with_one_line(node_argv, monkeypatch, capsys):
    # Llama's q/k rows loaded without their RoPE reordering (Qwen2's conversion): another model than transformers'.
    llama = conversions.CONVERSIONS["LLAMA3_2"]
    unpermuted = dataclasses.replace(llama, hf_to_tune=conversions.CONVERSIONS["QWEN2"].hf_to_tune)
    monkeypatch.setitem(conversions.CONVERSIONS, "LLAMA3_2", unpermuted)
    assert entrypoint.check(node_argv) == entrypoint.CONFIG_REFUSED
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith(entrypoint.PREFIX)]
    assert len(said) == 1, said
    assert "does not compute what transformers computes (load: max |Δlogit|" in said[0], said


@pytest.mark.slow
def test_a_proven_layout_is_measured_and_may_train(node_argv, capsys):
    assert entrypoint.check(node_argv) is None
    out = capsys.readouterr().out
    assert "layout parity with transformers (lora): load " in out and "lora merged " in out, out


@pytest.mark.slow
def test_without_transformers_the_check_says_so_and_training_goes_on(node_argv, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "transformers" else find_spec(name, *args),
    )
    assert entrypoint.check(node_argv) is None
    out = capsys.readouterr().out
    assert "layout parity with transformers not measured (transformers not installed)" in out, out


def training_state() -> dict:
    """What training would inherit from the checks: RNGs, dtype, grad mode, flags, threads, env, signal handlers."""
    return {
        "torch random": torch.random.get_rng_state().tolist(),
        "numpy random": [
            part.tolist() if hasattr(part, "tolist") else part for part in numpy.random.get_state()
        ],
        "python random": random.getstate(),
        "default dtype": torch.get_default_dtype(),
        "grad enabled": torch.is_grad_enabled(),
        "deterministic": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "matmul precision": torch.get_float32_matmul_precision(),
        "threads": torch.get_num_threads(),
        "environment": dict(os.environ),
        "SIGTERM handler": signal.getsignal(signal.SIGTERM),
    }


@pytest.mark.slow
def test_the_checks_leave_the_state_training_starts_from_as_they_found_it(node_argv):
    """The checks build and run tiny random models (drawing from the global generators) before training starts in
    this process: nothing of that may reach training."""
    torch.manual_seed(1234)
    numpy.random.seed(1234)
    random.seed(1234)
    before = training_state()
    assert entrypoint.check(node_argv) is None
    assert training_state() == before


@pytest.mark.slow
def test_the_node_command_trains_in_its_own_process_importing_torch_once(tiny_llama, tiny_dataset, tmp_path):
    """The real node command on one device: checks, then `tune run` in the same process (Python reports every
    import of every process it starts: torch is imported once), which trains to the end and exits 0."""
    run = resolve_run(
        TorchtuneConfig(method="lora", device="cpu", batch_size=2, max_steps_per_epoch=3),
        tiny_llama, tiny_dataset["train.jsonl"], tmp_path / "run",
    )  # fmt: skip
    node_argv = tune_command(run.recipe, run.yaml_path)
    node = subprocess.run(
        [sys.executable, "-m", entrypoint.MODULE, *node_argv],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )  # fmt: skip
    assert node.returncode == 0, node.stderr[-3000:]
    torch_imports = [line for line in node.stderr.splitlines() if line.startswith("import time:") and
                     line.rsplit("|", 1)[-1].strip() == "torch"]  # fmt: skip
    assert len(torch_imports) == 1, torch_imports
    assert "checked (torchtune validation, prompts fit max_seq_len)" in node.stdout, node.stdout[-3000:]
    assert (run.run_dir / "logs" / "metrics.txt").is_file() and list(run.run_dir.glob("epoch_*"))
    assert (
        read_startup(run.run_dir).seconds_to_first_step > 0
    )  # from this process's start: the checks included


def test_the_node_command_names_its_engine_and_an_unknown_engine_is_refused_in_one_line(capsys):
    command = entrypoint.node_command(["tune", "run", "r.py", "--config", "c.yaml"], "torchtune")
    assert command[3:] == ["--engine", "torchtune", "tune", "run", "r.py", "--config", "c.yaml"]
    assert entrypoint.split_engine(command[3:]) == ("torchtune", command[5:])
    assert entrypoint.split_engine(command[5:]) == ("", command[5:]), "no flag: the default engine"
    assert entrypoint.check(["--engine", "megatron", "train.py"]) == entrypoint.CONFIG_REFUSED
    (said,) = capsys.readouterr().err.strip().splitlines()
    assert said.startswith("kfp-finetune: the run cannot train (node 0): ") and "'megatron'" in said, said


def test_a_transformers_run_on_an_image_without_trl_is_refused_naming_the_runtime(
    tmp_path, monkeypatch, capsys
):
    """tune_runtime names the torchtune image for a model only the transformers engine serves: one line that
    says which runtime to use, not an ImportError minutes later."""
    from kfp_finetune.components._shared.transformers.plan import MODULE as TRAIN_MODULE

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "trl" else find_spec(name, *args)
    )
    argv = ["--engine", "transformers", "python", "-m", TRAIN_MODULE, str(tmp_path / "sft_settings.json")]
    assert entrypoint.check(argv) == entrypoint.CONFIG_REFUSED
    (said,) = capsys.readouterr().err.strip().splitlines()
    assert "this image has no TRL" in said and "tune_runtime=auto" in said, said


def torchrun_error(worker_exit_codes: list[int], *, interrupted: bool) -> Exception:
    """What torchrun's agent raises when its workers exited with `worker_exit_codes`: ChildFailedError, or, where the
    kubelet's SIGTERM came while it was still closing its rendezvous (launcher/api.py launch_agent's finally), the
    SignalException raised while handling it."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {
        rank: ProcessFailure(rank, 100 + rank, code, "<N/A>") for rank, code in enumerate(worker_exit_codes)
    }
    try:
        try:
            raise ChildFailedError("train", failures)
        finally:
            if interrupted:
                raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
    except Exception as error:
        return error


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_pod_whose_workers_stopped_exits_with_their_stop_code_even_when_sigterm_interrupts_torchrun(
    interrupted, capsys
):
    assert (
        entrypoint.stopped_node_exit_code(
            torchrun_error([143, -signal.SIGTERM], interrupted=interrupted), since=0
        )
        == 143
    )
    assert "the training processes stopped (this pod is stopping): exit code 143" in capsys.readouterr().out
    assert entrypoint.stopped_node_exit_code(torchrun_error([75, 75], interrupted=interrupted), since=0) == 75
    assert "(another node's pod is stopping): exit code 75" in capsys.readouterr().out


def test_a_crash_or_a_sigterm_before_the_workers_ended_keeps_torchruns_error(capsys, tmp_path, monkeypatch):
    import tempfile

    from torch.distributed.elastic.multiprocessing.api import SignalException

    monkeypatch.setattr(
        tempfile, "tempdir", str(tmp_path)
    )  # this container's stop folder: no worker recorded

    assert entrypoint.stopped_node_exit_code(torchrun_error([75, 1], interrupted=True), since=0) is None
    assert (
        entrypoint.stopped_node_exit_code(SignalException("got signal: 15", sigval=signal.SIGTERM), since=0)
        is None
    )
    assert capsys.readouterr().out == ""


# The rank-0 node's agent, as far as the others see it: the host of the c10d rendezvous store.
STORE_HOST = """
import sys, time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, multi_tenant=True, timeout=timedelta(seconds=60))
print("hosting", flush=True)
time.sleep(600)
"""
# A worker of the other node, on its way out: it saved its part of the stop's checkpoint (another node's pod is
# stopping) and recorded its exit, or (a crash took the store) recorded nothing.
WORKER = """
import os, sys, time
from pathlib import Path
from kfp_finetune.components._shared.stop_exit import record_stop
if sys.argv[1] == "recorded":
    record_stop(75)
Path(sys.argv[2], "ready-" + os.environ["LOCAL_RANK"]).touch()
time.sleep(600)
"""
# That node: torchrun over the store, its error read as the node entrypoint reads it.
NODE = """
import sys, time
from torch.distributed.run import main as torchrun
from kfp_finetune.components.torchtune_finetune import entrypoint
started = time.time()
try:
    torchrun(sys.argv[1:])
except Exception as error:
    print(type(error).__name__, flush=True)
    code = entrypoint.stopped_node_exit_code(error, since=started)
    sys.exit(1 if code is None else code)
"""


@pytest.mark.slow
@pytest.mark.parametrize("recorded", [True, False])
def test_a_node_whose_rendezvous_store_went_first_exits_with_the_stop_its_workers_recorded(
    tmp_path, recorded
):
    """On several nodes the c10d rendezvous store lives in the rank-0 node's agent. When that pod stops first, the
    other nodes' agents fail at their next look at the store (RendezvousConnectionError), before they saw their
    workers end: the pod still exits with the stop code its workers recorded, not torchrun's 1. Workers that
    recorded nothing (a crash took the store) keep torchrun's error."""
    import socket
    import time

    env = {**os.environ, "TMPDIR": str(tmp_path), "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "1"}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = subprocess.Popen(
        [sys.executable, "-c", STORE_HOST, str(port)], env=env, stdout=subprocess.PIPE, text=True
    )
    node = None
    try:
        assert store.stdout.readline() == "hosting\n"
        worker = tmp_path / "worker.py"
        worker.write_text(WORKER)
        node = subprocess.Popen(
            [sys.executable, "-c", NODE, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job", "--monitor-interval", "0.1", str(worker),
             "recorded" if recorded else "nothing", str(tmp_path)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("ready-*"))) < 2:  # both workers are where the test wants them
            assert node.poll() is None and time.monotonic() < deadline, "the workers never got ready"
            time.sleep(0.05)
        store.kill()  # the rank-0 node's agent exits: its pod stopped
        out, _ = node.communicate(timeout=120)
    finally:
        for process in (store, node):
            if process is not None:
                process.kill()
                process.wait()
    assert "RendezvousConnectionError" in out, out[-3000:]
    if recorded:
        assert node.returncode == 75, out[-3000:]
        assert "the training processes stopped (another node's pod is stopping): exit code 75" in out
    else:
        assert node.returncode == 1, out[-3000:]
