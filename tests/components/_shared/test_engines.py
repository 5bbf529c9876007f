"""The engine choice (_shared/engines.py): the first engine whose wing serves the model, or the one named; every
engine's reason when none does."""

from __future__ import annotations

import json

import pytest

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.errors import ConfigError


def _config(model_dir) -> dict:
    return json.loads((model_dir / "config.json").read_text())


def test_auto_chooses_torchtune_for_a_family_it_serves_and_says_why(tiny_llama):
    choice = engines.choose(tiny_llama, _config(tiny_llama))
    assert choice.engine == "torchtune"
    assert (
        choice.line()
        == "engine: torchtune (torchtune serves the llama3_2 family; the first engine that serves it)"
    )


def test_a_named_engine_is_taken_when_it_serves_the_model(tiny_llama):
    choice = engines.choose(tiny_llama, _config(tiny_llama), requested="torchtune")
    assert choice.reason.endswith("chosen by the engine setting")


def test_auto_chooses_the_engine_that_serves_what_torchtune_cannot(tiny_llama):
    choice = engines.choose(tiny_llama, {**_config(tiny_llama), "model_type": "qwen3_moe"})
    assert choice.engine == "transformers"
    assert choice.reason.endswith(
        "has Qwen3MoeForCausalLM for model_type 'qwen3_moe'; the first engine that serves it"
    )


def test_classification_data_chooses_the_engine_that_trains_a_classifier(tiny_llama):
    """torchtune serves the Llama family, but its recipes train text generation only: a classifier of the same
    model is trained by the transformers engine, and naming torchtune is refused with why."""
    assert engines.task_of("classification") == engines.CLASSIFICATION
    assert engines.task_of("instruct") == engines.task_of(None) == engines.GENERATION
    choice = engines.choose(tiny_llama, _config(tiny_llama), task=engines.task_of("classification"))
    assert (choice.engine, choice.task) == ("transformers", "classification")
    assert "LlamaForSequenceClassification" in choice.reason
    with pytest.raises(
        ConfigError, match="torchtune's recipes train text generation only, not classification"
    ):
        engines.choose(tiny_llama, _config(tiny_llama), requested="torchtune", task="classification")


def test_a_named_engine_that_cannot_serve_the_model_is_refused_with_its_reason(tiny_llama):
    with pytest.raises(
        ConfigError, match=r"^no engine can fine-tune this model. torchtune: .*model_type 'qwen3_moe'"
    ):
        engines.choose(tiny_llama, {**_config(tiny_llama), "model_type": "qwen3_moe"}, requested="torchtune")


def test_a_model_no_engine_serves_is_refused_with_each_engines_reason(tiny_llama):
    config = {**_config(tiny_llama), "model_type": "made_up_lm"}
    with pytest.raises(ConfigError) as refused:
        engines.choose(tiny_llama, config)
    message = str(refused.value)
    assert message.startswith("no engine can fine-tune this model. torchtune: ")
    assert (
        "; transformers: transformers " in message
        and "no causal-LM class for model_type 'made_up_lm'" in message
    )


def test_an_unknown_engine_setting_names_the_choices(tiny_llama):
    with pytest.raises(
        ConfigError, match=r"tune_engine=.trl. is not an engine: set one of auto, torchtune, transformers"
    ):
        engines.choose(tiny_llama, _config(tiny_llama), requested="trl")


def test_the_model_config_is_read_or_refused_naming_the_file(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        engines.model_config(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(ConfigError, match="config.json must hold one JSON object"):
        engines.model_config(tmp_path)
