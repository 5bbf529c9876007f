"""Warm starts (warm_start.py): torch.compile's caches on the workspace per torch version and GPU model, and the
seconds from the training process's start to its first step."""

from __future__ import annotations

import os
import time

import pytest

from kfp_finetune.components.torchtune_finetune import warm_start


@pytest.fixture
def cache_env(monkeypatch):
    for variable in warm_start.CACHE_VARIABLES.values():
        monkeypatch.setenv(variable, "/home/kfp-finetune/.cache/image-default")  # as images/trainer sets them
    return warm_start.CACHE_VARIABLES


def test_a_workspace_run_compiles_into_the_workspace_cache_of_its_torch_and_gpu(tmp_path, cache_env):
    run_dir = tmp_path / "workspace" / "runs" / "job-1"
    state = warm_start.use_compile_cache(run_dir, "2.9.1+cu128", "NVIDIA H100 80GB HBM3")
    folder = tmp_path / "workspace" / ".cache" / "compile" / "torch-2.9.1+cu128-nvidia-h100-80gb-hbm3"
    assert state == "cold"
    assert os.environ[cache_env["inductor"]] == str(folder / "inductor")
    assert os.environ[cache_env["triton"]] == str(folder / "triton")

    (folder / "triton" / "abc").mkdir()
    (folder / "triton" / "abc" / "kernel.cubin").write_bytes(b"\x7fELF")  # what the first run compiled
    assert (
        warm_start.use_compile_cache(
            tmp_path / "workspace" / "runs" / "job-2", "2.9.1+cu128", "NVIDIA H100 80GB HBM3"
        )
        == "warm"
    )
    # Another GPU model or torch version never reads those kernels.
    assert warm_start.use_compile_cache(run_dir, "2.9.1+cu128", "NVIDIA H200") == "cold"
    assert warm_start.use_compile_cache(run_dir, "2.10.0+cu128", "NVIDIA H100 80GB HBM3") == "cold"


def test_a_run_folder_outside_the_workspace_keeps_the_images_caches(tmp_path, cache_env):
    assert warm_start.use_compile_cache(tmp_path / "my-run", "2.9.1", "NVIDIA H100") == "off"
    assert os.environ[cache_env["inductor"]] == "/home/kfp-finetune/.cache/image-default"
    assert not (tmp_path / ".cache").exists()


def test_the_startup_time_is_recorded_and_read_back(tmp_path):
    started = warm_start.process_started_at()
    assert started <= time.time()  # this process started before this line ran
    startup = warm_start.record_startup(tmp_path, time.time() - 42.0, "warm")
    assert 42.0 <= startup.seconds_to_first_step < 60.0
    assert warm_start.read_startup(tmp_path) == startup
    assert (
        startup.line()
        == f"process start to the end of step 1: {startup.seconds_to_first_step:.0f}s (compile cache warm)"
    )
    assert warm_start.read_startup(tmp_path / "none") is None
