"""The evaluate step: tuned vs base on the held-out split — teacher-forced loss and perplexity on the response
tokens, greedy generations scored against the reference, optional lm-eval tasks — a quality gate, a report.

Plain Python: the KFP component only unpacks its artifacts and calls `run_component`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared import contract, engines
from kfp_finetune.components._shared.artifacts import entry_path
from kfp_finetune.components._shared.contract import ArtifactInput
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.eval_settings import EvalSettings
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import StepMetrics, read_metrics_file
from kfp_finetune.components._shared.names import instance_name
from kfp_finetune.components._shared.torchtune import builder_nodes, sample_packing
from kfp_finetune.components._shared.torchtune.dataset_node import dataset_builder_node, source_of
from kfp_finetune.components._shared.torchtune.model_inspection import (
    ModelDir,
    inspect_model_dir,
    tokenizer_fingerprint,
)
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
# The rows' shape for each data style dataset-initialize writes, and a dataset type's default style.
_STYLE_TYPES = {
    "input_output": "instruct",
    "alpaca": "instruct",
    "openai": "chat",
    "sharegpt": "chat",
    "text": "text",
}
_DEFAULT_STYLE = {"instruct": "input_output", "chat": "openai", "text": "text"}


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


def model_folder(workspace: Path, artifact: ArtifactInput, what: str) -> ModelDir:
    """The HF model folder an artifact points to (the merged model for a fine-tune output), inspected."""
    if what == "base_model":
        relative = contract.BaseModel.from_metadata(artifact.metadata, input_name=what).workspace_path
    else:
        tuned = contract.TunedModel.from_metadata(artifact.metadata, input_name=what)
        relative = tuned.model_path or tuned.require("workspace_path", input_name=what)
    path = entry_path(workspace, relative)
    if not path.is_dir():
        where = "this step's volumes" if Path(relative).is_absolute() else "this run's workspace"
        raise ConfigError(f"{what} points to {path}, which does not exist in {where}")
    try:
        return inspect_model_dir(path)
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from err


def base_folder(workspace: Path, base_model: ArtifactInput | None, tuned: ArtifactInput) -> ModelDir | None:
    """The base model to compare with: the connected input, else the base the fine-tune recorded, if present."""
    if base_model is not None:
        return model_folder(workspace, base_model, "base_model")
    recorded = contract.TunedModel.from_metadata(tuned.metadata, input_name="model").base_model_path
    if recorded and entry_path(workspace, recorded).is_dir():
        log.info("base_model not connected: comparing with the fine-tune's recorded base model %s", recorded)
        return model_folder(
            workspace, ArtifactInput(contract.BaseModel(workspace_path=recorded).to_metadata()), "base_model"
        )
    log.warning("no base model to compare with: reporting the tuned model alone")
    return None


@dataclass
class TunedModel:
    folder: ModelDir  # tokenizer and architecture; the base model's folder for an adapter-only fine-tune
    adapter_file: Path | None = None  # epoch_N/adapter_model.pt when the fine-tune saved only its adapter
    lora_node: dict | None = None  # the training run's LoRA `model` node, to rebuild that model


def tuned_model(
    workspace: Path, model: ArtifactInput, base_dir: ModelDir | None, train_config: dict
) -> TunedModel:
    """The merged model folder, or for save_adapter_weights_only runs the base + the run's adapter weights."""
    meta = contract.TunedModel.from_metadata(model.metadata, input_name="model")
    relative = meta.model_path
    path = entry_path(workspace, relative)
    if not relative or not (path / "adapter_config.json").is_file() or (path / "config.json").is_file():
        return TunedModel(model_folder(workspace, model, "model"))
    if base_dir is None:
        raise ConfigError(
            f"model is a LoRA adapter without merged weights ({path}): connect base_model (model-initialize's "
            "output) so evaluate can apply the adapter to it"
        )
    lora_node = train_config.get("model") or {}
    run_dir = workspace / meta.run_dir
    adapter_state = engines.face(meta.engine).last_adapter_state(run_dir) if meta.run_dir else None
    if "lora_rank" not in lora_node or adapter_state is None:
        raise ConfigError(
            f"model is a LoRA adapter without merged weights ({path}) and its fine-tune run folder "
            f"({run_dir}) lacks the resolved LoRA config or epoch_N/adapter_model.pt evaluate rebuilds it from"
        )
    return TunedModel(base_dir, adapter_state, lora_node)


def lm_eval_folder(workspace: Path, model: ArtifactInput, tuned: TunedModel) -> ModelDir:
    """The HF folder lm-eval reads the tuned model from. torchtune's eleuther_eval loads no adapter: an adapter-only
    fine-tune is merged into its base first, on CPU, once per run (`<run>/merged/`, which export reuses)."""
    if tuned.adapter_file is None:
        return tuned.folder
    meta = contract.TunedModel.from_metadata(model.metadata, input_name="model")
    log.info("lm-eval tasks: merging the fine-tune's adapter into the base model (torchtune's eleuther_eval "
             "loads no adapter)")  # fmt: skip
    return inspect_model_dir(
        engines.face(meta.engine).merged_model_dir(workspace / meta.run_dir, tuned.folder.path)
    )


