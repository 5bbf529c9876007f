"""The tiny-kit defaults-vs-expert benchmark's plan (no training): the three sides differ as its docstring claims,
and each CPU run differs from its CUDA plan only in what cannot run on CPU."""

from __future__ import annotations

from benchmarks import bench_tiny_defaults as bench
from kfp_finetune.components._shared.seq_len import choose_max_seq_len


def test_the_sides_differ_as_claimed_and_move_to_cpu_changing_only_what_cannot_run_there(tmp_path):
    model_dir, data = bench.fixtures(tmp_path, rows=400)
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
        # and the expert's CUDA plans compiled, so compile moved there too.
        allowed = {"device", "dtype", "compile", "log_peak_memory_stats"}
        assert set(s["moved"]) <= allowed, (side, s["moved"])
        assert ("compile" in s["moved"]) == (side != "kubeflow")
        assert s["cuda"].config["device"] == "cuda"
        assert s["cpu"].yaml_path.is_file()
