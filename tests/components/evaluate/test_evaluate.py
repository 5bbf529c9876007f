"""The evaluate step: scores and gate as plain functions, then real runs on the tiny model fine-tuned on the
synthetic task (tuned must beat base on loss and exact match), determinism, the report, bad inputs."""

import json
import math
import os
import shutil
import subprocess
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kfp_finetune.components._shared.html_report import escape
from kfp_finetune.components._shared.torchtune import sample_packing
from kfp_finetune.components._shared.torchtune.config import ConfigError, TorchtuneConfig
from kfp_finetune.components._shared.torchtune.eval_inputs import LM_EVAL_BEYOND, check_columns, dataset_node
from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
from kfp_finetune.components.evaluate import scoring
from kfp_finetune.components.evaluate.confidence import Interval
from kfp_finetune.components.evaluate.evaluate import (
    ArtifactInput,
    EvalSettings,
    lm_eval_folder,
    pick_rows,
    run_evaluate,
    tuned_model,
)
from kfp_finetune.tiny import RECOMMENDED_TRAINING
from kfp_finetune.tiny.dataset import PROMPT_PREFIX
from tests.support import lm_eval_task

# The tiny kit's recommended full fine-tune (kfp_finetune.tiny.RECOMMENDED_TRAINING): it reaches exact matches on
# held-out rows, which LoRA on a random base does not within minutes.
_FULL = RECOMMENDED_TRAINING["full"]
TRAINING = {
    "method": "full",
    "epochs": 1,
    "max_steps_per_epoch": _FULL["max_steps_per_epoch"],
    "batch_size": _FULL["batch_size"],
    "learning_rate": _FULL["lr"],
    "num_warmup_steps": _FULL["num_warmup_steps"],
}

# --- plain functions ---------------------------------------------------------------------------------------


def test_generation_scores():
    assert scoring.exact_match(" c  b a\n", "c b a") == 1.0
    assert scoring.exact_match("c b", "c b a") == 0.0
    assert scoring.token_f1("a b c", "c b a") == 1.0  # bag of words: order does not count
    assert scoring.rouge_l("a b c", "c b a") == pytest.approx(1 / 3)  # longest common subsequence: it does
    assert scoring.rouge_l("c b a", "c b a") == 1.0
    assert scoring.token_f1("x y", "c b a") == 0.0
    assert scoring.token_f1("", "") == 1.0 and scoring.rouge_l("", "a") == 0.0


def interval(low: float, high: float, examples: int = 100) -> Interval:
    return Interval(low, high, confidence=0.95, examples=examples, method="paired bootstrap, 2000 resamples")


CLEAR = interval(1.5, 2.5)  # around eval_loss's drop of 2.0 below, well above 0


def test_quality_gate_directions_thresholds_and_errors():
    tuned = {"eval_loss": 1.0, "exact_match": 0.4}
    base = {"eval_loss": 3.0, "exact_match": 0.1}
    gate = scoring.quality_gate(tuned, base, "eval_loss", 0.0, {}, interval=CLEAR)
    assert gate.passed and gate.improvement == 2.0 and gate.interval == CLEAR  # loss fell by 2.0
    assert gate.summary == (
        "passed: eval_loss improved by 2 (tuned 1 vs base 3, lower is better), 95% CI [1.5, 2.5] above 0 — more "
        "than the eval set's noise (100 examples)"
    )
    gate = scoring.quality_gate(tuned, base, "exact_match", 0.3, {}, interval=interval(0.2, 0.4))
    assert gate.passed and gate.improvement == pytest.approx(0.3)
    worse = scoring.quality_gate(base, tuned, "exact_match", 0.0, {}, interval=interval(-0.4, -0.2))
    assert not worse.passed and worse.summary.startswith("failed: exact_match did not improve: -0.3")
    assert scoring.quality_gate(
        tuned, base, "eval_loss", 0, {"exact_match": 0.4, "eval_loss": 1.0}, interval=CLEAR
    ).passed
    assert not scoring.quality_gate(tuned, base, "eval_loss", 0, {"exact_match": 0.5}, interval=CLEAR).passed
    assert not scoring.quality_gate(tuned, base, "eval_loss", 0, {"eval_loss": 0.9}, interval=CLEAR).passed
    no_base = scoring.quality_gate(tuned, None, "eval_loss", 5.0, {})
    assert no_base.passed and no_base.improvement is None and no_base.reasons[0].startswith("SKIP")
    with pytest.raises(ConfigError, match="gate_metric 'accuracy'.*exact_match"):
        scoring.quality_gate(tuned, base, "accuracy", 0, {})
    with pytest.raises(ConfigError, match="thresholds name unknown metric.*bleu"):
        scoring.quality_gate(tuned, base, "eval_loss", 0, {"bleu": 0.3})


def test_an_improvement_within_the_eval_sets_noise_fails():
    tuned, base = {"eval_loss": 1.4988}, {"eval_loss": 1.5}
    gate = scoring.quality_gate(tuned, base, "eval_loss", 0.0, {}, interval=interval(-0.004, 0.006, 40))
    assert not gate.passed and gate.improvement == pytest.approx(0.0012)
    assert gate.summary == (
        "failed: eval_loss improved by 0.0012 (tuned 1.499 vs base 1.5, lower is better), 95% CI [-0.004, 0.006] "
        "includes 0 — within the eval set's noise (40 examples)"
    )
    # Strictly above 0: a lower bound of exactly 0 is not evidence, and neither is no interval at all.
    assert not scoring.quality_gate(tuned, base, "eval_loss", 0.0, {}, interval=interval(0.0, 0.003)).passed
    unmeasured = scoring.quality_gate(tuned, base, "eval_loss", 0.0, {}, no_interval_reason="only 1 example")
    assert not unmeasured.passed and unmeasured.summary.endswith("but only 1 example")


