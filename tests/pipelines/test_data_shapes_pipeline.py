"""Every data shape dataset-initialize accepts goes through the whole `finetune_pipeline` under kfp.local on the
tiny model: initialize → train (LoRA, local backend, CPU) → evaluate base and tuned → export.

The shapes (tests/support/data_shapes.py) are the tiny task's rows written as alpaca CSV; input/output under
other names in a JSON array (column_map); alpaca JSON Lines with a per-row system prompt (written as OpenAI
messages); OpenAI messages in parquet; ShareGPT in a folder of JSON Lines files; and a folder of .txt files.
Plain input/output JSON Lines runs in tests/support/component_pipeline.py. Each run is cheap (a few LoRA steps, a
few eval samples, short generations); the tiny model is built once per session.

Two shapes become what another already takes through the whole pipeline: the renamed input/output columns are
written as plain input/output rows (the component pipeline's), and OpenAI messages in parquet as the OpenAI
messages the system-prompt shape is written as. For those two, dataset-initialize's reading is checked alone.
"""

import json
import re
from pathlib import Path

import pytest

from kfp_finetune.commands.run_local import run_pipeline_locally
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.pipelines import finetune_pipeline
from tests.support.data_shapes import SHAPES, tiny_rows

pytestmark = pytest.mark.slow

ROWS = 120  # 12 held out
STEPS = 8
EVAL_SAMPLES = 4
CODE = re.compile(r"\b[a-z] [a-z] [a-z] [a-z]\b")  # the four letters of a tiny-task prompt


READ_ALONE = {"column-map-json-array": "input_output", "openai-parquet": "openai"}  # shape -> written as
THROUGH_THE_PIPELINE = [shape for name, shape in SHAPES.items() if name not in READ_ALONE]


@pytest.mark.parametrize("shape", THROUGH_THE_PIPELINE, ids=lambda shape: shape.name)
def test_data_shape_trains_evaluates_and_exports(shape, tiny_llama, tmp_path):
    (tmp_path / "source").mkdir()
    data_uri = shape.write(tiny_rows(ROWS), tmp_path / "source")
    destination = tmp_path / "exported"
    outputs = run_pipeline_locally(
        finetune_pipeline,
        {
            "model_uri": str(tiny_llama),
            "data_uri": str(data_uri),
            "export_destination": str(destination),
            "export_overwrite": True,
            "data_type": shape.data_type,
            "data_column_map": shape.column_map,
            "data_eval_fraction": 0.1,
            "tune_backend": "local",
            "tune_device": "cpu",
            "tune_gpus_per_node": 0,
            "tune_learning_rate": 3e-3,
            "tune_batch_size": 8,
            "tune_max_steps_per_epoch": STEPS,
            "tune_num_warmup_steps": 0,
            "tune_overrides": {"gradient_accumulation_steps": 1},
            "tune_seed": 0,
            "eval_max_samples": EVAL_SAMPLES,
            "eval_max_new_tokens": 4,
            "eval_device": "cpu",
        },
        tmp_path / "run",
    ).outputs

    trained = outputs["train_metrics"].metadata
    assert trained["steps"] == STEPS and trained["final_loss"] < trained["first_loss"]

    evaluated = outputs["eval_metrics"].metadata
    assert evaluated["num_samples"] == EVAL_SAMPLES
    assert evaluated["tuned_eval_loss"] < evaluated["base_eval_loss"]  # the gate export waits on
    generation = {"exact_match", "token_f1", "rouge_l"}
    for label in ("base", "tuned"):
        present = {m for m in generation if f"{label}_{m}" in evaluated}
        assert present == (generation if shape.generates else set()), (label, evaluated)

    samples = [json.loads(line) for line in Path(outputs["eval_samples"].path).read_text().splitlines()]
    assert len(samples) == EVAL_SAMPLES
    for sample in samples:
        # Prompt and reference come from the same row as training built it: the reference is that row's answer.
        (code,) = CODE.findall(sample["prompt"])
        assert sample["reference"] == (code.upper() if shape.generates else "")
        if shape.written_style == "alpaca":  # alpaca_dataset's template, as in training
            assert "### Instruction:" in sample["prompt"] and "### Response:" in sample["prompt"]

    assert outputs["passed"] is True
    assert (destination / "config.json").is_file() and list(destination.glob("*.safetensors"))


@pytest.mark.parametrize("name", list(READ_ALONE))
def test_data_shape_is_written_as_a_shape_the_pipeline_runs(name, tmp_path):
    shape = SHAPES[name]
    (tmp_path / "source").mkdir()
    data_uri = shape.write(tiny_rows(ROWS), tmp_path / "source")
    result = initialize_dataset(
        str(data_uri), str(tmp_path / "workspace"), dataset_type=shape.data_type, column_map=shape.column_map,
        eval_fraction=0.1,
    )  # fmt: skip
    train, held_out = result.train_metadata, result.eval_metadata
    assert train["data_style"] == shape.written_style == READ_ALONE[name]
    assert train["num_rows"] + held_out["num_rows"] == ROWS
    assert train["dataset_type"] == ("chat" if shape.written_style == "openai" else "instruct")
