"""Pre-flight names each problem by the pipeline parameter the user sets: its map from the steps' setting names
to the parameters agrees with the parameter table (which says what each parameter feeds)."""

import dataclasses

import pytest

from kfp_finetune.components._shared.torchtune.config import DatasetSettings, LoraSettings, TorchtuneConfig
from kfp_finetune.components.preflight.run_settings import (
    EVAL_PARAMETERS,
    EXPORT_PARAMETERS,
    STEP_PARAMETERS,
    RunSettings,
    check_training,
    parameter_of,
)
from kfp_finetune.pipelines.parameters import TABLE

SETTINGS = {
    f.name for cls in (TorchtuneConfig, LoraSettings, DatasetSettings) for f in dataclasses.fields(cls)
}


def _feeding(step: str) -> dict[str, str]:
    """The step's argument -> the pipeline parameter that feeds it."""
    return {feed.split(".", 1)[1]: p.name for p in TABLE for feed in p.feeds if feed.startswith(f"{step}.")}


@pytest.mark.parametrize("setting", sorted(set(_feeding("torchtune_finetune")) & SETTINGS))
def test_each_fine_tune_setting_is_named_by_the_parameter_that_feeds_it(setting):
    assert parameter_of(setting) == _feeding("torchtune_finetune")[setting]


def test_eval_and_export_settings_are_named_by_the_parameters_that_feed_them():
    assert {step: name for name, step in EVAL_PARAMETERS.items()}.items() <= _feeding("evaluate").items()
    assert {step: name for name, step in EXPORT_PARAMETERS.items()}.items() <= _feeding("export").items()


def test_preflight_is_fed_every_tune_eval_and_export_setting_it_checks():
    fed = set(_feeding("preflight").values())
    checked = {parameter_of(s) for s in set(_feeding("torchtune_finetune")) & SETTINGS}
    assert checked | set(EVAL_PARAMETERS) | set(EXPORT_PARAMETERS) | set(STEP_PARAMETERS) <= fed


def test_the_unset_values_of_every_parameter_pass_and_each_problem_is_listed():
    defaults = {p.name: p.default for p in TABLE if p.name in set(_feeding("preflight").values())}
    config, found = check_training(RunSettings(defaults))
    assert found == [] and config is not None
    _, found = check_training(RunSettings({**defaults, "tune_epochs": 0, "tune_lora_dropout": 1.5}))
    assert [f.parameter for f in found] == ["tune_epochs", "tune_lora_dropout"]
