"""The command line: resolve-config shows what would run, and bad input exits 2 with the reason."""

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
    assert "expected KEY=VALUE" in capsys.readouterr().err