def test_no_improvement_fails_whatever_the_interval_and_min_improvement():
    """An unchanged model (every delta +0.0000) is never published, however low eval_min_improvement is."""
    same = {"eval_loss": 1.5, "exact_match": 0.2}
    for min_improvement in (0.0, -1000.0):
        gate = scoring.quality_gate(same, same, "eval_loss", min_improvement, {}, interval=interval(0.0, 0.0))
        assert not gate.passed and gate.summary.startswith("failed: eval_loss did not improve: +0 ")


def test_min_improvement_applies_on_top_of_the_evidence():
    tuned, base = {"exact_match": 0.75}, {"exact_match": 0.5}
    clear = interval(0.15, 0.35)
    assert scoring.quality_gate(tuned, base, "exact_match", 0.25, {}, interval=clear).passed
    short = scoring.quality_gate(tuned, base, "exact_match", 0.3, {}, interval=clear)
    assert not short.passed
    assert short.summary == "failed: improvement +0.25, required >= 0.3 (eval_min_improvement)"
    assert short.reasons[0].startswith("PASS: exact_match improved by 0.25")  # the evidence itself held


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_quality_gate_never_passes_on_a_non_finite_metric(bad):
    """NaN compares False both ways, so without an explicit check a diverged model's eval_loss would pass a gate
    without a base (nothing compared) and -inf would pass any loss maximum."""
    tuned, base = {"eval_loss": bad, "exact_match": 0.4}, {"eval_loss": 3.0, "exact_match": 0.1}
    for gate in (
        scoring.quality_gate(tuned, None, "eval_loss", 0.0, {}),
        scoring.quality_gate(tuned, base, "eval_loss", -100.0, {}, interval=CLEAR),
        scoring.quality_gate(tuned, None, "exact_match", 0.0, {"eval_loss": 5.0}),
    ):
        assert not gate.passed
        assert f"FAIL: eval_loss of the tuned model is {bad}, not a finite number" in gate.reasons[0]
    nan_base = scoring.quality_gate(
        {"eval_loss": 1.0}, {"eval_loss": math.nan}, "eval_loss", -1.0, {}, interval=interval(-1.0, 1.0)
    )
    assert not nan_base.passed and nan_base.reasons[0].startswith("FAIL: eval_loss of the base model is nan")
    assert scoring.quality_gate(
        {"eval_loss": 1.0, "exact_match": math.nan}, None, "eval_loss", 0.0, {}
    ).passed


def test_rows_are_a_seeded_subset():
    assert pick_rows(5, 0, 0) == [0, 1, 2, 3, 4]
    assert pick_rows(100, 10, 7) == pick_rows(100, 10, 7) != pick_rows(100, 10, 8)
    assert len(set(pick_rows(100, 10, 7))) == 10


@pytest.mark.parametrize("packed_by", ["torchtune", "sample_packing"])
def test_dataset_node_keeps_training_columns_and_masks_the_prompt(packed_by):
    """From the run's node as resolved before and since its torchtune packing went through sample_packing.py."""
    training = {
        "_component_": "torchtune.datasets.instruct_dataset",
        "source": "json",
        "data_files": ["/train.jsonl"],
        "column_map": {"input": "question"},
        "train_on_input": True,
        "packed": True,
        "new_system_prompt": "Be brief.",
    }
    trained = {"dataset": sample_packing.wrap(training) if packed_by == "sample_packing" else training}
    node = dataset_node(trained, ArtifactInput({}), ["/ws/eval/part-0.parquet"])
    assert node == {
        "_component_": "torchtune.datasets.instruct_dataset",
        "source": "parquet",
        "data_files": ["/ws/eval/part-0.parquet"],
        "split": "train",
        "column_map": {"input": "question"},
        "train_on_input": False,
        "packed": False,
        "new_system_prompt": "Be brief.",
    }
    chat = dataset_node({}, ArtifactInput({"dataset_type": "chat", "conversation_style": "sharegpt",
                                           "conversation_column": "conversations"}), ["/e.parquet"])  # fmt: skip
    assert chat["_component_"] == "torchtune.datasets.chat_dataset"
    assert (chat["conversation_style"], chat["conversation_column"]) == ("sharegpt", "conversations")


ALPACA_ROWS = [
    {"instruction": "Uppercase:", "input": "c a t s", "output": "C A T S"},
    {"instruction": "Uppercase: d o g s", "input": "", "output": "D O G S"},
]


