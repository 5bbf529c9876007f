"""A run its engine's wing plans from the step's settings (a face with `plan_run`: the transformers engine): plan
and check it before anything trains, train it with the step's backend, check the loss and the weights, and hand on
the wing's `merged/` and `adapter/` folders with the metrics file and a report.

torchtune's runs are planned by the step itself (finetune.py: resolve.py over dataset-initialize's packs, the
defaults' memory model). What both share — the backends, the divergence and weights-changed checks, the hashes,
the model metadata — is the same code.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.contract import BaseModel, DatasetSplit, TrainConfig, TunedModel
from kfp_finetune.components._shared.engines import EngineChoice
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import read_metrics_file
from kfp_finetune.components.torchtune_finetune.backends import TrainingBackend
from kfp_finetune.components.torchtune_finetune.metrics import (
    first_divergence,
    read_resumes,
    run_metrics,
    summarize,
)
from kfp_finetune.components.torchtune_finetune.outputs import hand_on
from kfp_finetune.components.torchtune_finetune.report import planned_report
from kfp_finetune.components.torchtune_finetune.weights import WeightsUnchanged, unchanged

log = get_logger(__name__)


def train_planned(
    face: ModuleType,
    choice: EngineChoice,
    *,
    workspace: str | os.PathLike,
    model_dir: Path,
    base: BaseModel,
    train: DatasetSplit,
    held_out: DatasetSplit | None,
    settings: dict[str, Any],
    run_dir: Path,
    backend: TrainingBackend,
) -> dict[str, Any]:
    """Plan, train and hand on one run; returns FinetuneResult's fields (finetune.py builds it)."""
    data_files = [str(Path(workspace) / f) for f in train.data_files]
    missing = [f for f in data_files if not Path(f).is_file()]
    if not data_files or missing:
        raise ConfigError(
            f"train_data files are missing from the workspace: {', '.join(missing[:3]) or 'none'}"
        )
    # A retried step finds what the earlier attempt's training saved (train.py resumes from it).
    backend.prepare(run_dir, resume_point=face.resume_point)
    plan = face.plan_run(
        settings,
        model_dir=model_dir,
        data_files=data_files,
        run_dir=run_dir,
        data_hints=train.reading_hints(),  # how dataset-initialize wrote the rows
        devices=backend.devices,
        nodes=backend.nodes,
        num_rows=train.num_rows or None,
    )
    log.info("settings %s", plan.settings_path)

    started = time.monotonic()
    outcome = backend.run(plan, total_steps=plan.settings.step_budget)
    wall = time.monotonic() - started

    steps = read_metrics_file(plan.metrics_path) if plan.metrics_path.is_file() else []
    if not steps:
        raise RuntimeError(f"training logged no steps to {plan.metrics_path}: check the step log above")
    diverged = first_divergence(steps)
    if diverged:
        raise diverged
    summary = summarize(steps)
    resumed = read_resumes(plan.metrics_path, steps)
    method = plan.settings.method
    checkpoint = hand_on(run_dir, face.merged_model_dir(run_dir, model_dir), face.last_adapter_state(run_dir))
    same = unchanged(checkpoint, method=method, base_dir=model_dir)
    if same:
        raise WeightsUnchanged(same, len(steps), [s.values["lr"] for s in steps if "lr" in s.values])

    def rel(path: Path) -> str:
        return path.resolve().relative_to(Path(workspace).resolve()).as_posix()

    metrics = run_metrics(summary, steps, wall, resumed)
    resolved = face.read_resolved_config(run_dir)
    base_name = base.repo_id or str(model_dir)
    model_metadata = TunedModel(
        workspace_path=rel(checkpoint.merged_dir or checkpoint.adapter_dir),
        run_dir=rel(run_dir),
        merged_path=rel(checkpoint.merged_dir) if checkpoint.merged_dir else "",
        adapter_path=rel(checkpoint.adapter_dir) if checkpoint.adapter_dir else "",
        metrics_file=rel(plan.metrics_path),
        base_model=base_name,
        base_model_path=base.workspace_path,
        base_model_revision=base.pinned_revision,
        dataset_source=train.source_uri,
        eval_data_path=held_out.workspace_path if held_out else "",
        recipe=plan.recipe,
        config=plan.settings_path.name,
        method=method,
        engine=face.NAME,
        task="" if choice.task == engines.GENERATION else choice.task,
        backend=backend.name,
        device=plan.settings.device if plan.settings.device != "auto" else "",
        dtype="bf16" if resolved.get("settings", {}).get("bf16") else "fp32",
        epochs=plan.settings.epochs,
        steps=len(steps),
        files=checkpoint.files,
        total_bytes=checkpoint.total_bytes,
        final_loss=metrics.get("final_loss"),
        min_loss=metrics.get("min_loss"),
    ).to_metadata()
    files = {
        path.name: path.read_text() for path in (plan.settings_path, plan.resolved_path) if path.is_file()
    }
    files.update(outcome.files)
    return {
        "run": plan,
        "checkpoint": checkpoint,
        "steps": steps,
        "summary": summary,
        "wall_seconds": wall,
        "model_metadata": model_metadata,
        "metrics": metrics,
        "report_html": planned_report(
            choice, plan, steps, metrics, model_metadata, checkpoint, resolved, resumed
        ),
        "config_files": files,
        "train_config": TrainConfig(
            recipe=model_metadata["recipe"], config=plan.settings_path.name, files=sorted(files)
        ).to_metadata(),
    }
