"""The command line: resolve-config shows what would run, and bad input exits 2 with the reason."""

import json
from pathlib import Path

import pytest
import yaml

from kfp_finetune.cli import main


def test_resolve_config_prints_recipe_and_complete_yaml(tiny_llama, tiny_dataset, tmp_path, capsys):
    code = main([
        "resolve-config", "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]),
        "--method", "dora", "--device", "cpu", "--run-dir", str(tmp_path / "run"),
        "--set", "learning_rate=3e-4", "--set", "lora_rank=4", "--set", "clip_grad_norm=1.0",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("# recipe: lora_finetune_single_device\n")
    config = yaml.safe_load(out)
    assert config["optimizer"]["lr"] == 3e-4  # a float, not the string '3e-4'
    assert (config["model"]["lora_rank"], config["model"]["use_dora"], config["clip_grad_norm"]) == (
        4,
        True,
        1.0,
    )
    assert not (tmp_path / "run").exists(), "resolve-config runs and writes nothing"


def test_resolve_config_names_the_engine_and_shows_the_transformers_engines_settings(
    tiny_llama, tiny_dataset, tmp_path, capsys
):
    """A model torchtune serves: its recipe, then the engine line; one it cannot (a mixture-of-experts): the
    transformers engine's settings file as a run would get it, refused settings named; nothing written."""
    pytest.importorskip("transformers")
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    data = ["--data", str(tiny_dataset["train.jsonl"]), "--run-dir", str(tmp_path / "run")]
    assert main(["resolve-config", "--model-dir", str(tiny_llama), *data]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .startswith("# engine: torchtune (torchtune serves the llama3_2")
    )
    moe = build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")
    assert main(["resolve-config", "--model-dir", str(moe), *data, "--set", "lora_rank=4"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("# engine: transformers (transformers ")
        and "Qwen3MoeForCausalLM" in out.splitlines()[0]
    )
    settings = yaml.safe_load(out)
    assert (settings["lora_rank"], settings["model_dir"], settings["packing"]) == (4, str(moe), "auto")
    assert settings["data_files"] == [str(tiny_dataset["train.jsonl"])]
    assert main(["resolve-config", "--model-dir", str(moe), *data, "--set", "compile=true"]) == 2
    assert "tune_compile is a torchtune setting" in capsys.readouterr().err
    assert main(["resolve-config", "--model-dir", str(tiny_llama), *data, "--engine", "megatron"]) == 2
    assert "tune_engine='megatron' is not an engine" in capsys.readouterr().err
    # A classifier of a family torchtune serves: the engine that trains classifiers, and its settings.
    from kfp_finetune.tiny.reviews import write_reviews

    classify = ["--set", "dataset_type=classification", "--run-dir", str(tmp_path / "run")]
    reviews = ["--data", str(write_reviews(tmp_path / "yelp.jsonl", count=60))]
    assert main(["resolve-config", "--model-dir", str(tiny_llama), *reviews, *classify]) == 0
    out = capsys.readouterr().out
    assert "LlamaForSequenceClassification" in out.splitlines()[0]
    assert yaml.safe_load(out)["dataset_type"] == "classification"
    # Instruct rows read as a classifier's: the columns it needs are not there (the run would fail on them).
    assert main(["resolve-config", "--model-dir", str(tiny_llama), *data, *classify]) == 2
    assert (
        "the classification data has no column label, text (it has input, output)" in capsys.readouterr().err
    )
    assert not (tmp_path / "run").exists(), "resolve-config runs and writes nothing"


def test_resolve_config_plans_a_transformers_runs_length_from_the_datas_rows_as_the_run_does(
    tmp_path, capsys
):
    """The run-length floor (run_floor.py) the fine-tune step applies from dataset-initialize's row count: the
    preview counts the --data rows over --devices and shows the same choices, or refuses data too small."""
    pytest.importorskip("transformers")
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    moe = build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")

    def rows(count: int) -> Path:
        data = tmp_path / f"rows-{count}.jsonl"
        data.write_text(
            "".join(json.dumps({"input": f"q{i}", "output": f"a{i}"}) + "\n" for i in range(count))
        )
        return data

    args = ["resolve-config", "--model-dir", str(moe), "--run-dir", str(tmp_path / "run")]
    assert main([*args, "--data", str(rows(60)), "--devices", "2"]) == 0
    settings = yaml.safe_load(capsys.readouterr().out)
    assert settings["batch_size"] < 8 and settings["planned"][-1]["setting"] == "optimizer steps"
    assert "60 rows over batch 8 x accumulation 1 x 2 process(es)" in settings["planned"][0]["reason"]
    assert main([*args, "--data", str(rows(4))]) == 2
    assert "too little training data for a run that learns" in capsys.readouterr().err
    assert not (tmp_path / "run").exists(), "resolve-config runs and writes nothing"


def test_resolve_config_writes_a_file(tiny_llama, tiny_dataset, tmp_path, capsys):
    target = tmp_path / "resolved.yaml"
    args = ["resolve-config", "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"])]
    assert main([*args, "--method", "full", "--devices", "2", "-o", str(target)]) == 0
    assert "recipe: full_finetune_distributed" in capsys.readouterr().err
    assert yaml.safe_load(target.read_text())["model"]["_component_"] == "torchtune.models.llama3_2.llama3_2"


def test_resolve_config_bad_input_exits_2(tiny_llama, tiny_dataset, capsys):
    args = ["resolve-config", "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"])]
    assert main([*args, "--set", "optimzer.lr=1"]) == 2
    assert "'optimzer' does not exist" in capsys.readouterr().err
    assert main([*args, "--set", "lora_rank"]) == 2
    assert "--set expects KEY=VALUE, got 'lora_rank'" in capsys.readouterr().err
    assert main([*args, "--set", "lora_rank=1.5"]) == 2
    assert "--set lora_rank: lora_rank is declared NUMBER_INTEGER" in capsys.readouterr().err