@pytest.mark.parametrize(
    "train_config",
    [
        {
            "dataset": {
                "_component_": "torchtune.datasets.alpaca_dataset",
                "source": "parquet",
                "data_files": ["/train.parquet"],
                "split": "train",
                "train_on_input": True,
            }
        },  # fmt: skip
        {},  # a model not trained by this library: the builder comes from eval_data's data_style
    ],
    ids=["from-training", "from-eval-data"],
)
def test_alpaca_eval_examples_are_built_as_training_builds_them(tmp_path, tiny_llama, train_config):
    """Alpaca data trains with torchtune's alpaca_dataset (its prompt template); evaluate builds the same
    examples: template in the prompt, loss on the response only, the output as the generation reference."""
    from torchtune.data import CROSS_ENTROPY_IGNORE_IDX

    from kfp_finetune.components._shared.torchtune import evaluation as model_eval
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir

    files = [str(tmp_path / "eval.parquet")]
    pq.write_table(pa.Table.from_pylist(ALPACA_ROWS), files[0])
    meta = ArtifactInput({"dataset_type": "instruct", "data_style": "alpaca"})
    node = dataset_node(train_config, meta, files)
    assert node["_component_"] == "torchtune.datasets.alpaca_dataset" and node["train_on_input"] is False
    check_columns(node, files)

    tokenizer = model_eval.load_tokenizer(inspect_model_dir(tiny_llama), None)
    dataset = model_eval.build_dataset(node, tokenizer)
    examples = model_eval.make_examples(dataset, tokenizer, [0, 1])
    for example, row in zip(examples, ALPACA_ROWS, strict=True):
        assert example.reference == row["output"]
        assert "### Instruction:" in example.prompt and row["instruction"] in example.prompt
        assert row["input"] in example.prompt
        # Generation starts where the answer's text starts in the training sequence.
        answer = example.tokens[len(example.prompt_tokens) :]
        assert example.tokens[: len(example.prompt_tokens)] == example.prompt_tokens
        assert model_eval.decode(tokenizer, answer).strip() == row["output"]
        assert "### Response:" in model_eval.decode(tokenizer, example.prompt_tokens)
        trained = [t for t in example.labels if t != CROSS_ENTROPY_IGNORE_IDX]  # the response only
        assert model_eval.decode(tokenizer, trained).strip() == row["output"]

    pq.write_table(pa.Table.from_pylist([{"input": "c a t s", "output": "C A T S"}]), files[0])
    with pytest.raises(
        ConfigError, match="lacks the instruction column 'instruction' that training's .*alpaca"
    ):
        check_columns(node, files)


# --- real runs ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_llama, tiny_dataset):
    """A workspace as a pipeline leaves it: base model, eval split, and a finished fine-tune run of the tiny
    model on the synthetic task (finalized into merged/ + adapter/ like torchtune-finetune does)."""
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
    from kfp_finetune.components.torchtune_finetune.backends.local import run_local
    from kfp_finetune.components.torchtune_finetune.outputs import finalize_checkpoint

    workspace = tmp_path_factory.mktemp("eval-workspace")
    shutil.copytree(tiny_llama, workspace / "models" / "base")
    data_dir = workspace / "datasets" / "tiny" / "eval"
    data_dir.mkdir(parents=True)
    shutil.copy(tiny_dataset["eval.parquet"], data_dir / "part-00000.parquet")

    cfg = TorchtuneConfig(device="cpu", gradient_accumulation_steps=1, seed=0)
    for key, value in TRAINING.items():
        setattr(cfg, key, value)
    run = resolve_run(
        cfg, workspace / "models" / "base", tiny_dataset["train.parquet"], workspace / "runs" / "ft"
    )
    run_local(tune_command(run.recipe, run.yaml_path), echo=lambda _: None)
    finalize_checkpoint(run.run_dir, method=cfg.method, base_model="tiny")
    model = {
        "workspace_path": "runs/ft/merged",
        "merged_path": "runs/ft/merged",
        "adapter_path": "",
        "run_dir": "runs/ft",
        "metrics_file": "runs/ft/logs/metrics.txt",
        "base_model_path": "models/base",
    }
    eval_data = {
        "workspace_path": "datasets/tiny/eval",
        "data_files": ["datasets/tiny/eval/part-00000.parquet"],
        "num_rows": 100,
        "dataset_type": "instruct",
        "columns": ["input", "output"],
    }
    return workspace, model, eval_data


def evaluate_in(trained, name: str, base: bool = True, **settings):
    workspace, model, eval_data = trained
    return run_evaluate(
        workspace=workspace,
        model=ArtifactInput(dict(model)),
        eval_data=ArtifactInput(dict(eval_data)),
        base_model=ArtifactInput({"workspace_path": "models/base"}) if base else None,
        settings=EvalSettings(**{"max_new_tokens": 12, "batch_size": 16, **settings}),
        output_name=name,
    )


@pytest.fixture(scope="module")
def evaluation(trained):
    return evaluate_in(trained, "full", max_samples=0, gate_metric="exact_match")


@pytest.mark.slow
def test_fine_tuning_helped(evaluation):
    m = evaluation.metrics
    print({k: round(v, 4) for k, v in m.items()})  # the measured numbers, for the record (pytest -s)
    assert m["num_samples"] == 100
    assert m["tuned_eval_loss"] < m["base_eval_loss"] - 1.0
    assert m["tuned_perplexity"] == pytest.approx(math.exp(m["tuned_eval_loss"]))
    assert m["tuned_exact_match"] > m["base_exact_match"]
    assert m["delta_exact_match"] == pytest.approx(m["tuned_exact_match"] - m["base_exact_match"])
    assert m["tuned_rouge_l"] > m["base_rouge_l"]
    assert m["passed"] == 1.0 and evaluation.gate.passed


