"""The GPU reference suite's `--plan` (CPU only): the job matrix, what fits one GPU, and the keys in which our
defaults, the expert config and Kubeflow's torchtune runtime settings differ."""

from __future__ import annotations

import pytest

from benchmarks import bench_gpu_suite


@pytest.mark.slow
def test_plan_prints_the_jobs_and_the_three_configs_differing_keys(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_gpu_suite, "_gpus", lambda: (1, 80.0))  # as on one H100
    assert bench_gpu_suite.main(["--plan", "--workdir", str(tmp_path), "--steps", "5"]) == 0
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
