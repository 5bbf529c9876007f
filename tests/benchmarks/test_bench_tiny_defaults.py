"""The tiny-kit defaults-vs-expert benchmark's plan (no training): the three sides differ as its docstring claims,
and each CPU run differs from its CUDA plan only in what cannot run on CPU."""

from __future__ import annotations

import pytest

from benchmarks import bench_tiny_defaults as bench
from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len


@pytest.mark.slow
def test_the_sides_differ_as_claimed_and_move_to_cpu_changing_only_what_cannot_run_there(tmp_path):
    model_dir, data = bench.fixtures(tmp_path, rows=3000)
    sides = bench.plan(tmp_path, model_dir, data, steps=4)
    configs = {side: s["cpu"].config for side, s in sides.items()}

    # defaults: packed at a max_seq_len derived from the data (the one rule, on the tokenized lengths), a ~16k-token
    # micro-batch as defaults.py chose it for CUDA.
    defaults = sides["defaults"]
    lengths = defaults["cuda"].token_lengths
    assert lengths is not None and "estimated" not in lengths.how  # tokenized as training does
    seq = choose_max_seq_len(lengths.lengths, defaults["cuda"].model.hf_config["max_position_embeddings"])
    assert configs["defaults"]["dataset"]["packed"] is True
    assert configs["defaults"]["tokenizer"]["max_seq_len"] == seq
    assert seq not in (None, bench.EXPERT["max_seq_len"])  # data-derived, not the expert's hand-picked length
    assert 8192 <= configs["defaults"]["batch_size"] * seq <= 16384
    assert {c.setting for c in defaults["cuda"].defaults} >= {
        "max_seq_len",
        "packed",
        "batch_size",
        "compile",
    }

    # expert: the hand settings; kubeflow: torchtune's base config as shipped (unpacked, no max_seq_len, 4 x 8).
    assert configs["expert"]["dataset"]["packed"] is True
    assert configs["expert"]["tokenizer"]["max_seq_len"] == bench.EXPERT["max_seq_len"]
    assert configs["expert"]["batch_size"] == bench.EXPERT["batch_size"]
    assert configs["kubeflow"]["dataset"]["packed"] is False
    assert configs["kubeflow"]["tokenizer"]["max_seq_len"] is None
    assert (configs["kubeflow"]["batch_size"], configs["kubeflow"]["gradient_accumulation_steps"]) == (4, 8)

    for side, s in sides.items():
        cpu = s["cpu"].config
        assert (cpu["device"], cpu["dtype"], cpu["compile"]) == ("cpu", "fp32", False), side
        # Only what cannot run on CPU moved (resolve's CPU handling turns peak-memory stats off); the defaults'
        # and the expert's CUDA plans compiled, so compile moved there too; their packed CUDA plans build the model
        # for flex attention (flex_attention.py), which packed batches on CPU do not use.
        allowed = {
            "device",
            "dtype",
            "compile",
            "log_peak_memory_stats",
            "model._component_",
            "model.builder",
        }
        assert set(s["moved"]) <= allowed, (side, s["moved"])
        assert ("compile" in s["moved"]) == (side != "kubeflow")
        assert s["cuda"].config["device"] == "cuda"
        assert s["cpu"].yaml_path.is_file()


@pytest.mark.slow
def test_run_gives_each_repeat_a_fresh_folder_and_the_ratios_of_median_trained_tokens(tmp_path, monkeypatch):
    speeds = {"defaults": [900.0, 1100.0], "expert": [1000.0, 1000.0], "kubeflow": [400.0, 600.0]}
    seen: list = []

    def fake_run(resolved, log_path):  # no training: the plan's CPU config, run in its own folder
        side = resolved.run_dir.name.rsplit("-", 1)[0]
        assert not (resolved.run_dir / "logs").exists()  # fresh: nothing from an earlier repeat
        seen.append((side, resolved.run_dir.name, resolved.config["batch_size"]))
        return {"trained_tokens_per_second": speeds[side].pop(0), "processed_tokens_per_second": 1.0,
                "first_step_seconds": 5.0}  # fmt: skip

    monkeypatch.setattr(bench, "timed_run", fake_run)
    monkeypatch.setattr(bench, "step_rates", lambda path: [(1000.0, 2.0), (2000.0, 1.0)])
    settings = bench.Settings(
        workdir=tmp_path, extra={"tiny_rows": "1500", "tiny_steps": "3", "tiny_repeats": "2"}
    )
    report = bench.run(settings, echo=lambda _: None)
    # Sides alternate order between repeats, each run in its own folder.
    assert [(s, d) for s, d, _ in seen] == [
        ("defaults", "defaults-1"), ("expert", "expert-1"), ("kubeflow", "kubeflow-1"),
        ("kubeflow", "kubeflow-2"), ("expert", "expert-2"), ("defaults", "defaults-2"),
    ]  # fmt: skip
    results = report["results"]
    assert (results["defaults_vs_expert"], results["kubeflow_vs_expert"]) == (1.0, 0.5)
    assert results["kubeflow"]["processed_tokens_per_second"] == bench.UNPACKED
    # Every repeat's steps train 2,000 tokens each, in 2 s and 1 s.
    assert results["defaults"]["least_disturbed_tokens_per_second"] == round(4000 / 3, 1)
    assert results["configs"]["kubeflow"]["packed"] is False


def test_least_disturbed_times_each_step_at_its_fastest_repeat():
    # Step 1 trains 1,000 tokens (fastest 0.5 s in repeat 2), step 2 3,000 tokens (fastest 1 s in repeat 1).
    repeats = [[(500.0, 2.0), (3000.0, 1.0)], [(2000.0, 0.5), (1000.0, 3.0)]]
    assert bench.least_disturbed(repeats) == round(4000 / 1.5, 1)