@pytest.mark.slow
def test_outputs_in_the_workspace_samples_and_report(evaluation, trained):
    workspace = trained[0]
    assert evaluation.output_dir == workspace / "eval" / "full"
    lines = (evaluation.output_dir / "samples.jsonl").read_text().splitlines()
    assert len(lines) == 100 and evaluation.samples_metadata["num_rows"] == 100
    first = json.loads(lines[0])
    assert first["prompt"].startswith(PROMPT_PREFIX) and first["reference"]
    assert {"tuned", "base", "tuned_loss", "base_loss", "tuned_exact_match"} <= set(first)
    matches = [json.loads(line)["tuned_exact_match"] for line in lines]
    assert sum(matches) / len(matches) == pytest.approx(evaluation.metrics["tuned_exact_match"])

    html = (evaluation.output_dir / "report.html").read_text()
    assert html == evaluation.report_html
    for key in ("tuned_eval_loss", "base_eval_loss", "tuned_exact_match", "base_exact_match"):
        assert f"{evaluation.metrics[key]:.4g}" in html, key
    assert "PASSED" in html and "training loss" in html and "<svg" in html
    low, high = (evaluation.metrics[f"exact_match_improvement_ci_{end}"] for end in ("low", "high"))
    assert 0 < low <= evaluation.metrics["delta_exact_match"] <= high
    assert "improvement, 95% CI" in html and f"[{low:+.4g}, {high:+.4g}]" in html
    assert PROMPT_PREFIX in html  # the sample table
    assert "<script" not in html and 'src="http' not in html


@pytest.mark.slow
def test_same_seed_same_results(trained):
    first = evaluate_in(trained, "again-1", max_samples=12, seed=3)
    second = evaluate_in(trained, "again-2", max_samples=12, seed=3)
    different = {k for k in first.metrics if k != "wall_seconds" and first.metrics[k] != second.metrics[k]}
    assert not different
    assert first.samples == second.samples
    assert [s["row"] for s in first.samples] == pick_rows(100, 12, 3)


@pytest.mark.slow
def test_gate_flips_with_the_threshold(trained):
    workspace, model, eval_data = trained
    alone = {k: v for k, v in model.items() if k != "base_model_path"}  # no base: only thresholds decide

    def gate(name: str, **settings):
        return run_evaluate(
            workspace=workspace,
            model=ArtifactInput(dict(alone)),
            eval_data=ArtifactInput(dict(eval_data)),
            base_model=None,
            settings=EvalSettings(max_samples=20, max_new_tokens=12, batch_size=20, **settings),
            output_name=name,
        )

    first = gate("gate-measure", gate_metric="eval_loss")
    assert first.base is None and first.gate.passed and first.gate.improvement is None
    loss = first.metrics["tuned_eval_loss"]
    ok = gate("gate-ok", gate_metric="eval_loss", thresholds={"eval_loss": loss * 1.01})
    assert ok.gate.passed and ok.metrics["passed"] == 1.0 and "PASSED" in ok.report_html
    failed = gate("gate-fail", gate_metric="eval_loss", thresholds={"eval_loss": loss * 0.99})
    assert not failed.gate.passed and failed.metrics["passed"] == 0.0 and "FAILED" in failed.report_html


@pytest.mark.slow
def test_min_improvement_and_the_recorded_base(trained, evaluation):
    # base_model not connected: the fine-tune's recorded base_model_path is compared with.
    settings = {"base": False, "max_samples": 0, "gate_metric": "exact_match"}
    gain = evaluation.metrics["delta_exact_match"]
    enough = evaluate_in(trained, "improve-ok", min_improvement=gain, **settings)
    assert (
        enough.base is not None
        and enough.metrics["base_exact_match"] == evaluation.metrics["base_exact_match"]
    )
    assert enough.gate.passed and enough.gate.improvement == pytest.approx(gain)
    too_much = evaluate_in(trained, "improve-fail", min_improvement=gain + 0.01, **settings)
    assert not too_much.gate.passed


def weights(folder) -> dict:
    from safetensors.torch import load_file

    return {k: v for path in sorted(folder.glob("model*.safetensors")) for k, v in load_file(path).items()}


