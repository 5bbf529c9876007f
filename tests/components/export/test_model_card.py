"""The model card says which engine trained the model, and how: the transformers engine's card shows the
hyperparameters its trl_config.json records (TRL's arguments as the trainer had them, PEFT's LoraConfig), its
engine and the Hub's pipeline tag for what the model learned, not torchtune's."""

from __future__ import annotations

import pytest
import yaml

from kfp_finetune.components._shared.contract import TunedModel
from kfp_finetune.components._shared.engines import CLASSIFICATION
from kfp_finetune.components.export.model_card import CardInputs, render_card


def card_for(model: TunedModel, training_config: dict) -> tuple[dict, str]:
    text = render_card(
        CardInputs(
            title="t",
            model=model,
            format="merged",
            dtype="",
            layout={"": "merged"},
            training_config=training_config,
        )  # fmt: skip
    )
    front = yaml.safe_load(text.split("---")[1])
    return front, text


def test_a_transformers_engine_card_shows_what_trl_and_peft_trained_with(tmp_path):
    pytest.importorskip("trl")
    from kfp_finetune.components._shared.transformers.settings import SftSettings

    settings = SftSettings(model_dir=str(tmp_path), data_files=["t.parquet"], output_dir=str(tmp_path / "run"),
                           dataset_type=CLASSIFICATION, device="cpu", lora_rank=4, learning_rate=5e-5,
                           max_seq_len=256, batch_size=2)  # fmt: skip
    model = TunedModel(engine="transformers", task=CLASSIFICATION, method="lora", base_model="org/tiny-bert")
    front, text = card_for(model, settings.resolved())
    assert front["pipeline_tag"] == "text-classification" and "transformers" in front["tags"]
    assert "torchtune" not in text and "with TRL on transformers (lora" in text
    for row in ("| learning rate | 5e-05 |", "| LoRA rank | 4 |", "| batch size | 2 |", "| epochs | 1 |"):
        assert row in text, row
    assert "| max steps |" not in text  # -1: the epochs decide


def test_a_torchtune_card_reads_its_resolved_yaml():
    model = TunedModel(
        engine="torchtune", method="lora", base_model="org/tiny-llama", config="llama3_2/1B_lora"
    )
    resolved = {"optimizer": {"lr": 3e-4}, "model": {"lora_rank": 64}, "tokenizer": {"max_seq_len": 512}}
    front, text = card_for(model, resolved)
    assert front["pipeline_tag"] == "text-generation" and "torchtune" in front["tags"]
    for row in ("| learning rate | 0.0003 |", "| LoRA rank | 64 |", "| max sequence length | 512 |",
                "| base config | llama3_2/1B_lora |"):  # fmt: skip
        assert row in text, row
