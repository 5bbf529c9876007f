"""Warm starts (warm_start.py): torch.compile's caches per torch version and GPU model, on the persistent model cache
volume when the launching step chose it, else on the workspace, and the seconds from the training process's start
to its first step."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kfp_finetune.components._shared.errors import ContractError
from kfp_finetune.components.torchtune_finetune import warm_start


@pytest.fixture
def cache_env(monkeypatch):
    for variable in warm_start.CACHE_VARIABLES.values():
        monkeypatch.setenv(variable, "/home/kfp-finetune/.cache/image-default")  # as images/trainer sets them
    monkeypatch.delenv(warm_start.COMPILE_CACHE_ENV, raising=False)
    return warm_start.CACHE_VARIABLES


def compiled_kernel(folder):
    """What a run's compile leaves in its cache folder."""
    (folder / "triton" / "abc").mkdir(parents=True, exist_ok=True)
    (folder / "triton" / "abc" / "kernel.cubin").write_bytes(b"\x7fELF")


def test_a_workspace_run_compiles_into_the_workspace_cache_of_its_torch_and_gpu(tmp_path, cache_env):
    run_dir = tmp_path / "workspace" / "runs" / "job-1"
    cache = warm_start.use_compile_cache(run_dir, "2.9.1+cu128", "NVIDIA H100 80GB HBM3")
    folder = tmp_path / "workspace" / ".cache" / "compile" / "torch-2.9.1+cu128-nvidia-h100-80gb-hbm3"
    assert cache == warm_start.CompileCache("cold", warm_start.WORKSPACE, folder)
    assert os.environ[cache_env["inductor"]] == str(folder / "inductor")
    assert os.environ[cache_env["triton"]] == str(folder / "triton")

    compiled_kernel(folder)
    again = warm_start.use_compile_cache(
        tmp_path / "workspace" / "runs" / "job-2", "2.9.1+cu128", "NVIDIA H100 80GB HBM3"
    )
    assert (again.state, again.place) == ("warm", warm_start.WORKSPACE)
    # Another GPU model or torch version never reads those kernels.
    assert warm_start.use_compile_cache(run_dir, "2.9.1+cu128", "NVIDIA H200").state == "cold"
    assert warm_start.use_compile_cache(run_dir, "2.10.0+cu128", "NVIDIA H100 80GB HBM3").state == "cold"


def test_the_next_run_of_a_schedule_starts_warm_from_the_persistent_volume(tmp_path, cache_env, monkeypatch):
    """Each pipeline run has its own workspace PVC; the model cache volume outlives them: the launching step names
    its compile folder (COMPILE_CACHE_ENV) and the second run finds the first run's kernels there."""
    model_cache = tmp_path / "model-cache"
    root = warm_start.persistent_compile_root(
        {"cache": {"entry": str(model_cache / "models" / "tiny-0123456789ab")}}
    )
    assert root == str(model_cache / "compile")
    monkeypatch.setenv(warm_start.COMPILE_CACHE_ENV, root)

    first = warm_start.use_compile_cache(
        tmp_path / "run-1-workspace" / "runs" / "job", "2.9.1", "NVIDIA H100"
    )
    assert first == warm_start.CompileCache(
        "cold", warm_start.PERSISTENT_VOLUME, model_cache / "compile" / "torch-2.9.1-nvidia-h100"
    )
    assert os.environ[cache_env["inductor"]] == str(first.folder / "inductor")
    compiled_kernel(first.folder)
    second = warm_start.use_compile_cache(
        tmp_path / "run-2-workspace" / "runs" / "job", "2.9.1", "NVIDIA H100"
    )
    assert (second.state, second.folder) == ("warm", first.folder)
    assert not (
        tmp_path / "run-2-workspace" / ".cache"
    ).exists()  # nothing on the workspace that dies with the run
    startup = warm_start.record_startup(tmp_path, time.time() - 5.0, second)
    assert startup.line().endswith("(compile cache warm, on the persistent volume)")
    assert warm_start.read_startup(tmp_path).compile_cache_place == warm_start.PERSISTENT_VOLUME