@pytest.mark.slow
def test_adapter_only_model_matches_its_merged_weights(tiny_llama, tiny_dataset, tmp_path, log_lines):
    """Adapter runs hand on only the adapter: evaluate rebuilds base + adapter as the LoRA recipe does, which must
    score like the merged weights torchtune writes for the same run (asked for: save_adapter_weights_only=False);
    the base is that model with its adapter disabled, scoring exactly as the base loaded on its own; its lm-eval
    tasks read the adapter merged into the base, which equals torchtune's merged weights."""
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command
    from kfp_finetune.components.torchtune_finetune.backends.local import run_local
    from kfp_finetune.components.torchtune_finetune.outputs import finalize_checkpoint

    workspace = tmp_path / "workspace"
    shutil.copytree(tiny_llama, workspace / "models" / "base")
    (workspace / "datasets").mkdir()
    shutil.copy(tiny_dataset["eval.parquet"], workspace / "datasets" / "eval.parquet")
    cfg = TorchtuneConfig(
        method="lora",
        device="cpu",
        batch_size=8,
        max_steps_per_epoch=20,
        learning_rate=3e-3,
        seed=0,
        save_adapter_weights_only=False,
    )
    run = resolve_run(
        cfg, workspace / "models" / "base", tiny_dataset["train.parquet"], workspace / "runs" / "lora"
    )
    run_local(tune_command(run.recipe, run.yaml_path), echo=lambda _: None)
    finalize_checkpoint(run.run_dir, method="lora", base_model="tiny")

    def score(model: dict, base: dict | None = {"workspace_path": "models/base"}):  # noqa: B006
        return run_evaluate(
            workspace=workspace,
            model=ArtifactInput({"run_dir": "runs/lora", **model}),
            eval_data=ArtifactInput({"data_files": ["datasets/eval.parquet"], "num_rows": 100}),
            base_model=ArtifactInput(base) if base else None,
            settings=EvalSettings(max_samples=16, batch_size=16, max_new_tokens=6),
            output_name="adapter",
        )

    merged = score({"workspace_path": "runs/lora/merged", "merged_path": "runs/lora/merged"})
    adapter_only = {
        "workspace_path": "runs/lora/adapter",
        "merged_path": "",
        "adapter_path": "runs/lora/adapter",
    }
    log_lines.clear()
    applied = score(adapter_only)
    assert applied.metrics["tuned_eval_loss"] == pytest.approx(merged.metrics["tuned_eval_loss"], rel=1e-4)
    assert applied.metrics["tuned_eval_loss"] < applied.metrics["base_eval_loss"]
    assert any("its adapter disabled" in line for line in log_lines)
    for label in ("base", "base_loss"):
        assert [s[label] for s in applied.samples] == [s[label] for s in merged.samples]
    assert applied.metrics["base_eval_loss"] == merged.metrics["base_eval_loss"]
    with pytest.raises(
        ConfigError, match="model is a LoRA adapter without merged weights.*connect base_model"
    ):
        score(adapter_only, base=None)

    # lm-eval's folder (torchtune's eleuther_eval loads no adapter): merged after training, as torchtune merges
    shutil.rmtree(run.run_dir / "merged")  # finalize linked torchtune's; the merge must build its own
    base_dir = inspect_model_dir(workspace / "models" / "base")
    tuned = tuned_model(
        workspace, ArtifactInput({"run_dir": "runs/lora", **adapter_only}), base_dir, run.config
    )
    assert tuned.adapter_file == run.run_dir / "epoch_0" / "adapter_model.pt"
    folder = lm_eval_folder(workspace, ArtifactInput({"run_dir": "runs/lora", **adapter_only}), tuned)
    assert folder.path == run.run_dir / "merged"
    ours, torchtune = weights(folder.path), weights(run.run_dir / "epoch_0")
    assert ours.keys() == torchtune.keys() and all(ours[k].equal(torchtune[k]) for k in ours)


@pytest.fixture(scope="module")
def untrained(tmp_path_factory, tiny_llama, tiny_dataset):
    """A workspace with the base model and the eval split, and no fine-tune: a "tuned" model here is the base."""
    workspace = tmp_path_factory.mktemp("untrained-workspace")
    shutil.copytree(tiny_llama, workspace / "models" / "base")
    (workspace / "datasets").mkdir()
    shutil.copy(tiny_dataset["eval.parquet"], workspace / "datasets" / "eval.parquet")
    return workspace


@pytest.mark.slow
def test_a_model_that_learned_nothing_fails_the_gate(untrained, log_lines):
    """The tuned artifact points at the base's own weights (what a run that trained nothing exports): every
    per-example score is the base's, the improvement is 0 and so is its interval, and the gate fails, saying so
    in its one log line, the report and the Metrics — however low eval_min_improvement is set."""
    result = run_evaluate(
        workspace=untrained,
        model=ArtifactInput({"workspace_path": "models/base"}),
        eval_data=ArtifactInput({"data_files": ["datasets/eval.parquet"], "num_rows": 100}),
        base_model=ArtifactInput({"workspace_path": "models/base"}),
        settings=EvalSettings(max_samples=24, batch_size=24, max_new_tokens=4, min_improvement=-1000.0),
        output_name="unchanged",
    )
    m = result.metrics
    assert m["tuned_eval_loss"] == m["base_eval_loss"] and m["delta_eval_loss"] == 0.0
    assert not result.gate.passed and m["passed"] == 0.0
    assert m["eval_loss_improvement_ci_low"] == m["eval_loss_improvement_ci_high"] == 0.0
    assert m["confidence"] == 0.95 and result.gate.interval.examples == 24
    line = next(line for line in log_lines if line.startswith("quality gate: "))
    assert line.startswith("quality gate: failed: eval_loss did not improve: +0 (tuned ")
    assert line.endswith("; 95% CI [0, 0] (24 examples)")
    assert escape(result.gate.summary) in result.report_html and "improvement, 95% CI" in result.report_html


