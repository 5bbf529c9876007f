"""The GPU reference suite without a GPU: `--plan` (the job matrix, what fits one GPU, the keys in which our
defaults, the expert config and Kubeflow's torchtune runtime settings differ) and `--smoke`, whose run machinery
(stop after the measured steps before any checkpoint, results after every run, skip what is recorded, time limits)
trains the tiny kit's model on the CPU."""

from __future__ import annotations

import json
import sys

import pytest

from benchmarks import bench_gpu_suite, gpu_suite_runs


@pytest.mark.slow
def test_plan_prints_the_jobs_and_the_three_configs_differing_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_gpu_suite, "gpus_present", lambda: (1, 80.0, "NVIDIA H100 80GB HBM3"))
    assert bench_gpu_suite.main(["--plan", "--workdir", str(tmp_path), "--steps", "5", "--rows", "1000"]) == 0
    out = capsys.readouterr().out
    jobs = {line.split(":")[0]: line for line in out.splitlines() if not line.startswith(" ")}
    assert list(jobs) == [job.name for job in bench_gpu_suite.JOBS]
    assert jobs["llama3.2-1b-lora-1gpu"].endswith("runs here")
    assert jobs["llama3.1-8b-qlora-1gpu"].endswith("runs here")
    assert "(llama3_1/8B_qlora_single_device)" in jobs["llama3.1-8b-qlora-1gpu"]
    assert jobs["llama3.1-8b-full-8gpu"].endswith("skipped: needs 8 GPU(s), 1 present")
    assert "skipped: needs 2 nodes x 8 GPUs" in jobs["qwen2.5-7b-full-2x8gpu"]
    rows = [line.split() for line in out.splitlines() if line.startswith("  ")]
    # defaults and expert pack and compile; Kubeflow's runtimes run torchtune's base config as shipped.
    assert rows.count(["compile", "true", "true", "false"]) == len(jobs)
    assert rows.count(["dataset.packed", "true", "true", "false"]) == len(jobs)
    assert sum(1 for r in rows if r[0] == "tokenizer.max_seq_len" and r[2:] == ["4096", "null"]) == len(jobs)


def test_differing_keys_replaces_the_run_folder_only_as_a_whole_path(tmp_path):
    run, data = tmp_path / "d", str(tmp_path / "data" / "rows.jsonl")  # "<tmp>/d" is a prefix of "<tmp>/data"
    configs = {
        "a": {"output_dir": str(run), "log": str(run / "logs"), "data": data},
        "b": {"output_dir": str(tmp_path / "e"), "log": str(tmp_path / "e" / "logs"), "data": data},
    }
    assert bench_gpu_suite.differing_keys(configs, {"a": run, "b": tmp_path / "e"}) == {}


@pytest.mark.slow
def test_cpu_smoke_stops_each_run_before_its_checkpoint_and_keeps_results_per_run(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_gpu_suite, "gpus_present", lambda: (0, 80.0, ""))
    out = tmp_path / "out"
    args = [
        "--smoke",
        "--rows",
        "600",
        "--sides",
        "defaults,expert",
        "--workdir",
        str(tmp_path),
        "--output",
        str(out),
    ]
    assert bench_gpu_suite.main(args) == 0
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"][bench_gpu_suite.TINY_JOB.name]
    assert set(runs) == {"defaults", "expert"}
    for side in ("defaults", "expert"):
        assert runs[side]["status"] == "ok", runs[side]
        assert runs[side]["trained_tokens_per_second"] > 0
        assert runs[side]["steps_measured"] == bench_gpu_suite.SMOKE_STEPS - 2  # after two warm-up steps
    assert runs["expert"]["settings"]["max_seq_len"] == 1024  # the expert's own choice, not the defaults'
    assert results["headline"].startswith("defaults / expert trained tokens/s")
    # Stopped at its steps: the epoch never ended, so no checkpoint was written; the run folders are gone.
    assert not list((tmp_path / "gpu_suite" / "runs").rglob("*.safetensors"))
    assert not list((tmp_path / "gpu_suite" / "runs").rglob("*.yaml"))

    # A second invocation skips what is recorded and runs only what is missing.
    args[args.index("defaults,expert")] = "defaults,kubeflow"
    assert bench_gpu_suite.main(args) == 0
    again = json.loads((out / "results.json").read_text())["runs"][bench_gpu_suite.TINY_JOB.name]
    assert again["defaults"] == runs["defaults"]
    assert again["kubeflow"]["status"] == "ok", again["kubeflow"]


def test_a_run_is_stopped_as_soon_as_it_has_logged_its_steps(tmp_path):
    # Logs two steps, then would train on for ten minutes (and write a checkpoint): it is killed after step 2.
    script = "print('Step 1 | loss:2.0', flush=True); print('Step 2 | loss:1.5', flush=True); import time; time.sleep(600)"
    run = gpu_suite_runs.run_until_steps(
        [sys.executable, "-c", script], tmp_path, 2, 300.0, tmp_path / "log.txt"
    )
    assert run["status"] == "ok"
    assert run["first_step_seconds"] <= run["last_step_seconds"] < 300.0


def test_a_run_past_its_time_limit_is_stopped_and_recorded_as_timed_out(tmp_path):
    script = "print('Step 1 | loss:2.0', flush=True); import time; time.sleep(600)"
    run = gpu_suite_runs.run_until_steps(
        [sys.executable, "-c", script], tmp_path, 3, 2.0, tmp_path / "log.txt"
    )
    assert run["status"] == "timeout"
    assert run["first_step_seconds"] is not None
    assert run["log_tail"] == ["Step 1 | loss:2.0"]


def test_a_run_that_fails_is_recorded_with_its_exit_code_and_log_tail(tmp_path):
    script = "import sys; print('CUDA out of memory'); sys.exit(3)"
    run = gpu_suite_runs.run_until_steps(
        [sys.executable, "-c", script], tmp_path, 3, 300.0, tmp_path / "log.txt"
    )
    assert run["status"] == "exit 3"
    assert run["log_tail"] == ["CUDA out of memory"]
