"""Every family this project builds beyond torchtune 0.6.1 and every data shape dataset-initialize accepts go
through the whole `finetune_pipeline` under kfp.local: initialize → train (local backend, CPU) → evaluate base
and tuned → export, and transformers loads the export.

A pipeline run costs most of a minute (its steps' processes each import torch), so each run carries one family,
one method and one data shape, and the test checks all three on it:
- the family (Qwen3, Gemma 3, SmolLM2, Mistral-Nemo: families/ and hf_tokenizer.py): the export is what
  transformers computes with; the merged weights give the tuned torchtune model's logits (Gemma 3: over more
  tokens than its local layers' window), and (LoRA) PEFT's adapter on the base gives the merged model's. Every
  family and method trains in test_training.py and every adapter direction is proven in test_parity.py.
- the data shape (tests/support/data_shapes.py: the tiny task's rows as alpaca CSV, input/output under other names
  in a JSON array, alpaca JSON Lines with a per-row system prompt, ShareGPT in a folder of JSON Lines files, a
  folder of .txt files): it trains, evaluates with the prompts and references training built, and exports. Plain
  input/output JSON Lines runs in tests/support/component_pipeline.py. The pairs put the system prompt on a
  template that has a system role (Qwen3's) and the text corpus on the family with a SentencePiece tokenizer
  (Gemma 3, which issue 28 asks for with LoRA and full).

OpenAI messages in parquet become what another shape already takes through the whole pipeline (the OpenAI messages
the system-prompt shape is written as), so for it dataset-initialize's reading is checked alone.
"""

import json
import re
from pathlib import Path

import pytest

from kfp_finetune.commands.run_local import run_pipeline_locally
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.pipelines import finetune_pipeline
from tests.support.data_shapes import SHAPES, tiny_rows

ROWS = 120  # 12 held out
STEPS = 12
CODE = re.compile(r"\b[a-z] [a-z] [a-z] [a-z]\b")  # the four letters of a tiny-task prompt

READ_ALONE = {"openai-parquet": "openai"}  # shape -> written as

# Each family's layout as its export's config.json shows it (head_dim: Qwen3's and Gemma 3's above hidden / heads,
# Mistral-Nemo's below; SmolLM2: the llama3_2 builder with plain RoPE).
BUILT_HERE = {
    "qwen3": {"head_dim": 32},
    "gemma3": {"head_dim": 32},
    "smollm2": {"tie_word_embeddings": True, "rope_scaling": None},
    "mistral_nemo": {"head_dim": 8, "tie_word_embeddings": False},
}
# (family, method, data shape): every family built here, both kinds of export (LoRA: Qwen3's q/k norms,
# Mistral-Nemo's head_dim below hidden / heads; full: Gemma 3's windows, SmolLM2's tied embeddings; Gemma 3 both)
# and every shape not read alone.
RUNS = [
    ("qwen3", "lora", "system-prompt-jsonl"),
    ("gemma3", "full", "text-txt-folder"),
    ("gemma3", "lora", "column-map-json-array"),
    ("smollm2", "full", "alpaca-csv"),
    ("mistral_nemo", "lora", "sharegpt-folder"),
]


def test_the_runs_cover_every_family_built_here_and_every_shape_not_read_alone():
    assert {family for family, _, _ in RUNS} == set(BUILT_HERE)
    assert sorted(shape for _, _, shape in RUNS) == sorted(set(SHAPES) - set(READ_ALONE))