@pytest.mark.slow
def test_a_run_on_dataset_initialize_packs_is_evaluated_on_its_rows_unpacked(tiny_llama, tmp_path):
    """A run whose data dataset-initialize packed names the packs' builder as its dataset (packing is the CUDA
    default): evaluate builds the eval split from the torchtune node the packs stand for (template, columns,
    masking) unpacked, and scores exactly as for the same run resolved without the packs."""
    from kfp_finetune.components._shared.contract import DatasetSplit
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    from kfp_finetune.components.torchtune_finetune import packed_data
    from kfp_finetune.components.torchtune_finetune.packs import use_packs
    from kfp_finetune.tiny.dataset import build_tiny_dataset

    workspace = tmp_path / "ws"
    shutil.copytree(tiny_llama, workspace / "models" / "base")
    source = build_tiny_dataset(tmp_path / "tiny", train_rows=200, eval_rows=1)["train.jsonl"]
    prepared = initialize_dataset(
        str(source), str(workspace), eval_fraction=0.1, base_model_path=tiny_llama, max_seq_len=64,
        new_system_prompt="Reverse it.",
    )  # fmt: skip
    split = DatasetSplit.from_metadata(prepared.train_metadata, input_name="train_data")

    def resolved_into(name: str, packs=None) -> str:
        cfg = TorchtuneConfig(device="cpu", packed=True, max_seq_len=64)
        cfg.dataset.new_system_prompt = "Reverse it."
        base = workspace / "models" / "base"
        run = resolve_run(cfg, base, prepared.path / "train", workspace / "runs" / name, packs=packs)
        return run.config["dataset"]["_component_"]

    assert resolved_into("packs", lambda c: use_packs(c, split, workspace)) == packed_data.COMPONENT
    assert resolved_into("own") == sample_packing.COMPONENT

    def evaluated(run: str, run_dir: str):  # the base model as the tuned one: the rows are what is compared
        return run_evaluate(
            workspace=workspace,
            model=ArtifactInput({"workspace_path": "models/base", "run_dir": run_dir}),
            eval_data=ArtifactInput(dict(prepared.eval_metadata)),
            base_model=None,
            settings=EvalSettings(max_samples=8, batch_size=8, max_new_tokens=2),
            output_name=run,
        )

    on_packs, own = evaluated("packs", "runs/packs"), evaluated("own", "runs/own")
    assert on_packs.samples == own.samples
    assert on_packs.metrics["tuned_eval_loss"] == own.metrics["tuned_eval_loss"]
    # The system prompt is in the scored rows: without the run's config (its node) the loss differs.
    untemplated = evaluated("no-config", "")
    assert untemplated.metrics["tuned_eval_loss"] != own.metrics["tuned_eval_loss"]


def _with_noisy_embeddings(source, target, seed: int) -> None:
    """A copy of the model at `source` whose token embeddings carry small noise drawn with `seed`."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    for weights in target.glob("*.safetensors"):
        tensors = load_file(weights)
        embeddings = tensors["model.embed_tokens.weight"]
        noise = torch.randn(embeddings.shape, generator=torch.Generator().manual_seed(seed))
        embeddings += 0.1 * embeddings.std() * noise
        save_file(tensors, weights, metadata={"format": "pt"})


@pytest.mark.slow
def test_a_gain_within_the_eval_sets_noise_fails_the_gate(trained, evaluation):
    """Two equally good models that differ example by example: the fine-tuned model with small embedding noise of
    one seed ("tuned") against the same with noise of another seed ("base"). Neither is better but by chance, so
    the interval of the improvement spans 0 and the gate fails, whichever way the mean moved — while the real
    fine-tune against the real base, on the same rows, passes with its interval above 0."""
    workspace, model, eval_data = trained
    merged = workspace / model["merged_path"]
    _with_noisy_embeddings(merged, workspace / "runs" / "noisy-even", seed=1)
    _with_noisy_embeddings(merged, workspace / "runs" / "noisy-odd", seed=2)
    result = run_evaluate(
        workspace=workspace,
        model=ArtifactInput({**model, "workspace_path": "runs/noisy-even", "merged_path": "runs/noisy-even"}),
        eval_data=ArtifactInput(dict(eval_data)),
        base_model=ArtifactInput({"workspace_path": "runs/noisy-odd"}),
        settings=EvalSettings(max_samples=0, max_new_tokens=1, batch_size=25),
        output_name="noise",
    )
    ci = result.gate.interval
    print(result.gate.summary)  # the measured numbers, for the record (pytest -s)
    assert ci.low < 0 < ci.high and not result.gate.passed
    assert result.metrics["eval_loss_improvement_ci_low"] == ci.low
    assert f"95% CI [{ci.low:.4g}, {ci.high:.4g}]" in result.gate.summary
    assert escape(result.gate.summary) in result.report_html
    assert f"[{ci.low:+.4g}, {ci.high:+.4g}]" in result.report_html  # the comparison table's interval column
    fine_tune = evaluation.gate.interval  # exact_match of the real fine-tune vs the base, on all 100 rows
    assert evaluation.gate.passed and fine_tune.low > 0 and fine_tune.examples == 100


# --- bad input ------------------------------------------------------------------------------------------------


def run_with(trained, tmp_path, *, model=None, eval_data=None, base=None):
    workspace, model_meta, eval_meta = trained
    return run_evaluate(
        workspace=workspace,
        model=ArtifactInput(model if model is not None else dict(model_meta)),
        eval_data=ArtifactInput(eval_data if eval_data is not None else dict(eval_meta)),
        base_model=ArtifactInput(base) if base is not None else None,
        settings=EvalSettings(max_samples=2),
        output_name="bad",
    )


@pytest.mark.slow
def test_no_eval_rows(trained, tmp_path):
    with pytest.raises(ConfigError, match="eval_data has no rows"):
        run_with(trained, tmp_path, eval_data={"data_files": [], "num_rows": 0, "dataset_type": "instruct"})


@pytest.mark.slow
def test_prompt_column_missing(trained, tmp_path):
    workspace = trained[0]
    table = pa.Table.from_pylist([{"question": "Uppercase: a b c d", "output": "A B C D"}])
    pq.write_table(table, workspace / "datasets" / "renamed.parquet")
    eval_data = {"data_files": ["datasets/renamed.parquet"], "num_rows": 1, "dataset_type": "instruct"}
    with pytest.raises(ConfigError, match="eval_data lacks the prompt column 'input'.*question"):
        run_with(trained, tmp_path, eval_data=eval_data)


@pytest.mark.slow
def test_model_files_missing(trained, tmp_path):
    workspace = trained[0]
    with pytest.raises(ConfigError, match="model points to .*runs/gone/merged, which does not exist"):
        run_with(trained, tmp_path, model={"workspace_path": "runs/gone/merged"})
    no_weights = workspace / "models" / "no-weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(workspace / "models" / "base" / name, no_weights / name)
    shutil.copytree(workspace / "models" / "base" / "original", no_weights / "original")
    with pytest.raises(ConfigError, match="base_model: model directory .*no-weights has no weights"):
        run_with(trained, tmp_path, base={"workspace_path": "models/no-weights"})
    with pytest.raises(ConfigError, match="model artifact has no workspace_path"):
        run_with(trained, tmp_path, model={})


@pytest.mark.slow
def test_tokenizer_mismatch(trained, tmp_path, tiny_qwen):
    workspace = trained[0]
    shutil.copytree(tiny_qwen, workspace / "models" / "qwen")
    with pytest.raises(ConfigError, match="base_model .*qwen.* does not share the tuned model's tokenizer"):
        run_with(trained, tmp_path, base={"workspace_path": "models/qwen"})


def test_bad_settings_name_the_parameter():
    for settings, message in (
        (EvalSettings(batch_size=0), "batch_size must be at least 1"),
        (EvalSettings(max_samples=-1), "max_samples must be 0 or more"),
        (EvalSettings(device="tpu"), "device must be auto, cpu or cuda"),
        (EvalSettings(thresholds={"exact_match": "high"}), "thresholds values must be numbers"),
        (
            EvalSettings(gate_metric="recall"),
            "gate_metric names unknown metric.*recall.*exact_match.*macro_f1",
        ),
        (EvalSettings(thresholds={"bleu": 0.3}), "thresholds names unknown metric.*bleu"),
    ):
        with pytest.raises(ConfigError, match=message):
            settings.check()


def test_lm_eval_results_flatten():
    from kfp_finetune.components.evaluate.lm_eval_tasks import flatten_results

    results = {
        "arc_easy": {"alias": "arc_easy", "acc,none": 0.5, "acc_stderr,none": 0.1, "acc_norm,none": 0.25}
    }
    assert flatten_results(results) == {"lm_eval_arc_easy_acc": 0.5, "lm_eval_arc_easy_acc_norm": 0.25}
    # lm-eval 0.4.10 and later add the task's name and sample count beside its scores.
    results["arc_easy"] |= {"name": "arc_easy", "sample_len": 20}
    assert flatten_results(results) == {"lm_eval_arc_easy_acc": 0.5, "lm_eval_arc_easy_acc_norm": 0.25}


def require_torchtunes_lm_eval() -> None:
    """The lm-eval torchtune's eleuther_eval runs: `make test-lm-eval`'s environment has it (so no skipping there);
    the main one has the transformers engine's newer lm-eval, which that recipe refuses (check_lm_eval)."""
    if os.environ.get("KFP_FINETUNE_REQUIRE_LM_EVAL"):
        import lm_eval  # noqa: F401

        return
    pytest.importorskip("lm_eval", reason="the kfp-finetune[lm-eval] extra; `make test-lm-eval` runs it")
    from importlib.metadata import version

    from packaging.version import Version

    if Version(version("lm-eval")) >= Version(LM_EVAL_BEYOND):
        pytest.skip(
            f"lm-eval {version('lm-eval')} is the transformers engine's; `make test-lm-eval` runs this"
        )


