"""The GPU reference suite without a GPU: `--plan` (the job matrix, what fits one GPU, the keys in which our
defaults, the expert's own config and Kubeflow's torchtune runtime settings differ; the cliff data variant's
max_seq_len), the scheduler of parallel one-GPU runs, and `--smoke`, whose run machinery (stop after the measured
steps before any checkpoint, results after every run, skip what is recorded, time limits, two runs at once on two
fake GPUs) trains the tiny kit's model on the CPU."""

from __future__ import annotations

import json
import sys
import threading
from types import SimpleNamespace

import pytest

from benchmarks import bench_gpu_suite, gpu_suite_jobs, gpu_suite_runs


@pytest.mark.slow
def test_plan_prints_the_jobs_and_the_three_configs_differing_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_gpu_suite, "gpus_present", lambda: (1, 80.0, "NVIDIA H100 80GB HBM3"))
    assert bench_gpu_suite.main(["--plan", "--workdir", str(tmp_path), "--steps", "5", "--rows", "1000"]) == 0
    out = capsys.readouterr().out
    jobs = {line.split(":")[0]: line for line in out.splitlines() if not line.startswith(" ")}
    assert list(jobs) == [*(job.name for job in bench_gpu_suite.JOBS), bench_gpu_suite.SCALING_JOB]
    assert jobs[bench_gpu_suite.SCALING_JOB].endswith("skipped: needs 8 GPUs on this machine (1 node x 8, then 2 local "
                                                      "nodes x 4 through the TrainJob backend), 1 present")  # fmt: skip
    assert jobs["llama3.2-1b-lora-1gpu"].endswith("runs here")
    assert jobs["llama3.1-8b-qlora-1gpu"].endswith("runs here")
    assert "(llama3_1/8B_qlora_single_device)" in jobs["llama3.1-8b-qlora-1gpu"]
    assert jobs["llama3.1-8b-full-8gpu"].endswith("skipped: needs 8 GPU(s), 1 present")
    assert "skipped: needs 2 nodes x 8 GPUs" in jobs["qwen2.5-7b-full-2x8gpu"]
    # The differing keys' rows (each job's table above its "settings:" block).
    tables = [block.split("  settings:")[0] for block in out.split("\n  key ")[1:]]
    rows = [line.split() for table in tables for line in table.splitlines()[1:]]
    # defaults and expert pack and compile; Kubeflow's runtimes run torchtune's base config as shipped.
    trained = len(bench_gpu_suite.JOBS)  # the scaling job trains the defaults side only: no table
    assert len(tables) == trained
    assert rows.count(["compile", "true", "true", "false"]) == trained
    assert rows.count(["dataset.packed", "true", "true", "false"]) == trained
    assert sum(1 for r in rows if r[0] == "tokenizer.max_seq_len" and r[2:] == ["4096", "null"]) == trained
    # The expert's own micro-batch rule, not our memory model's: the 8B LoRA job differs in batch and accumulation.
    lora_8b = out.split("llama3.1-8b-lora-1gpu:")[1].split("llama3.1-8b-full-8gpu:")[0]
    differing = {
        line.split()[0]: line.split()[1:] for line in lora_8b.split("  settings:")[0].splitlines()[2:]
    }
    assert differing["batch_size"][1] == "2" != differing["batch_size"][0]  # two 4096-token packs: 8k tokens
    assert differing["gradient_accumulation_steps"][1] == "8"  # 64k tokens per optimizer step
    # The defaults side trains on dataset-initialize's packs, the expert's are torchtune's own.
    assert differing["dataset._component_"][:2] == ["packed_dataset", "packed"]


def test_the_expert_rule_reads_gpu_memory_and_model_size():
    lora_8b = next(job for job in bench_gpu_suite.JOBS if job.name == "llama3.1-8b-lora-1gpu")
    on_80 = gpu_suite_jobs.expert_settings(lora_8b, 80.0)
    assert (on_80["batch_size"], on_80["gradient_accumulation_steps"]) == (2, 8)
    assert on_80["enable_activation_checkpointing"] is False
    on_141 = gpu_suite_jobs.expert_settings(lora_8b, 141.0)  # more memory: 4 packs, half the accumulation
    assert (on_141["batch_size"], on_141["gradient_accumulation_steps"]) == (4, 4)
    on_24 = gpu_suite_jobs.expert_settings(lora_8b, 24.0)  # one pack does not fit unchecked: checkpointing on
    assert on_24["enable_activation_checkpointing"] is True
    assert {k: on_80[k] for k in ("packed", "max_seq_len", "compile")} == {
        "packed": True, "max_seq_len": 4096, "compile": True
    }  # fmt: skip


@pytest.mark.slow
def test_plan_of_the_cliff_data_lands_the_defaults_on_the_former_cliff_lengths_unchecked(tmp_path):
    jobs = bench_gpu_suite.plan(tmp_path, 5, 1000, 1, 80.0, "cliff", ["llama3.1-8b-lora-1gpu"])
    assert list(jobs) == [f"llama3.1-8b-lora-1gpu/cliff-{n}" for n in gpu_suite_jobs.CLIFF_LENGTHS]
    for length in gpu_suite_jobs.CLIFF_LENGTHS:
        defaults = jobs[f"llama3.1-8b-lora-1gpu/cliff-{length}"]["settings"]["defaults"]
        assert defaults["max_seq_len"] == length
        assert defaults["enable_activation_checkpointing"] is False
        assert defaults["packed"] is True


def test_runs_alternate_their_side_order_per_job():
    order = bench_gpu_suite.run_order(["a", "b", "c"], ["defaults", "expert"])
    assert order == [("a", "defaults"), ("a", "expert"), ("b", "expert"), ("b", "defaults"),
                     ("c", "defaults"), ("c", "expert")]  # fmt: skip


def test_one_gpu_runs_go_in_parallel_each_on_its_own_gpu_and_multi_gpu_runs_after_on_all():
    both_running = threading.Barrier(2, timeout=30)  # passes only while two runs are in flight together
    units = [
        SimpleNamespace(name="a", gpus=1),
        SimpleNamespace(name="wide", gpus=2),
        SimpleNamespace(name="b", gpus=1),
    ]
    seen, recorded = {}, []

    def execute(unit, visible):
        if unit.gpus == 1:
            both_running.wait()
        else:
            assert len(recorded) == 2  # after both one-GPU runs were recorded
        seen[unit.name] = visible
        return {"status": "ok"}

    gpu_suite_runs.schedule(units, 2, execute, lambda unit, result: recorded.append((unit.name, result)))
    assert {seen["a"], seen["b"]} == {"0", "1"}
    assert seen["wide"] == "0,1"
    assert sorted(name for name, _ in recorded) == ["a", "b", "wide"] and recorded[-1][0] == "wide"


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
    monkeypatch.setenv(bench_gpu_suite.FAKE_GPUS_ENV, "2")  # both sides at once, each on a "GPU" of its own
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
    assert {runs["defaults"]["gpus"], runs["expert"]["gpus"]} == {"0", "1"}
    assert results["settings"]["parallel_slots"] == 2
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
