"""The evaluate step on a transformers-engine run (components/_shared/transformers/evaluation.py through
evaluate.run_evaluate): a real TRL LoRA fine-tune of the tiny Qwen3-MoE on CPU, offline, evaluated against its base
(loss falls on rows like the training rows); the loss equals a hand computation with transformers on the response
tokens only; generations for instruct and chat rows, none for text rows; a local lm-eval task scored through
lm-eval's own HF model on the merged folder and the base."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kfp_finetune.components._shared.eval_examples import IGNORE_INDEX
from kfp_finetune.components._shared.transformers import face, train
from kfp_finetune.components._shared.transformers.settings import SftSettings
from kfp_finetune.components.evaluate.evaluate import ArtifactInput, EvalSettings, run_evaluate
from tests.support import lm_eval_task

pytest.importorskip("trl")
pytestmark = pytest.mark.slow

EVAL_ROWS = 24


@pytest.fixture(scope="module", autouse=True)
def offline_and_one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict, dict]:
    """A workspace as a pipeline leaves it: the base model, the eval split, and a finished TRL LoRA run."""
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    workspace = tmp_path_factory.mktemp("trl-eval")
    build_tiny_hf_model(workspace / "models" / "base", "qwen3_moe")
    data = build_tiny_dataset(workspace / "datasets", train_rows=160, eval_rows=EVAL_ROWS)
    summary = train.train(
        SftSettings(
            model_dir=str(workspace / "models" / "base"),
            data_files=[str(data["train.parquet"])],
            output_dir=str(workspace / "runs" / "lora"),
            max_steps=20,
            batch_size=4,
            learning_rate=3e-3,
            lora_rank=8,
            lora_alpha=16.0,
            max_seq_len=64,
            seed=3,
        )
    )
    assert summary["global_step"] == 20
    model = {
        "workspace_path": "runs/lora/merged",
        "merged_path": "runs/lora/merged",
        "adapter_path": "runs/lora/adapter",
        "run_dir": "runs/lora",
        "metrics_file": "runs/lora/logs/metrics.txt",
        "base_model_path": "models/base",
        "engine": face.NAME,
        "method": "lora",
    }
    eval_data = {
        "data_files": ["datasets/eval.parquet"],
        "num_rows": EVAL_ROWS,
        "dataset_type": "instruct",
    }
    return workspace, model, eval_data


def evaluate(workspace: Path, model: dict, eval_data: dict, name: str, **settings):
    return run_evaluate(
        workspace=workspace,
        model=ArtifactInput(dict(model)),
        eval_data=ArtifactInput(dict(eval_data)),
        base_model=None,  # the fine-tune's recorded base
        settings=EvalSettings(**{"device": "cpu", "batch_size": 8, "max_new_tokens": 8, **settings}),
        output_name=name,
    )


@pytest.fixture(scope="module")
def evaluation(trained):
    return evaluate(*trained, "lora")


def test_the_fine_tune_beats_its_base_on_rows_like_the_training_rows(evaluation):
    m = evaluation.metrics
    assert m["num_samples"] == EVAL_ROWS and m["response_tokens"] > 0
    assert m["tuned_eval_loss"] < m["base_eval_loss"] - 0.1, m
    assert evaluation.base is not None and evaluation.gate.metric == "eval_loss"
    assert (evaluation.output_dir / "samples.jsonl").is_file()


def test_generations_exist_for_instruct_rows(evaluation):
    for sample in evaluation.samples:
        assert isinstance(sample["tuned"], str) and isinstance(sample["base"], str)
        assert sample["prompt"].startswith("Uppercase:") and sample["reference"]


def hand_loss(model_dir: Path, prompt: str, answer: str, max_len: int = 64) -> float:
    """Mean NLL of the answer's tokens given the prompt, with transformers alone: the conversation tokenized with
    the model's chat template, the prompt (the user turn and the generation prompt) masked, as TRL trains."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    user = [{"role": "user", "content": prompt}]
    full = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": answer}], tokenize=True, return_dict=True
    )["input_ids"][:max_len]
    prompt_len = len(
        tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )
    assert (
        full[:prompt_len]
        == tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([full])).logits[0]
    targets = torch.tensor(full[prompt_len:])
    return F.cross_entropy(logits[prompt_len - 1 : len(full) - 1].float(), targets).item()


def test_the_loss_is_the_response_tokens_loss_computed_by_hand(evaluation, trained):
    workspace = trained[0]
    rows = pq.read_table(workspace / "datasets" / "eval.parquet").to_pylist()
    for sample in evaluation.samples[:2]:
        row = rows[sample["row"]]
        assert sample["reference"] == row["output"]
        tuned = hand_loss(workspace / "runs" / "lora" / "merged", row["input"], row["output"])
        base = hand_loss(workspace / "models" / "base", row["input"], row["output"])
        assert sample["tuned_loss"] == pytest.approx(tuned, rel=1e-4)
        assert sample["base_loss"] == pytest.approx(base, rel=1e-4)


