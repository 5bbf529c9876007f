"""One `KEY=VALUE` parser (kfp_finetune/commands/values.py) for every command: the same text, the same value."""

from __future__ import annotations

import pytest
import yaml

from kfp_finetune.cli import main
from kfp_finetune.commands.values import UsageError, parse_value
from tests.cli import test_kfp_cli as kfp_cli_tests
from tests.cli.test_kfp_cli import FINETUNE_PARAMS, cli
from tests.support import kfp_standin as kfp_support

kfp_standin = kfp_support.kfp_standin
clean_environment = kfp_cli_tests.clean_environment  # autouse: no ambient KFP settings, a known token


@pytest.mark.parametrize(
    ("raw", "declared", "expected"),
    [
        ("0123", "NUMBER_INTEGER", 123),  # never YAML 1.1 octal (83)
        ("0123", "STRING", "0123"),
        ("0123", None, 123),  # YAML 1.2 core
        ("-7", "NUMBER_INTEGER", -7),
        ("1e-4", "NUMBER_DOUBLE", 1e-4),  # YAML 1.1 would read a string
        ("3", "NUMBER_DOUBLE", 3.0),
        ("True", "BOOLEAN", True),
        ("false", "BOOLEAN", False),
        ("yes", "STRING", "yes"),
        ("yes", None, "yes"),  # not YAML 1.1's true
        ("2024-01-01", None, "2024-01-01"),  # not a date
        ('["a", "b"]', "LIST", ["a", "b"]),
        ("[a, 0123, 1.5, true]", "LIST", ["a", 123, 1.5, True]),
        ('{"k": 1}', "STRUCT", {"k": 1}),
        ("{k: v, n: [1]}", "STRUCT", {"k": "v", "n": [1]}),
        ("a=b", "STRING", "a=b"),
        ("", "STRING", ""),
    ],
)
def test_values_become_the_declared_type(raw, declared, expected):
    value = parse_value("key", raw, declared)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("raw", "declared"),
    [
        ("1.5", "NUMBER_INTEGER"),
        ("seven", "NUMBER_INTEGER"),
        ("0x10", "NUMBER_INTEGER"),
        ("fast", "NUMBER_DOUBLE"),
        ("nan", "NUMBER_DOUBLE"),
        ("yes", "BOOLEAN"),
        ("1", "BOOLEAN"),
        ("a", "LIST"),
        ("[a, b", "LIST"),
        ("[a]", "STRUCT"),
    ],
)
def test_a_bad_value_names_the_key_the_type_and_the_value(raw, declared):
    with pytest.raises(UsageError) as error:
        parse_value("tune_seed", raw, declared, "--param")
    assert f"--param tune_seed: tune_seed is declared {declared}" in str(error.value)
    assert repr(raw) in str(error.value)


# tune_seed is NUMBER_INTEGER, data_train_split STRING, export_overwrite BOOLEAN, eval_lm_eval_tasks LIST,
# tune_overrides STRUCT, tune_learning_rate NUMBER_DOUBLE in finetune-pipeline.
GIVEN = [
    "tune_seed=0123",
    "data_train_split=0123",
    "export_overwrite=True",
    "eval_lm_eval_tasks=[hellaswag, 0123]",
    "tune_overrides={clip_grad_norm: 1.0}",
    "tune_learning_rate=1e-4",
]
EXPECTED = {
    "tune_seed": 123,
    "data_train_split": "0123",
    "export_overwrite": True,
    "eval_lm_eval_tasks": ["hellaswag", 123],
    "tune_overrides": {"clip_grad_norm": 1.0},
    "tune_learning_rate": 1e-4,
}


def _sent(body: dict) -> dict:
    parameters = body["runtime_config"]["parameters"]
    return {key: parameters[key] for key in EXPECTED}


@pytest.mark.slow
def test_run_schedule_and_run_local_read_the_same_text_as_the_same_value(capsys, kfp_standin, tmp_path):
    from kfp_finetune.commands.run_local import local_arguments
    from kfp_finetune.pipelines import finetune_pipeline

    params = [arg for p in [*FINETUNE_PARAMS, *GIVEN] for arg in ("--param", p)]
    assert cli(capsys, "run", "finetune-pipeline", "--host", kfp_standin.url, *params)[0] == 0
    code, _, err = cli(
        capsys, "schedule", "finetune-pipeline", "--host", kfp_standin.url, *params, "--cron", "0 0 2 * * *"
    )
    assert code == 0, err
    assert _sent(kfp_standin.requests_for("POST", "/apis/v2beta1/runs")[0].json) == EXPECTED
    assert _sent(kfp_standin.requests_for("POST", "/apis/v2beta1/recurringruns")[0].json) == EXPECTED
    local = local_arguments(finetune_pipeline, [*FINETUNE_PARAMS, *GIVEN])
    assert {key: local[key] for key in EXPECTED} == EXPECTED

    # A params file's scalars are read like command-line text: `tune_seed: 0123` is 123, a string keeps 0123.
    params_file = tmp_path / "params.yaml"
    params_file.write_text("\n".join(line.replace("=", ": ", 1) for line in GIVEN) + "\n")
    required = [arg for p in FINETUNE_PARAMS for arg in ("--param", p)]
    code, _, err = cli(
        capsys,
        "run",
        "finetune-pipeline",
        "--host",
        kfp_standin.url,
        *required,
        "--params-file",
        str(params_file),
    )
    assert code == 0, err
    assert _sent(kfp_standin.requests_for("POST", "/apis/v2beta1/runs")[1].json) == EXPECTED


def test_resolve_config_set_uses_the_same_parser(tiny_llama, tiny_dataset, capsys):
    args = ["resolve-config", "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"])]
    assert (
        main([*args, "--set", "seed=0123", "--set", "learning_rate=1e-4", "--set", "clip_grad_norm=0123"])
        == 0
    )
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["seed"] == 123  # a typed setting: NUMBER_INTEGER
    assert resolved["optimizer"]["lr"] == 1e-4
    assert resolved["clip_grad_norm"] == 123  # a torchtune key: untyped, YAML 1.2 core
    assert main([*args, "--set", "packed=yes"]) == 2
    assert (
        "--set packed: packed is declared BOOLEAN, so it needs true or false; got 'yes'"
        in capsys.readouterr().err
    )
