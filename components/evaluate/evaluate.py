"""The evaluate step: tuned vs base on the held-out split — teacher-forced loss and perplexity on the response
tokens, greedy generations scored against the reference, optional lm-eval tasks — a quality gate, a report.

Engine-neutral: whatever depends on how the model was trained (reading its folders and its run's config,
tokenizing and masking the eval rows as training did, loading and scoring the models, lm-eval's model) is asked
of the evaluation module of the engine the fine-tune recorded (`engines.face(engine).evaluation()`).

Plain Python: the KFP component only unpacks its artifacts and calls `run_component`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kfp_finetune.components._shared import contract, engines, tracking
from kfp_finetune.components._shared.artifacts import entry_path
from kfp_finetune.components._shared.contract import ArtifactInput
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.eval_examples import Example, ModelScores
from kfp_finetune.components._shared.eval_settings import EvalSettings
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import StepMetrics, read_metrics_file
from kfp_finetune.components._shared.names import instance_name
from kfp_finetune.components._shared.workspace import area_dir, atomic_dir
from kfp_finetune.components.evaluate import confidence, paired, scoring
from kfp_finetune.components.evaluate.placement import (
    Trained,
    choose_placement,
    eval_batch_size,
    gpu_memory_bytes,
    visible_hardware,
)

log = get_logger(__name__)

SAMPLES_FILE = "samples.jsonl"
REPORT_FILE = "report.html"
METRICS_FILE = "metrics.json"


@dataclass
class EvalResult:
    metrics: dict[str, float]  # flat, as logged to the Metrics artifact
    tuned: dict[str, float]
    base: dict[str, float] | None
    gate: scoring.GateResult
    samples: list[dict]
    report_html: str
    output_dir: Path
    samples_metadata: dict


# --- inputs -------------------------------------------------------------------------------------------------


def engine_evaluation(model: ArtifactInput) -> ModuleType:
    """The evaluation module of the engine that trained the model: it loads and tokenizes as training did."""
    return engines.face(
        contract.TunedModel.from_metadata(model.metadata, input_name="model").engine
    ).evaluation()


def existing_path(workspace: Path, relative: str, what: str) -> Path:
    path = entry_path(workspace, relative)
    if not path.is_dir():
        where = "this step's volumes" if Path(relative).is_absolute() else "this run's workspace"
        raise ConfigError(f"{what} points to {path}, which does not exist in {where}")
    return path


def base_folder(
    workspace: Path, base_model: ArtifactInput | None, tuned: ArtifactInput, model_eval: ModuleType
) -> Any:
    """The base model to compare with: the connected input, else the base the fine-tune recorded, if present."""
    if base_model is not None:
        relative = contract.BaseModel.from_metadata(
            base_model.metadata, input_name="base_model"
        ).workspace_path
        return model_eval.inspect_model(existing_path(workspace, relative, "base_model"), "base_model")
    recorded = contract.TunedModel.from_metadata(tuned.metadata, input_name="model").base_model_path
    if recorded and entry_path(workspace, recorded).is_dir():
        log.info("base_model not connected: comparing with the fine-tune's recorded base model %s", recorded)
        return model_eval.inspect_model(existing_path(workspace, recorded, "base_model"), "base_model")
    log.warning("no base model to compare with: reporting the tuned model alone")
    return None


def tuned_model(workspace: Path, model: ArtifactInput, base_dir: Any, train_config: dict) -> Any:
    """The engine's tuned model (its `.folder` has the tokenizer and architecture): the model folder the artifact
    points to, or whatever else the engine loads for it (torchtune: the base + the run's adapter)."""
    meta = contract.TunedModel.from_metadata(model.metadata, input_name="model")
    path = existing_path(
        workspace, meta.model_path or meta.require("workspace_path", input_name="model"), "model"
    )
    run_dir = workspace / meta.run_dir if meta.run_dir else None
    return engine_evaluation(model).tuned_model(path, run_dir, base_dir, train_config)


def lm_eval_folder(workspace: Path, model: ArtifactInput, tuned: Any) -> Any:
    """The model folder lm-eval reads the tuned model from, as its engine has it (merged when needed)."""
    meta = contract.TunedModel.from_metadata(model.metadata, input_name="model")
    return engine_evaluation(model).lm_eval_folder(tuned, workspace / meta.run_dir)


def training_config(workspace: Path, tuned: ArtifactInput) -> dict:
    """The fine-tune run's resolved config (empty when the model was not trained by this library)."""
    meta = contract.TunedModel.from_metadata(tuned.metadata, input_name="model")
    return engines.face(meta.engine).read_resolved_config(workspace / meta.run_dir) if meta.run_dir else {}


def eval_files(workspace: Path, eval_data: ArtifactInput) -> list[str]:
    meta = contract.DatasetSplit.from_metadata(eval_data.metadata, input_name="eval_data")
    files = meta.data_files
    if not files or meta.num_rows == 0:
        raise ConfigError(
            "eval_data has no rows: set data_eval_split or data_eval_fraction for dataset-initialize, and connect its "
            "`eval` output"
        )
    paths = [workspace / f for f in files]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ConfigError(f"eval_data files are missing from the workspace: {', '.join(missing[:3])}")
    return [str(p) for p in paths]


def pick_rows(num_rows: int, max_samples: int, seed: int) -> list[int]:
    """All rows, or a seeded random subset of `max_samples` in row order (same seed, same rows)."""
    import random

    if num_rows == 0:
        raise ConfigError("eval_data has no rows: nothing to evaluate")
    if not max_samples or max_samples >= num_rows:
        return list(range(num_rows))
    return sorted(random.Random(seed).sample(range(num_rows), max_samples))


# --- the run --------------------------------------------------------------------------------------------------


def run_evaluate(
    *,
    workspace: str | os.PathLike,
    model: ArtifactInput,
    eval_data: ArtifactInput,
    base_model: ArtifactInput | None,
    settings: EvalSettings,
    output_name: str,
) -> EvalResult:
    """Validate, score both models, gate, and write `<workspace>/eval/<output_name>/` (samples, report)."""
    from kfp_finetune.components.evaluate.report import render_report

    started = time.monotonic()
    settings.check()
    model_eval = engine_evaluation(model)
    if settings.lm_eval_tasks:
        from kfp_finetune.components.evaluate.lm_eval_tasks import require_lm_eval

        require_lm_eval(model_eval)
    workspace = Path(workspace)
    train_config = training_config(workspace, model)
    base_dir = base_folder(workspace, base_model, model, model_eval)
    tuned = tuned_model(workspace, model, base_dir, train_config)
    settings.check_scored(classifier=getattr(tuned, "classifier", False))
    tuned_dir = tuned.folder
    if base_dir is not None:
        model_eval.check_same_tokenizer(tuned_dir, base_dir)
    files = eval_files(workspace, eval_data)
    max_seq_len = settings.max_seq_len or model_eval.training_max_seq_len(train_config)
    data = model_eval.eval_dataset(train_config, eval_data, files, max_seq_len)

    placement = choose_placement(
        settings.device, Trained.of(model.metadata, train_config), *visible_hardware()
    )
    log.info("device %s, %s: %s", placement.device, placement.dtype, placement.reason)
    device, dtype = placement.torch()
    tokenizer = model_eval.load_tokenizer(tuned_dir, max_seq_len, train_config)
    dataset = model_eval.build_dataset(data, tokenizer)
    rows = pick_rows(len(dataset), settings.max_samples, settings.seed)
    examples = model_eval.make_examples(dataset, tokenizer, rows)
    log.info(
        "evaluating %d of %d eval rows on %s (%s); %d with a prompt to generate from",
        len(rows), len(dataset), device, str(dtype).removeprefix("torch."),
        sum(1 for e in examples if e.prompt_tokens),
    )  # fmt: skip

    longest = max((len(e.tokens) for e in examples), default=1) + settings.max_new_tokens
    weight_bytes = tuned_dir.num_parameters * (4 if placement.dtype == "fp32" else 2)
    batch_size, why = eval_batch_size(
        settings.batch_size, placement, tuned_dir.hf_config, weight_bytes, longest,
        gpu_memory_bytes() if placement.device != "cpu" else 0,
    )  # fmt: skip
    log.info("batch size %s", why)
    settings = dataclasses.replace(settings, batch_size=batch_size)

    scores: dict[str, ModelScores] = {}
    for label, loaded in model_eval.models_to_score(tuned, base_dir, device, dtype):
        scores[label] = model_eval.score_model(
            loaded, tokenizer, examples, label=label, batch_size=batch_size,
            max_new_tokens=settings.max_new_tokens, device=device, dtype=dtype, seed=settings.seed,
        )  # fmt: skip
        del loaded

    per_example = {label: paired.example_scores(result, examples) for label, result in scores.items()}
    tuned_values = paired.summarize(scores["tuned"], per_example["tuned"])
    base = paired.summarize(scores["base"], per_example["base"]) if "base" in scores else None
    intervals, missing = {}, {}
    if base is not None:
        intervals, missing = paired.bootstrap_intervals(
            per_example, confidence=settings.confidence, seed=settings.seed
        )
    if settings.lm_eval_tasks:
        from kfp_finetune.components.evaluate.lm_eval_tasks import run_lm_eval

        lm_eval = {
            label: run_lm_eval(folder, settings, device, max_seq_len, label=label, model_eval=model_eval)
            for label, folder in (("tuned", lm_eval_folder(workspace, model, tuned)), ("base", base_dir))
            if folder is not None
        }
        tuned_values.update(lm_eval["tuned"].values)
        if base is not None:
            base.update(lm_eval["base"].values)
            found, unknown = paired.lm_eval_intervals(lm_eval["tuned"], lm_eval["base"], settings.confidence)
            intervals.update(found)
            missing.update(unknown)

    gate = scoring.quality_gate(
        tuned_values,
        base,
        settings.gate_metric,
        settings.min_improvement,
        settings.thresholds,
        interval=intervals.get(settings.gate_metric),
        no_interval_reason=missing.get(settings.gate_metric, ""),
    )
    if len(gate.reasons) > 1:  # the summary names only the failed checks
        for line in gate.reasons:
            log.info("quality gate check: %s", line)
    log.info("quality gate: %s", gate.summary)

    samples = sample_records(examples, scores)
    wall = time.monotonic() - started
    metrics = flat_metrics(
        tuned_values, base, gate, intervals, len(examples), scores["tuned"].loss_tokens, wall
    )
    steps = training_steps(workspace, model)
    context = {
        "tuned_model": contract.TunedModel.from_metadata(model.metadata, input_name="model").model_path,
        "base_model": os.path.relpath(base_dir.path, workspace.resolve()) if base_dir else "",
        "eval_data": contract.DatasetSplit.from_metadata(
            eval_data.metadata, input_name="eval_data"
        ).workspace_path
        or ", ".join(files[:2]),
        "device": f"{placement.device} ({placement.dtype}): {placement.reason}",
        "samples": f"{len(examples)} of {len(dataset)} eval rows (seed {settings.seed})",
        "max_new_tokens": settings.max_new_tokens,
        "wall_seconds": round(wall, 1),
    }
    html = render_report(
        tuned_values, base, gate, intervals, samples[: settings.report_samples], steps, context
    )

    output_dir = area_dir(workspace, "eval", output_name)
    with atomic_dir(output_dir) as tmp:
        (tmp / SAMPLES_FILE).write_text("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples))
        (tmp / REPORT_FILE).write_text(html)
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    samples_metadata = contract.EvalSamples(
        workspace_path=(output_dir / SAMPLES_FILE).resolve().relative_to(workspace.resolve()).as_posix(),
        format="jsonl",
        num_rows=len(samples),
        columns=list(samples[0]) if samples else [],
    ).to_metadata()
    return EvalResult(metrics, tuned_values, base, gate, samples, html, output_dir, samples_metadata)


def sample_records(examples: list[Example], scores: dict[str, ModelScores]) -> list[dict]:
    records = []
    for i, example in enumerate(examples):
        record: dict[str, Any] = {
            "row": example.row,
            "prompt": example.prompt,
            "reference": example.reference,
        }
        for label, result in scores.items():
            generation = result.generations[i]
            record[label] = generation
            record[f"{label}_loss"] = result.example_losses[i]
            if generation is not None:
                record[f"{label}_exact_match"] = scoring.exact_match(generation, example.reference)
        records.append(record)
    return records


def flat_metrics(
    tuned: dict[str, float],
    base: dict[str, float] | None,
    gate: scoring.GateResult,
    intervals: dict[str, confidence.Interval],
    num_samples: int,
    response_tokens: int,
    wall: float,
) -> dict[str, float]:
    """The Metrics artifact: tuned_*, base_*, delta_* (tuned - base) per metric, the improvement's confidence
    interval (<metric>_improvement_ci_low/high, at `confidence`), and the gate's outcome."""
    metrics = {f"tuned_{k}": v for k, v in tuned.items()}
    for name, value in (base or {}).items():
        metrics[f"base_{name}"] = value
        if name in tuned:
            metrics[f"delta_{name}"] = tuned[name] - value
    for name, interval in intervals.items():
        metrics[f"{name}_improvement_ci_low"] = interval.low
        metrics[f"{name}_improvement_ci_high"] = interval.high
        metrics["confidence"] = interval.confidence
    metrics.update(
        num_samples=float(num_samples),
        response_tokens=float(response_tokens),
        passed=float(gate.passed),
        wall_seconds=round(wall, 3),
    )
    if gate.improvement is not None:
        metrics["gate_improvement"] = gate.improvement
    return {k: float(v) for k, v in metrics.items()}


def training_steps(workspace: Path, model: ArtifactInput) -> list[StepMetrics]:
    relative = contract.TunedModel.from_metadata(model.metadata, input_name="model").metrics_file
    path = workspace / relative if relative else None
    return read_metrics_file(path) if path is not None and path.is_file() else []


# --- the KFP component's entry point -------------------------------------------------------------------------


def run_component(**params: Any) -> bool:
    """What the component body calls with all its parameters; returns the gate's verdict."""

    settings = EvalSettings(
        **{name: params[name] for name in EvalSettings.__dataclass_fields__ if name in params}
    )
    tracking.check_tracking(params.get("mlflow_tracking_uri", ""))
    settings.thresholds = dict(settings.thresholds or {})
    settings.lm_eval_tasks = list(settings.lm_eval_tasks or [])
    result = run_evaluate(
        workspace=params["workspace_path"],
        model=ArtifactInput.of(params["model"]),
        eval_data=ArtifactInput.of(params["eval_data"]),
        base_model=ArtifactInput.of(params.get("base_model")),
        settings=settings,
        # Named from this task's own KFP id: two evaluations in one run (nested uses, sweep trials) never share.
        output_name=instance_name(
            params["task_name"] or "evaluate", params.get("task_id") or params["run_id"] or "local"
        ),
    )
    for name, value in contract.EvalMetrics(values=result.metrics).to_metadata().items():
        params["metrics"].log_metric(name, value)
    Path(params["report"].path).parent.mkdir(parents=True, exist_ok=True)
    Path(params["report"].path).write_text(result.report_html)
    samples_path = Path(params["samples"].path)
    samples_path.parent.mkdir(parents=True, exist_ok=True)
    samples_path.write_text((result.output_dir / SAMPLES_FILE).read_text())
    params["samples"].metadata.update(result.samples_metadata)
    run_id = params["run_id"] or "local"
    tracking.track_step(
        params.get("mlflow_tracking_uri", ""), params.get("mlflow_experiment", ""),
        run_name=f"{run_id}/{params['task_name']}/evaluate",
        tags={"kfp.run_id": run_id, "kfp.task": params["task_name"], "kfp_finetune.step": "evaluate"},
        params={f"eval_{k}": v for k, v in dataclasses.asdict(settings).items() if isinstance(v, str | int | float)},
        metrics=result.metrics, files={"samples": [result.output_dir / SAMPLES_FILE]},
        texts={"reports/evaluate.html": result.report_html},
    )  # fmt: skip
    return result.gate.passed