def check_same_tokenizer(tuned: ModelDir, base: ModelDir) -> None:

    tuned_vocab, base_vocab = tuned.hf_config.get("vocab_size"), base.hf_config.get("vocab_size")
    base_fingerprint = tokenizer_fingerprint(base)
    differing = [k for k, v in tokenizer_fingerprint(tuned).items() if base_fingerprint.get(k) != v]
    if tuned_vocab != base_vocab:
        differing.append(f"vocab_size {base_vocab} vs {tuned_vocab}")
    if differing:
        raise ConfigError(
            f"base_model ({base.path}) does not share the tuned model's tokenizer ({tuned.path}): "
            f"{', '.join(differing)} differ. Compare a fine-tuned model with the base it was trained from."
        )


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


def dataset_node(train_config: dict, eval_data: ArtifactInput, files: list[str]) -> dict:
    """The training run's dataset node pointed at the eval files; response-only labels, no packing.

    Builder, column mapping, system prompt and conversation style are kept from training so examples are built
    (and masked) exactly as the model saw them: from the torchtune node, behind our packing builder or the packs
    dataset-initialize wrote (builder_nodes.py); without a training config they come from eval_data.
    """
    meta = contract.DatasetSplit.from_metadata(eval_data.metadata, input_name="eval_data")
    trained = builder_nodes.torchtune_node(train_config.get("dataset") or {})
    node = dict(sample_packing.unwrap(trained))
    if not node.get("_component_"):
        style = meta.data_style or _DEFAULT_STYLE.get(meta.dataset_type or "instruct", "")
        if style not in _STYLE_TYPES:
            raise ConfigError(
                f"eval_data has `dataset_type` {meta.dataset_type or None!r} / `data_style` {style!r}; expected "
                f"instruct, chat or text (styles {', '.join(_STYLE_TYPES)})"
            )
        chat = _STYLE_TYPES[style] == "chat"
        node = dataset_builder_node(
            _STYLE_TYPES[style],
            source="",
            data_style=style,
            text_column=meta.text_column or "",
            conversation_column=meta.conversation_column or "",
            conversation_style=(meta.conversation_style or style) if chat else "",
        )
    node.update(
        source=source_of(files[0]),
        data_files=files,
        split="train",  # a `datasets` builder over plain files names its only split "train"
        packed=False,
    )
    if "train_on_input" in node or node["_component_"].endswith("alpaca_dataset"):
        node["train_on_input"] = (
            False  # loss on the response only, whatever training did (alpaca: default True)
        )
    return node


def needed_columns(node: dict) -> dict[str, str] | None:
    """{role: column} the node's torchtune builder reads; None for a builder this library does not write."""
    column_map = node.get("column_map") or {}
    builder = node["_component_"].rsplit(".", 1)[-1]
    if builder == "instruct_dataset":
        return {"prompt": column_map.get("input", "input"), "response": column_map.get("output", "output")}
    if builder == "alpaca_dataset":
        return {
            "instruction": column_map.get("instruction", "instruction"),
            "response": column_map.get("output", "output"),
        }
    if builder == "chat_dataset":
        return {"conversation": node.get("conversation_column", "messages")}
    if builder == "text_completion_dataset":
        return {"text": node.get("column", "text")}
    return None


def check_columns(node: dict, files: list[str]) -> None:
    """Fail early, naming the column, when the eval files lack what the dataset builder reads."""
    import pyarrow.parquet as pq

    needed = needed_columns(node)
    if needed is None or not files[0].endswith(".parquet"):
        return
    present = set(pq.read_schema(files[0]).names)
    for role, column in needed.items():
        if column not in present:
            raise ConfigError(
                f"eval_data lacks the {role} column {column!r} that training's {node['_component_']} reads (it "
                f"has {', '.join(sorted(present))}); prepare train and eval data with one dataset-initialize step"
            )


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
    if settings.lm_eval_tasks:
        from kfp_finetune.components.evaluate.lm_eval_tasks import require_lm_eval

        require_lm_eval()
    workspace = Path(workspace)
    # The engine that trained the model loads and tokenizes it as training did.
    model_eval = engines.face(
        contract.TunedModel.from_metadata(model.metadata, input_name="model").engine
    ).evaluation()
    train_config = training_config(workspace, model)
    base_dir = base_folder(workspace, base_model, model)
    tuned = tuned_model(workspace, model, base_dir, train_config)
    tuned_dir = tuned.folder
    if base_dir is not None:
        check_same_tokenizer(tuned_dir, base_dir)
    files = eval_files(workspace, eval_data)
    node = dataset_node(train_config, eval_data, files)
    check_columns(node, files)
    max_seq_len = settings.max_seq_len or (train_config.get("tokenizer") or {}).get("max_seq_len")

    placement = choose_placement(
        settings.device, Trained.of(model.metadata, train_config), *visible_hardware()
    )
    log.info("device %s, %s: %s", placement.device, placement.dtype, placement.reason)
    device, dtype = placement.torch()
    tokenizer = model_eval.load_tokenizer(tuned_dir, max_seq_len, train_config.get("tokenizer"))
    dataset = model_eval.build_dataset(node, tokenizer)
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

    scores: dict[str, model_eval.ModelScores] = {}
    adapter = (tuned.lora_node, tuned.adapter_file) if tuned.adapter_file is not None else None
    for label, loaded in model_eval.models_to_score(tuned_dir, base_dir, adapter, device, dtype):
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
            label: run_lm_eval(folder, settings, device, max_seq_len, label=label)
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


def sample_records(examples: list, scores: dict[str, Any]) -> list[dict]:
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
    return result.gate.passed
