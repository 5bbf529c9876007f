"""The typed contract between steps (components/_shared/contract.py): each kind reads and writes the metadata keys
the components write today, keeps keys it does not know, and fails naming the input and the output to connect."""

from __future__ import annotations

import pytest

from kfp_finetune.components._shared.contract import (
    BaseModel,
    DatasetSplit,
    EvalMetrics,
    EvalSamples,
    ExportedModel,
    TrainConfig,
    TunedModel,
    lower_is_better,
)
from kfp_finetune.components._shared.errors import ConfigError, ContractError

# A pipeline output of the components' test DAG (tests/support/component_pipeline.py) -> the kind it is.
KINDS = {
    "base_model": BaseModel,
    "train_data": DatasetSplit,
    "eval_data": DatasetSplit,
    "model": TunedModel,
    "train_config": TrainConfig,
    "train_metrics": EvalMetrics,
    "eval_metrics": EvalMetrics,
    "eval_samples": EvalSamples,
    "exported": ExportedModel,
}


@pytest.mark.parametrize("output", sorted(KINDS))
@pytest.mark.slow
def test_every_key_a_component_wrote_is_a_field_and_round_trips(component_pipeline_run, output):
    written = dict(component_pipeline_run.outputs[output].metadata)
    assert written, f"{output} has no metadata"
    typed = KINDS[output].from_metadata(written, input_name=output)
    assert typed.extra == {}, f"{output} wrote keys the contract does not declare: {sorted(typed.extra)}"
    assert typed.to_metadata() == written


def test_unknown_keys_survive_a_round_trip():
    written = {"workspace_path": "models/base", "repo_id": "org/m", "owner_note": {"team": "x"}, "n": [1]}
    typed = BaseModel.from_metadata(written, input_name="base_model")
    assert typed.repo_id == "org/m" and typed.extra == {"owner_note": {"team": "x"}, "n": [1]}
    assert {k: typed.to_metadata()[k] for k in written} == written
    metrics = EvalMetrics.from_metadata({"tuned_eval_loss": 1.5, "passed": 1.0, "note": "x"}, input_name="m")
    assert metrics.passed and metrics.extra == {"note": "x"}
    assert metrics.to_metadata() == {"tuned_eval_loss": 1.5, "passed": 1.0, "note": "x"}


def test_optional_keys_are_written_only_when_set():
    text = DatasetSplit(workspace_path="datasets/d/train", text_column="text").to_metadata()
    assert text["text_column"] == "text" and "conversation_column" not in text
    assert "final_loss" not in TunedModel(workspace_path="runs/r/merged").to_metadata()


def test_numbers_as_kfp_hands_them_on():
    """KFP passes metadata as a protobuf Struct: every number arrives as a float."""
    split = DatasetSplit.from_metadata({"workspace_path": "d", "num_rows": 12.0}, input_name="train_data")
    assert split.num_rows == 12 and isinstance(split.num_rows, int)
    with pytest.raises(
        ContractError, match=r"train_data's metadata key 'num_rows' should be an integer or null"
    ):
        DatasetSplit.from_metadata({"num_rows": 1.5}, input_name="train_data")


def test_a_missing_key_names_the_input_and_the_output_to_connect():
    with pytest.raises(ContractError) as raised:
        BaseModel.from_metadata({"repo_id": "org/m"}, input_name="base_model")
    assert str(raised.value) == (
        "base_model artifact has no workspace_path in its metadata: connect it to model-initialize's model output"
    )
    assert isinstance(raised.value, ConfigError)  # every component's usage_errors shows it as one line
    with pytest.raises(
        ContractError, match="eval_data artifact has no data_files .* dataset-initialize's eval output"
    ):
        DatasetSplit.from_metadata({}, input_name="eval_data").require("data_files", input_name="eval_data")
    with pytest.raises(
        ContractError, match="model artifact has no run_dir .* torchtune-finetune's model output"
    ):
        TunedModel.from_metadata({"merged_path": "runs/x/merged"}, input_name="model").require(
            "run_dir", input_name="model"
        )
    with pytest.raises(ContractError, match="connect it to export's exported output"):
        ExportedModel.from_metadata({"format": "merged"}, input_name="exported")


@pytest.mark.parametrize("empty", ["", "   ", [], {}, None])
def test_an_empty_required_key_is_a_missing_one(empty):
    """A producer that wrote a required key without a value (a user's step, a failed write) connects nothing:
    the same error as a missing key, not a path of "" that reads the workspace root."""
    with pytest.raises(
        ContractError, match="base_model artifact has no workspace_path .* model-initialize's"
    ):
        BaseModel.from_metadata({"workspace_path": empty, "repo_id": "org/m"}, input_name="base_model")
    with pytest.raises(
        ContractError, match="exported artifact has no destination .* export's exported output"
    ):
        ExportedModel.from_metadata({"destination": empty, "format": "merged"}, input_name="exported")
    if empty == []:  # a list key read only by some steps: their `require` says the same
        split = DatasetSplit.from_metadata({"data_files": empty}, input_name="eval_data")
        with pytest.raises(ContractError, match="eval_data artifact has no data_files"):
            split.require("data_files", input_name="eval_data")


def test_a_key_of_the_wrong_type_names_the_input_the_key_and_the_output():
    with pytest.raises(ContractError) as raised:
        DatasetSplit.from_metadata({"data_files": "datasets/d/train/part-0.parquet"}, input_name="train_data")
    assert str(raised.value) == (
        "train_data's metadata key 'data_files' should be a list of strings, not "
        '"datasets/d/train/part-0.parquet": connect it to dataset-initialize\'s train output'
    )
    with pytest.raises(
        ContractError, match="'merged_path' should be a string, not 3: connect it to torchtune-"
    ):
        TunedModel.from_metadata({"workspace_path": "w", "merged_path": 3}, input_name="model")
    with pytest.raises(ContractError, match="'reused_existing_copy' should be true or false"):
        BaseModel.from_metadata(
            {"workspace_path": "w", "reused_existing_copy": "yes"}, input_name="base_model"
        )


def test_a_writer_with_a_value_of_the_wrong_type_is_a_bug():
    with pytest.raises(TypeError, match=r"DatasetSplit.source_split must be a string, not None"):
        DatasetSplit(workspace_path="d", source_split=None).to_metadata()


def test_metric_direction_and_lookup():
    assert lower_is_better("eval_loss") and lower_is_better("lm_eval_wikitext_bits_per_byte")
    assert not lower_is_better("exact_match")
    metrics = EvalMetrics.from_metadata({"tuned_eval_loss": 2.0}, input_name="eval_metrics")
    assert metrics.metric("tuned_eval_loss", input_name="eval_metrics") == 2.0
    with pytest.raises(
        ContractError, match=r"eval_metrics has no metric 'tuned_rouge_l' \(it has tuned_eval_loss\)"
    ):
        metrics.metric("tuned_rouge_l", input_name="eval_metrics")