@pytest.mark.slow
@pytest.mark.parametrize(("family", "method", "shape_name"), RUNS, ids=["-".join(run) for run in RUNS])
def test_a_family_and_a_data_shape_fine_tune_through_the_pipeline_and_transformers_loads_the_export(
    family, method, shape_name, tmp_path, request
):
    tiny = request.getfixturevalue(f"tiny_{family}")
    shape = SHAPES[shape_name]
    (tmp_path / "source").mkdir()
    data_uri = shape.write(tiny_rows(ROWS), tmp_path / "source")
    destination = tmp_path / "exported"
    outputs = run_pipeline_locally(
        finetune_pipeline,
        {
            "model_uri": str(tiny),
            "data_uri": str(data_uri),
            "export_destination": str(destination),
            "export_format": "both" if method == "lora" else "merged",
            "data_type": shape.data_type,
            "data_column_map": shape.column_map,
            "data_eval_fraction": 0.1,
            "tune_method": method,
            "tune_backend": "local",
            "tune_device": "cpu",
            "tune_gpus_per_node": 0,
            "tune_learning_rate": 3e-3,
            "tune_batch_size": 8,
            "tune_max_steps_per_epoch": STEPS,
            "tune_num_warmup_steps": 0,
            "tune_overrides": {"gradient_accumulation_steps": 1},
            "tune_seed": 0,
            "eval_max_samples": 0,
            "eval_max_new_tokens": 4,
            "eval_device": "cpu",
        },
        tmp_path / "run",
    ).outputs

    trained = outputs["train_metrics"].metadata
    assert trained["steps"] == STEPS and trained["final_loss"] < trained["first_loss"]
    assert outputs["passed"] is True
    assert_the_shape_was_evaluated_as_trained(shape, outputs)
    assert_transformers_computes_the_tuned_model(family, method, tiny, destination, tmp_path)


def assert_the_shape_was_evaluated_as_trained(shape, outputs) -> None:
    evaluated = outputs["eval_metrics"].metadata
    held_out = ROWS // 10
    assert evaluated["num_samples"] == held_out
    assert evaluated["tuned_eval_loss"] < evaluated["base_eval_loss"]  # the gate export waits on
    generation = {"exact_match", "token_f1", "rouge_l"}
    for label in ("base", "tuned"):
        present = {m for m in generation if f"{label}_{m}" in evaluated}
        assert present == (generation if shape.generates else set()), (label, evaluated)

    samples = [json.loads(line) for line in Path(outputs["eval_samples"].path).read_text().splitlines()]
    assert len(samples) == held_out
    for sample in samples:
        # Prompt and reference come from the same row as training built it: the reference is that row's answer.
        (code,) = CODE.findall(sample["prompt"])
        assert sample["reference"] == (code.upper() if shape.generates else "")
        if shape.written_style == "alpaca":  # alpaca_dataset's template, as in training
            assert "### Instruction:" in sample["prompt"] and "### Response:" in sample["prompt"]


def assert_transformers_computes_the_tuned_model(family, method, tiny, destination, tmp_path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from kfp_finetune.components._shared.torchtune.checkpointer import HFCheckpointer
    from kfp_finetune.components._shared.torchtune.model_inspection import (
        find_weights,
        inspect_model_dir,
        instantiate,
    )

    tuned = inspect_model_dir(destination)
    layout = BUILT_HERE[family]
    assert tuned.family.name == family and {key: tuned.hf_config[key] for key in layout} == layout
    model = instantiate(tuned.model_node()).eval()
    checkpointer = HFCheckpointer(
        str(destination), find_weights(destination), tuned.family.model_type, str(tmp_path / "reload")
    )
    model.load_state_dict(checkpointer.load_checkpoint()["model"], strict=True)
    merged = AutoModelForCausalLM.from_pretrained(destination, dtype=torch.float32).eval()
    tokens = torch.randint(
        0, tuned.hf_config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        logits = merged(tokens).logits
        assert (model(tokens) - logits).abs().max().item() <= 1e-5
        base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
        assert (base(tokens).logits - logits).abs().max().item() > 1e-3, "the export is the tuned model"
        if method == "lora":
            adapted = PeftModel.from_pretrained(base, destination / "adapter").eval()
            assert (adapted(tokens).logits - logits).abs().max().item() <= 1e-4


@pytest.mark.slow
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