# Runs in a child process: huggingface_hub reads HF_HOME when first imported.
_LM_EVAL_SCRIPT = """
import json, shutil, sys
from pathlib import Path
from transformers import GPT2Config, GPT2LMHeadModel
from kfp_finetune.components.evaluate.evaluate import ArtifactInput, EvalSettings, run_evaluate

workspace, hf_home, tokenizer_dir, tasks_dir, model, eval_data = sys.argv[1:]
# torchtune 0.6.1's lm-eval wrapper starts by loading "gpt2" (never used): a tiny one in the offline cache.
snapshot = Path(hf_home) / "hub" / "models--gpt2" / "snapshots" / ("0" * 40)
snapshot.mkdir(parents=True)
(snapshot.parents[1] / "refs").mkdir()
(snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
vocab = json.loads((Path(tokenizer_dir) / "vocab.json").read_text())
config = GPT2Config(n_layer=1, n_head=1, n_embd=8, n_positions=64, vocab_size=len(vocab) + 1)
GPT2LMHeadModel(config).save_pretrained(snapshot)
for name in ("vocab.json", "merges.txt"):
    shutil.copy(Path(tokenizer_dir) / name, snapshot / name)
result = run_evaluate(
    workspace=workspace,
    model=ArtifactInput(json.loads(model)),
    eval_data=ArtifactInput(json.loads(eval_data)),
    base_model=ArtifactInput({"workspace_path": "models/base"}),
    settings=EvalSettings(max_samples=4, max_new_tokens=8, lm_eval_tasks=["kfp_tiny"], lm_eval_limit=20,
                          lm_eval_include_path=tasks_dir, gate_metric="lm_eval_kfp_tiny_perplexity"),
    output_name="lm-eval",
)
print("RESULT " + json.dumps(result.metrics))
"""


