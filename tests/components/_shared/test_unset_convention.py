"""The one "unset" convention (components/_shared/unset.py): -1, "", [] / {}, "auto" keep the base config's value,
the same in the fine-tune component, the pipelines and the sweep; 0 is a real value where it is valid."""

import inspect

import pytest
import yaml

from kfp_finetune.components._shared import unset
from kfp_finetune.components._shared.torchtune.config import SWITCHES, ConfigError, from_flat
from kfp_finetune.components._shared.torchtune.resolve import resolve_run
from kfp_finetune.components.sweep.sweep import trial_grid
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune
from kfp_finetune.components.torchtune_finetune.finetune import _STEP_PARAMETERS, component_settings
from kfp_finetune.pipelines.parameters import PARAMETERS

# The component's settings whose default is a real value, not "unset".
REAL_DEFAULTS = {"method": "lora", "device": "auto"}


def resolved(tiny_llama, data_file, tmp_path, **parameters):
    """The torchtune YAML the fine-tune step writes for these component parameter values."""
    run = resolve_run(from_flat(component_settings(parameters)), tiny_llama, data_file, tmp_path / "run")
    return yaml.safe_load(run.yaml_path.read_text())


def test_every_optional_component_setting_defaults_to_unset():
    defaults = {
        name: p.default
        for name, p in inspect.signature(torchtune_finetune.python_func).parameters.items()
        if name not in _STEP_PARAMETERS
    }
    settings = component_settings(defaults)
    assert {k: v for k, v in settings.items() if v is not None} == REAL_DEFAULTS
    for name, value in defaults.items():
        assert value is not None, f"{name} defaults to None: use the unset sentinel of its type"


def test_the_pipelines_spell_unset_as_the_component_does():
    for parameter in PARAMETERS.values():
        for target in parameter.feeds:
            if target.startswith("torchtune_finetune.") and target.split(".")[1] not in _STEP_PARAMETERS:
                converted = unset.value(parameter.name, parameter.default, target.split(".")[1] in SWITCHES)
                real = REAL_DEFAULTS.get(target.split(".")[1])
                assert converted == real, f"{parameter.name}={parameter.default!r} is not unset"


@pytest.mark.parametrize(
    "given,expected",
    [(-1, None), (-1.0, None), (0, 0), (0.0, 0.0), (3e-4, 3e-4), ("", None), ("x", "x"), ([], None), ({}, None),
     (["q_proj"], ["q_proj"]), (False, False), (True, True)],
)  # fmt: skip
def test_sentinels(given, expected):
    assert unset.value("x", given) == expected


def test_switches_take_auto_true_false_and_name_the_parameter_otherwise():
    assert [unset.switch("s", v) for v in ("auto", "true", "false", "TRUE", True)] == [
        None,
        True,
        False,
        True,
        True,
    ]
    with pytest.raises(ConfigError, match="train_on_input must be auto .*true or false.*'yes'"):
        component_settings({"train_on_input": "yes"})


def test_zero_is_a_real_value_where_it_is_valid(tiny_llama, tiny_dataset, tmp_path):
    c = resolved(
        tiny_llama, tiny_dataset["train.jsonl"], tmp_path,
        method="lora", device="cpu", weight_decay=0.0, lora_dropout=0.0, num_warmup_steps=0,
    )  # fmt: skip
    assert c["optimizer"]["weight_decay"] == 0.0
    assert c["model"]["lora_dropout"] == 0.0
    assert c["lr_scheduler"]["num_warmup_steps"] == 0


@pytest.mark.parametrize(
    "name", ["batch_size", "learning_rate", "lora_rank", "max_seq_len", "max_steps_per_epoch"]
)
def test_zero_is_refused_where_it_is_not_valid_naming_the_unset_value(name):
    with pytest.raises(ConfigError, match=f"{name} must be .*-1 keeps the base config's"):
        from_flat(component_settings({name: 0})).check()


def test_sweep_with_learning_rate_unset_keeps_the_base_configs(tiny_llama, tiny_dataset, tmp_path):
    """The trial's values go to the fine-tune step as its parameters; -1 resolves to the base config's lr."""
    (trial,) = trial_grid([-1], [8])
    assert trial["trial_name"] == "trial-lrbase-r8"
    data = tiny_dataset["train.jsonl"]
    swept = resolved(tiny_llama, data, tmp_path / "swept", method="lora", device="cpu",
                     learning_rate=trial["learning_rate"], lora_rank=trial["lora_rank"])  # fmt: skip
    base = resolved(tiny_llama, data, tmp_path / "base", method="lora", device="cpu")
    assert swept["optimizer"]["lr"] == base["optimizer"]["lr"] > 0
    assert swept["model"]["lora_rank"] == 8


@pytest.mark.parametrize("rates,ranks", [([0], [8]), ([1e-4], [0]), ([-2e-4], [8])])
def test_sweep_refuses_values_that_are_neither_real_nor_unset(rates, ranks):
    with pytest.raises(ValueError, match="-1 keeps the base config's"):
        trial_grid(rates, ranks)


def test_switches_reach_the_torchtune_yaml(tiny_llama, tiny_dataset, tmp_path):
    """On/off settings as the pipelines pass them (text): "true"/"false" set the key, "auto" keeps the base's."""
    data = tiny_dataset["train.jsonl"]
    base = resolved(tiny_llama, data, tmp_path / "base", method="lora", device="cpu")
    c = resolved(
        tiny_llama, data, tmp_path / "set", method="lora", device="cpu",
        train_on_input="true", apply_lora_to_mlp="false", enable_activation_checkpointing="auto",
    )  # fmt: skip
    assert (base["dataset"].get("train_on_input"), base["model"]["apply_lora_to_mlp"]) != (True, False)
    assert (c["dataset"]["train_on_input"], c["model"]["apply_lora_to_mlp"]) == (True, False)
    assert c.get("enable_activation_checkpointing") == base.get("enable_activation_checkpointing")