# --- run-local and the demo ---------------------------------------------------------------------------------


def test_run_local_converts_params_to_the_declared_types():
    from kfp_finetune.commands.run_local import local_arguments
    from kfp_finetune.pipelines import finetune_pipeline

    required = ["model_uri=/m", "data_uri=/d", "export_destination=/e"]
    arguments = local_arguments(
        finetune_pipeline, [*required, "data_eval_fraction=0", "tune_learning_rate=1e-4", "tune_seed=7"]
    )
    assert arguments["data_eval_fraction"] == 0.0 and isinstance(arguments["data_eval_fraction"], float)
    assert arguments["tune_learning_rate"] == 1e-4  # YAML 1.1 reads `1e-4` as a string
    assert arguments["tune_seed"] == 7
    assert (arguments["tune_backend"], arguments["tune_gpus_per_node"]) == ("local", 0)


def test_run_local_bad_params_exit_2_naming_the_parameter(capsys):
    required = ["--param", "model_uri=/m", "--param", "data_uri=/d", "--param", "export_destination=/e"]
    assert main(["run-local", "finetune-pipeline", *required, "--param", "tune_seed=seven"]) == 2
    assert (
        "--param tune_seed: tune_seed is declared NUMBER_INTEGER, so it needs an integer, e.g. 8; got 'seven'"
        in (capsys.readouterr().err)
    )
    assert main(["run-local", "finetune-pipeline", *required, "--param", "tune_sed=1"]) == 2
    assert "unknown parameter(s) tune_sed" in capsys.readouterr().err
    assert main(["run-local", "finetune-pipeline", "--param", "model_uri=/m"]) == 2
    assert "missing required parameter(s): data_uri, export_destination" in capsys.readouterr().err


def test_no_pipeline_parameter_defaults_to_none():
    """kfp.local cannot carry a None default (`ValueError: Unknown value type`)."""
    from kfp_finetune.pipelines import PIPELINES

    for name, pipeline in PIPELINES.items():
        for key, spec in (pipeline.component_spec.inputs or {}).items():
            assert not (spec.optional and spec.default is None and not spec.type.startswith("system.")), (
                f"{name}.{key} defaults to None"
            )


@pytest.mark.slow
def test_demo_is_quiet_and_keeps_its_results(tmp_path, monkeypatch, capfd):
    """The real demo (fewer steps): under 100 lines, the full log in a file, reports as .html, only real paths."""
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--output", "out", "--steps", "120"]) == 0
    out, err = capfd.readouterr()
    lines = (out + err).splitlines()
    assert len(lines) < 100, "\n".join(lines)
    assert not [line for line in lines if "Warning" in line or "executor_input" in line], "\n".join(lines)
    assert "  torchtune-finetune: started" in lines and "  export: done in" in out
    assert any(line.startswith("    progress: step ") for line in lines)
    assert "quality gate: passed: the model was exported" in out
    log = (tmp_path / "out" / "demo.log").read_text()
    assert "Got executor_input" in log and "progress: step 120/120" in log
    shown = dict(line.strip().split(": ", 1) for line in lines if line.startswith("  ") and ": " in line)
    for label in (
        "exported model",
        "tuned model (merged)",
        "train report",
        "eval report",
        "metrics",
        "full log",
    ):
        assert (tmp_path / shown[label].strip()).exists(), label
    assert shown["train report"].strip().endswith(".html")
    assert "<svg" in (tmp_path / shown["train report"].strip()).read_text()
    assert (tmp_path / shown["tuned model (merged)"].strip() / "model-00001-of-00001.safetensors").is_file()


def test_trainjob_dry_run_previews_a_transformers_engine_job_on_its_runtime(tiny_dataset, tmp_path, capsys):
    pytest.importorskip("transformers")
    from kfp_finetune.components._shared.transformers.plan import MODULE as TRAIN_MODULE
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    moe = build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")
    args = ["trainjob", "--dry-run", "--model-dir", str(moe), "--data", str(tiny_dataset["train.jsonl"])]
    assert main([*args, "--gpus", "0", "--workspace", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    manifest = yaml.safe_load(captured.out)
    assert manifest["spec"]["runtimeRef"]["name"] == "transformers-cpu"
    command = manifest["spec"]["trainer"]["command"]
    assert command[3:8] == ["--engine", "transformers", "python", "-m", TRAIN_MODULE]
    assert "# engine: transformers (" in captured.err
    assert not list(tmp_path.glob("runs/*")), "--dry-run writes nothing"
    assert main([*args, "--gpus", "2", "--workspace", str(tmp_path)]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    assert manifest["spec"]["runtimeRef"]["name"] == "transformers"
    assert manifest["spec"]["trainer"]["command"][5] == "torchrun"