@pytest.mark.slow
def test_lm_eval_task_through_the_eleuther_recipe(trained, tiny_qwen, tiny_dataset, tmp_path):
    """A local lm-eval task (data on disk, so offline) scored for tuned and base through eleuther_eval."""
    require_torchtunes_lm_eval()

    workspace, model, eval_data = trained
    tasks_dir = lm_eval_task.write_task(tmp_path / "tasks", tiny_dataset["eval.jsonl"])
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = [
        str(workspace),
        str(tmp_path / "hf"),
        str(tiny_qwen),
        str(tasks_dir),
        json.dumps(model),
        json.dumps(eval_data),
    ]
    done = subprocess.run(
        [sys.executable, "-c", _LM_EVAL_SCRIPT, *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert {"tuned_lm_eval_kfp_tiny_acc", "base_lm_eval_kfp_tiny_acc"} <= set(metrics)
    assert metrics["tuned_lm_eval_kfp_tiny_perplexity"] < metrics["base_lm_eval_kfp_tiny_perplexity"]
    # The interval comes from lm-eval's standard errors (normal approximation), and the gate follows it: on this
    # tiny model the task's perplexities are huge and noisy, so it may well fail, but only where the interval says.
    gate_line = next(line for line in done.stderr.splitlines() if "quality gate:" in line)
    low, high = (metrics[f"lm_eval_kfp_tiny_perplexity_improvement_ci_{end}"] for end in ("low", "high"))
    assert low < metrics["gate_improvement"] < high, gate_line
    assert metrics["passed"] == float(low > 0), gate_line
    assert f"95% CI [{low:.4g}, {high:.4g}]" in gate_line


def evaluate_lm_eval_tasks(workspace, engine: str) -> None:
    """Evaluate a model trained by `engine` on an lm-eval task: the checks below refuse it before any load."""
    run_evaluate(
        workspace=workspace,
        model=ArtifactInput({"workspace_path": "models/tuned", "engine": engine}),
        eval_data=ArtifactInput({"data_files": ["eval.parquet"]}),
        base_model=None,
        settings=EvalSettings(lm_eval_tasks=["arc_easy"]),
        output_name="lm-eval",
    )


@pytest.mark.parametrize(
    ("engine", "fix"),
    [
        ("torchtune", r"kfp-finetune\[lm-eval\]"),
        ("transformers", r"kfp-finetune\[lm-eval-transformers\]"),
    ],
)
def test_lm_eval_needs_the_extra(engine, fix, workspace, monkeypatch):
    """Checked before any model is loaded; the fix is the engine's (the transformers engine's image cannot have
    the lm-eval extra's transformers 4)."""
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as in an image without kfp-finetune[lm-eval]
    with pytest.raises(ConfigError, match=rf"lm_eval_tasks needs lm-eval.*{fix}"):
        evaluate_lm_eval_tasks(workspace, engine)


def lm_eval_in_name_only(monkeypatch, version: str) -> None:
    """An importable lm-eval of `version` whose modules are missing: what the checks see before loading one."""
    import importlib.metadata

    real_version = importlib.metadata.version
    monkeypatch.setitem(sys.modules, "lm_eval", types.ModuleType("lm_eval"))
    monkeypatch.setitem(sys.modules, "lm_eval.models.huggingface", None)
    monkeypatch.setattr(
        importlib.metadata, "version", lambda name: version if name == "lm-eval" else real_version(name)
    )


@pytest.mark.parametrize("found", ["0.4.13", "0.4.4"])
def test_torchtunes_recipe_refuses_the_lm_evals_it_cannot_run(found, workspace, monkeypatch):
    """torchtune 0.6.1's eleuther_eval compares lm-eval's version with "0.4.5" as strings, so 0.4.13 would stop it
    after the models load as "too old": refused first, with the versions it runs."""
    lm_eval_in_name_only(monkeypatch, found)
    with pytest.raises(ConfigError, match=rf"lm-eval {found}, .*lm-eval>=0\.4\.5,<0\.4\.10 only"):
        evaluate_lm_eval_tasks(workspace, "torchtune")
    assert not (workspace / "eval").exists()


def test_the_transformers_engine_refuses_an_lm_eval_that_does_not_import_beside_transformers_5(
    workspace, monkeypatch
):
    """lm-eval 0.4.9's HF model imports transformers.AutoModelForVision2Seq, gone in transformers 5."""
    lm_eval_in_name_only(monkeypatch, "0.4.9.2")
    with pytest.raises(
        ConfigError, match=r"Hugging Face model does not import here .*kfp-finetune\[lm-eval-transformers\]"
    ):
        evaluate_lm_eval_tasks(workspace, "transformers")
    assert not (workspace / "eval").exists()


def test_offline_step_without_the_wrappers_gpt2_is_refused_before_loading(workspace, tmp_path):
    """torchtune's lm-eval wrapper loads "gpt2" first: offline with an empty cache, say so before any model load."""
    require_torchtunes_lm_eval()
    script = (
        "import sys\n"
        "from kfp_finetune.components.evaluate.evaluate import ArtifactInput, EvalSettings, run_evaluate\n"
        "run_evaluate(workspace=sys.argv[1], model=ArtifactInput({'workspace_path': 'models/tuned'}),\n"
        "             eval_data=ArtifactInput({'data_files': ['eval.parquet']}), base_model=None,\n"
        "             settings=EvalSettings(lm_eval_tasks=['arc_easy']), output_name='lm-eval')\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "empty-hf-home"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(workspace)], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("kfp_finetune.components._shared.errors.ConfigError: eval_lm_eval_tasks:")
    assert "'gpt2'" in error and "HF_HUB_OFFLINE" in error and str(tmp_path / "empty-hf-home") in error
    assert not (workspace / "eval").exists()