def test_a_base_model_outside_the_model_cache_keeps_the_workspace():
    assert warm_start.persistent_compile_root({"workspace_path": "models/tiny-1a2b3c4d", "cache": None}) == ""
    assert warm_start.persistent_compile_root({}) == ""
    # Normalised: the compile folder lies beside the entry's `models` folder, wherever the entry really is.
    assert (
        warm_start.persistent_compile_root({"cache": {"entry": "/mnt/cache/x/../models/tiny"}})
        == "/mnt/cache/compile"
    )


@pytest.mark.parametrize("entry", ["models/tiny", "/mnt/cache/other/tiny", "/mnt/cache/models/tiny/.."])
def test_a_cache_entry_of_another_shape_is_refused(entry):
    with pytest.raises(ContractError, match="connect the `model` output of a model-initialize step"):
        warm_start.persistent_compile_root({"cache": {"entry": entry}})


@pytest.mark.parametrize("given", ["relative/compile", "/mnt/cache/../../etc/compile"])
def test_the_training_process_refuses_a_root_that_could_escape(given, tmp_path, cache_env, monkeypatch):
    monkeypatch.setenv(warm_start.COMPILE_CACHE_ENV, given)
    with pytest.raises(ValueError, match=warm_start.COMPILE_CACHE_ENV):
        warm_start.use_compile_cache(tmp_path / "ws" / "runs" / "job", "2.9.1", "cpu")


def test_a_run_folder_outside_the_workspace_keeps_the_images_caches(tmp_path, cache_env):
    assert warm_start.use_compile_cache(
        tmp_path / "my-run", "2.9.1", "NVIDIA H100"
    ) == warm_start.CompileCache("off")
    assert os.environ[cache_env["inductor"]] == "/home/kfp-finetune/.cache/image-default"
    assert not (tmp_path / ".cache").exists()


def test_the_startup_time_is_recorded_and_read_back(tmp_path):
    started = warm_start.process_started_at()
    assert started <= time.time()  # this process started before this line ran
    folder = tmp_path / "ws" / ".cache" / "compile" / "torch-2.9.1-cpu"
    startup = warm_start.record_startup(
        tmp_path, time.time() - 42.0, warm_start.CompileCache("warm", warm_start.WORKSPACE, folder)
    )
    assert 42.0 <= startup.seconds_to_first_step < 60.0
    assert warm_start.read_startup(tmp_path) == startup
    assert (
        startup.line()
        == f"process start to the end of step 1: {startup.seconds_to_first_step:.0f}s (compile cache warm, on the workspace)"
    )
    assert warm_start.read_startup(tmp_path / "none") is None


COMPILE_ONCE = """
import sys, torch
from torch._dynamo.utils import counters
from kfp_finetune.components.torchtune_finetune import warm_start
cache = warm_start.use_compile_cache(sys.argv[1], torch.__version__, "cpu")
torch.compile(lambda x: (x.sin() + 1).sum())(torch.ones(8))
print(cache.state, cache.place, "hits", counters["inductor"]["fxgraph_cache_hit"])
"""


@pytest.mark.slow
def test_a_real_compile_in_the_next_run_hits_the_kernels_the_first_left_on_the_persistent_volume(tmp_path):
    """Two runs as two processes on two workspaces (two pipeline runs), sharing the model cache volume: the first
    compiles cold into it, the second starts warm and Inductor loads the compiled graph instead of compiling."""
    root = warm_start.persistent_compile_root(
        {"cache": {"entry": str(tmp_path / "model-cache" / "models" / "m")}}
    )
    env = {**os.environ, warm_start.COMPILE_CACHE_ENV: root}
    said = [
        subprocess.run(
            [sys.executable, "-c", COMPILE_ONCE, str(tmp_path / f"run-{n}-workspace" / "runs" / "job")],
            capture_output=True, text=True, timeout=600, env=env, check=True,
        ).stdout.strip().splitlines()[-1]
        for n in (1, 2)
    ]  # fmt: skip
    assert said == ["cold persistent volume hits 0", "warm persistent volume hits 1"]
    assert any(
        (tmp_path / "model-cache" / "compile").rglob("*.py")
    )  # Inductor's generated kernels live there