def test_examples_are_masked_and_prompted_as_training_masked_them(trained):
    """The eval rows come out of TRL's own preparation: the trained tokens are the answer (after the template's empty
    think block) and the end of turn; generation starts where the answer's text begins."""
    workspace, model, eval_data = trained
    model_eval = face.evaluation()
    config = face.read_resolved_config(workspace / model["run_dir"])
    files = [str(workspace / f) for f in eval_data["data_files"]]
    merged = model_eval.inspect_model(workspace / model["merged_path"], "model")
    tokenizer = model_eval.load_tokenizer(merged, None, config)
    data = model_eval.eval_dataset(config, ArtifactInput(dict(eval_data)), files, None)
    dataset = model_eval.build_dataset(data, tokenizer)
    assert len(dataset) == EVAL_ROWS
    for example in model_eval.make_examples(dataset, tokenizer, [0, 5]):
        first = next(i for i, label in enumerate(example.labels) if label != IGNORE_INDEX)
        assert example.labels[:first] == [IGNORE_INDEX] * first
        trained_text = tokenizer.decode([t for t in example.labels if t != IGNORE_INDEX])
        assert trained_text.removeprefix("<think>\n\n</think>\n\n").startswith(
            example.reference + "<|im_end|>"
        )
        answer = tokenizer.decode(example.tokens[len(example.prompt_tokens) :])
        assert answer.startswith(example.reference + "<|im_end|>"), answer
        assert example.tokens[: len(example.prompt_tokens)] == example.prompt_tokens


def test_text_rows_have_no_generations_and_chat_rows_do(trained, tmp_path):
    """Without the run's config (a model this library did not train) the rows follow eval_data's dataset type: text
    rows are scored on every token and generate nothing; chat rows generate the last assistant turn."""
    workspace, model, _ = trained
    untracked = {k: v for k, v in model.items() if k != "run_dir"}
    pq.write_table(
        pa.Table.from_pylist([{"body": "hello world"}, {"body": "a b c d e f"}]),
        workspace / "datasets" / "text.parquet",
    )
    text = evaluate(
        workspace,
        untracked,
        {
            "data_files": ["datasets/text.parquet"],
            "num_rows": 2,
            "dataset_type": "text",
            "text_column": "body",
        },
        "text",
    )
    assert [s["tuned"] for s in text.samples] == [None, None]
    assert all(s["tuned_loss"] is not None and s["prompt"] for s in text.samples)
    assert "tuned_exact_match" not in text.metrics and text.metrics["response_tokens"] > 0

    conversation = [
        {"role": "user", "content": "Uppercase: a b c d"},
        {"role": "assistant", "content": "A B C D"},
        {"role": "user", "content": "Uppercase: e f g h"},
        {"role": "assistant", "content": "E F G H"},
    ]
    pq.write_table(
        pa.Table.from_pylist([{"conversation": conversation}] * 2), workspace / "datasets" / "chat.parquet"
    )
    chat = evaluate(
        workspace,
        untracked,
        {
            "data_files": ["datasets/chat.parquet"],
            "num_rows": 2,
            "dataset_type": "chat",
            "conversation_column": "conversation",
        },
        "chat",
    )
    assert all(isinstance(s["tuned"], str) for s in chat.samples)
    assert [(s["prompt"], s["reference"]) for s in chat.samples] == [("Uppercase: e f g h", "E F G H")] * 2


def test_an_lm_eval_task_scores_the_fine_tune_below_its_base_in_perplexity(trained, tmp_path):
    """lm-eval 0.4.13's HF model beside transformers 5 loads the merged folder and the base; the gate reads its
    metric with the interval from lm-eval's standard errors."""
    pytest.importorskip(
        "lm_eval.models.huggingface", reason="kfp-finetune[lm-eval-transformers] (make setup)"
    )
    workspace, model, eval_data = trained
    tasks_dir = lm_eval_task.write_task(
        tmp_path / "tasks", workspace / "datasets" / "eval.jsonl", datasets_cache=tmp_path / "datasets-cache"
    )
    result = evaluate(
        workspace,
        model,
        eval_data,
        "lm-eval",
        max_samples=4,
        lm_eval_tasks=[lm_eval_task.TASK],
        lm_eval_limit=20,
        lm_eval_include_path=str(tasks_dir),
        gate_metric=lm_eval_task.GATE_METRIC,
    )
    m = result.metrics
    assert {
        f"tuned_{lm_eval_task.GATE_METRIC}",
        "tuned_lm_eval_kfp_tiny_acc",
        "base_lm_eval_kfp_tiny_acc",
    } <= set(m)
    assert m[f"tuned_{lm_eval_task.GATE_METRIC}"] < m[f"base_{lm_eval_task.GATE_METRIC}"], m
    assert result.gate.metric == lm_eval_task.GATE_METRIC and result.gate.interval is not None
    low, high = result.gate.interval.low, result.gate.interval.high
    assert low < result.gate.improvement < high and result.gate.passed == (low > 0)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ({"dataset_type": "instruct", "data_style": "alpaca"}, ("instruct", "alpaca", {})),
        (
            {"dataset_type": "chat", "data_style": "sharegpt", "conversation_column": "conversations"},
            ("chat", "sharegpt", {"messages": "conversations"}),
        ),
    ],
)
def test_without_a_training_config_the_rows_are_read_as_dataset_initialize_wrote_them(metadata, expected):
    data = face.evaluation().eval_dataset({}, ArtifactInput(metadata), ["/eval/part-0.parquet"], 64)
    assert (data.dataset_type, data.data_style, data.column_map) == expected
    assert (data.data_files, data.max_seq_len) == (["/eval/part-0.parquet"], 64)
