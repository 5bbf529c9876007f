"""The torchtune-finetune step: resolve the run from the input artifacts, train with the chosen backend (locally or
as a TrainJob: backends/), hand on the checkpoint as `merged/` + `adapter/` (an adapter run: `adapter/` alone, merged
after training by export or evaluate), and report metrics and curves.

Plain Python: the KFP component only unpacks its artifacts and calls `run_finetune`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared import engines, images, tracking, unset
from kfp_finetune.components._shared.artifacts import entry_path
from kfp_finetune.components._shared.cancel import Interrupted
from kfp_finetune.components._shared.contract import (
    ArtifactInput,
    BaseModel,
    DatasetSplit,
    TrainConfig,
    TunedModel,
)
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.launch_settings import DEFAULT_QUEUE_TIMEOUT_SECONDS, queue_problems
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import StepMetrics, read_metrics_file
from kfp_finetune.components._shared.torchtune import face as torchtune_face
from kfp_finetune.components._shared.torchtune.config import SWITCHES, TorchtuneConfig, from_flat
from kfp_finetune.components._shared.torchtune.defaults import TokenLengths, as_metadata
from kfp_finetune.components._shared.torchtune.resolve import ResolvedRun, resolve_run
from kfp_finetune.components._shared.torchtune.run_layout import RESOLVED_CONFIG
from kfp_finetune.components._shared.torchtune.run_length import planned_steps
from kfp_finetune.components._shared.workspace import area_dir, mark_cache_use
from kfp_finetune.components.torchtune_finetune.attempts import INFRASTRUCTURE, RetryRefused, check_retry
from kfp_finetune.components.torchtune_finetune.attempts import record as record_attempt
from kfp_finetune.components.torchtune_finetune.backends import TrainingBackend, backend_for
from kfp_finetune.components.torchtune_finetune.backends.local import TrainingFailed
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobError
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name
from kfp_finetune.components.torchtune_finetune.gpu_memory import gpu_memory_for
from kfp_finetune.components.torchtune_finetune.metrics import (
    LossDiverged,
    first_divergence,
    read_resumes,
    run_metrics,
    summarize,
)
from kfp_finetune.components.torchtune_finetune.network_probe import read_result as read_network
from kfp_finetune.components.torchtune_finetune.outputs import (
    FinalCheckpoint,
    finalize_checkpoint,
    keep_local_copy,
)
from kfp_finetune.components.torchtune_finetune.packs import use_packs
from kfp_finetune.components.torchtune_finetune.planned_run import train_planned
from kfp_finetune.components.torchtune_finetune.report import torchtune_report
from kfp_finetune.components.torchtune_finetune.throughput import measure, read_device
from kfp_finetune.components.torchtune_finetune.warm_start import (
    model_cache_entry,
    persistent_compile_root,
    read_startup,
)
from kfp_finetune.components.torchtune_finetune.weights import WeightsUnchanged, unchanged

log = get_logger(__name__)


@dataclass
class FinetuneResult:
    run: Any  # the engine's plan (backends.LaunchPlan): torchtune's ResolvedRun, or the wing's own
    checkpoint: FinalCheckpoint
    steps: list[StepMetrics]
    summary: dict[str, float]
    wall_seconds: float
    model_metadata: dict
    metrics: dict[str, float]
    report_html: str
    config_files: dict[str, str]  # name -> text for the train_config artifact (the resolved config first)
    train_config: dict  # the train_config artifact's metadata


def workspace_entry(workspace: str | os.PathLike, metadata: dict, what: str) -> Path:
    kind = BaseModel if what == "base_model" else DatasetSplit
    relative = kind.from_metadata(metadata, input_name=what).require("workspace_path", input_name=what)
    path = entry_path(workspace, relative)
    if not path.exists():
        where = "this step's volumes" if Path(relative).is_absolute() else "this run's workspace"
        raise ConfigError(f"{what} points to {path}, which does not exist in {where}")
    return path


def mark_base_model_used(base_model_metadata: dict) -> None:
    """Mark the model cache entry the base model came through used now (workspace.mark_cache_use), so a cache's
    eviction keeps it while this fine-tune reads it in place: where the cache volume is mounted here."""
    entry = model_cache_entry(base_model_metadata)
    if entry is None or not Path(entry).parent.is_dir():
        return  # not from the cache, or read through the workspace's hard links (the volume is not mounted)
    try:
        mark_cache_use(entry)
    except OSError as err:
        log.warning(
            "could not mark the model cache entry %s used (%s): a cache eviction may remove it", entry, err
        )


def training_settings(
    settings: dict[str, Any], train_data: ArtifactInput, workspace: str | os.PathLike
) -> tuple[TorchtuneConfig, list[str]]:
    """The typed config, with the dataset type and files taken from the Dataset artifact unless overridden."""
    split = DatasetSplit.from_metadata(train_data.metadata, input_name="train_data")
    values = {k: v for k, v in settings.items() if v is not None}
    # How the data looks comes from dataset-initialize, unless the step overrides it.
    for key, value in split.torchtune_hints().items():
        values.setdefault(key, value)
    config = from_flat(values)
    _check_fits_data(config, split)
    files = (
        split.data_files if config.dataset.source else split.require("data_files", input_name="train_data")
    )
    data_files = [str(Path(workspace) / f) for f in files]
    missing = [f for f in data_files if not Path(f).is_file()]
    if missing:
        raise ConfigError(f"train_data files are missing from the workspace: {', '.join(missing[:3])}")
    if data_files and not config.dataset.source:
        config.dataset.source = split.format
        config.dataset.data_files = data_files
    return config, data_files


def recorded_lengths(train: DatasetSplit) -> TokenLengths | None:
    """The token lengths dataset-initialize measured on every training row (it tokenizes once, as training does),
    as the figures the max_seq_len rule reads (seq_len.choose_max_seq_len of [p99] and the longest masked prompt
    is the length it packed to)."""
    stats = train.token_stats or {}
    if not stats.get("p99"):
        return None
    rows = int(stats.get("count") or 0)
    return TokenLengths(
        [int(stats["p99"])], rows, f"the 99th percentile of all {rows} rows, from dataset-initialize",
        longest_prompt=int(stats.get("prompt_max") or 0),
    )  # fmt: skip


def _check_fits_data(config: TorchtuneConfig, split: DatasetSplit) -> None:
    """Settings that contradict the data dataset-initialize wrote (its type, its columns) fail now, not in
    torchtune's dataset builder after the model is loaded."""
    written = split.dataset_type
    wanted = config.dataset.dataset_type
    if written and wanted != written and not config.dataset.source:
        raise ConfigError(
            f"dataset_type {wanted!r} contradicts train_data, which dataset-initialize wrote as {written!r} "
            f"(style {split.data_style or '?'}): leave dataset_type unset, or run dataset-initialize "
            f"with dataset_type={wanted!r}"
        )
    columns = split.columns
    if not columns or config.dataset.source:
        return
    named = {f"column_map[{k!r}]": v for k, v in (config.dataset.column_map or {}).items()}
    for key in ("conversation_column", "text_column"):
        if getattr(config.dataset, key):
            named[key] = getattr(config.dataset, key)
    for setting, column in named.items():
        if column not in columns:
            raise ConfigError(
                f"{setting} names column {column!r}, but train_data has the columns {columns} "
                "(dataset-initialize already renamed them to the dataset type's names): remove it from "
                "column_map, or name one of those columns"
            )


def pick_device(requested: str | None, gpus_available: bool) -> str:
    if requested in (None, "", "auto"):
        return "cuda" if gpus_available else "cpu"
    return requested


def run_finetune(
    *,
    workspace: str | os.PathLike,
    train_data: ArtifactInput,
    base_model: ArtifactInput,
    settings: dict[str, Any],
    run_id: str,
    task_name: str,
    backend: TrainingBackend,
    eval_data: ArtifactInput | None = None,
    export_format: str = "",
    task_id: str = "",
    gpu_memory_gib: float | None = None,
    engine: str = engines.AUTO,
) -> FinetuneResult:
    """Validate everything, resolve the run, train with `backend` (see `backends.backend_for`), and build the
    outputs. `export_format` is how the model will be exported (see `resolve_run`); `task_id` is KFP's id of
    this task instance ("": not under KFP); `gpu_memory_gib` one training GPU's memory (None: assumed 80);
    `engine` the engine setting (engines.choose)."""
    model_dir = workspace_entry(workspace, base_model.metadata, "base_model")
    base = BaseModel.from_metadata(base_model.metadata, input_name="base_model")
    train = DatasetSplit.from_metadata(train_data.metadata, input_name="train_data")
    held_out = DatasetSplit.from_metadata(eval_data.metadata, input_name="eval_data") if eval_data else None
    # The TrainJob's name doubles as the run folder's: deterministic per KFP task instance, so a retry finds both
    # and a second instance (a nested use, a ParallelFor iteration) gets its own.
    run_dir = area_dir(workspace, "runs", trainjob_name(run_id, task_name, task_id))
    task = engines.task_of(train.dataset_type)
    choice = engines.choose(model_dir, engines.model_config(model_dir), engine, task)
    log.info("%s", choice.line())
    face = engines.face(choice.engine)
    if hasattr(face, "plan_run"):  # the wing plans its runs from the step's settings (planned_run.py)
        return FinetuneResult(**train_planned(
            face, choice, workspace=workspace, model_dir=model_dir, base=base, train=train, held_out=held_out,
            settings=settings, run_dir=run_dir, backend=backend,
        ))  # fmt: skip
    config, _ = training_settings(settings, train_data, workspace)
    config.device = pick_device(config.device, backend.gpus_available())
    backend.prepare(run_dir, resume_point=torchtune_face.resume_point if config.resume is not False else None)
    resolved = resolve_run(
        config,
        model_dir,
        None,
        run_dir,
        devices=backend.devices,
        nodes=backend.nodes,
        export_format=export_format,
        token_lengths=recorded_lengths(train),
        gpu_memory_gib=gpu_memory_gib,
        # The TrainJob launcher imports no torch: without recorded lengths it estimates them from characters.
        tokenize_sample=backend.name == "local",
        packs=lambda resolved_config: use_packs(resolved_config, train, workspace),
    )
    log.info(
        "recipe %s, base config %s, resolved config %s",
        resolved.recipe,
        resolved.config_name,
        resolved.yaml_path,
    )
    # The same count the warmup cap uses: packing and every device taken into account.
    steps_planned = planned_steps(resolved.config, resolved.world, resolved.token_lengths, train.num_rows)

    started = time.monotonic()
    outcome = backend.run(resolved, total_steps=steps_planned)
    wall = time.monotonic() - started

    steps = read_metrics_file(resolved.metrics_path) if resolved.metrics_path.is_file() else []
    if not steps:
        raise RuntimeError(f"training logged no steps to {resolved.metrics_path}: check the step log above")
    # The backends stop at the first non-finite loss; a run that got past them still hands on no model.
    diverged = first_divergence(steps)
    if diverged:
        raise diverged
    summary = summarize(steps)
    resumed = read_resumes(resolved.metrics_path, steps)
    base_name = base.repo_id or str(model_dir)
    checkpoint = finalize_checkpoint(run_dir, method=config.method, base_model=base_name)
    same = unchanged(checkpoint, method=config.method, base_dir=model_dir)
    if same:
        raise WeightsUnchanged(same, len(steps), [s.values["lr"] for s in steps if "lr" in s.values])

    def rel(path: Path) -> str:
        return path.resolve().relative_to(Path(workspace).resolve()).as_posix()

    speed = measure(
        resolved.config,
        resolved.model.hf_config,
        resolved.model.num_parameters,
        steps,
        read_device(run_dir),
        world_size=backend.devices * backend.nodes if resolved.distributed else 1,
        token_lengths=resolved.token_lengths.lengths if resolved.token_lengths else None,
    )
    log.info("%s", speed.log_line())
    metrics = {**run_metrics(summary, steps, wall, resumed), **speed.metrics()}
    network = read_network(run_dir)
    if network is not None:  # several nodes: the all-reduce probe before training (network_probe.py)
        metrics["allreduce_busbw_gbps"] = round(network.busbw_gbps, 2)
        log.info("%s", network.line())
    startup = read_startup(run_dir)
    if startup is not None:  # the training process's start to its first step (warm_start.py)
        metrics["seconds_to_first_step"] = startup.seconds_to_first_step
        log.info("%s", startup.line())
    model_metadata = TunedModel(
        workspace_path=rel(checkpoint.merged_dir or checkpoint.adapter_dir),
        run_dir=rel(run_dir),
        merged_path=rel(checkpoint.merged_dir) if checkpoint.merged_dir else "",
        adapter_path=rel(checkpoint.adapter_dir) if checkpoint.adapter_dir else "",
        metrics_file=rel(resolved.metrics_path),
        base_model=base_name,
        base_model_path=base.workspace_path,
        base_model_revision=base.pinned_revision,
        dataset_source=train.source_uri,
        eval_data_path=held_out.workspace_path if held_out else "",
        recipe=resolved.recipe,
        config=resolved.config_name or "user file",
        method=config.method,
        engine=torchtune_face.NAME,
        backend=backend.name,
        device=str(resolved.config.get("device") or ""),
        dtype=str(resolved.config.get("dtype") or ""),
        epochs=resolved.config.get("epochs"),
        steps=len(steps),
        files=checkpoint.files,
        total_bytes=checkpoint.total_bytes,
        final_loss=metrics.get("final_loss"),
        min_loss=metrics.get("min_loss"),
        tokens_per_second=metrics.get("tokens_per_second"),
    ).to_metadata()
    return FinetuneResult(
        run=resolved,
        checkpoint=checkpoint,
        steps=steps,
        summary=summary,
        wall_seconds=wall,
        model_metadata=model_metadata,
        metrics=metrics,
        report_html=torchtune_report(resolved, steps, metrics, model_metadata, speed, resumed),
        config_files={RESOLVED_CONFIG: resolved.yaml_path.read_text(), **outcome.files},
        train_config=train_config_metadata(resolved, sorted({RESOLVED_CONFIG, *outcome.files})),
    )


# --- the KFP component's entry point -------------------------------------------------------------------------

# Errors whose message says all the user needs (bad input; a failed or diverged run with its reason and last log
# lines or the usual fixes): the component prints only the message.
USAGE_ERRORS = (ConfigError, TrainingFailed, TrainJobError, LossDiverged, WeightsUnchanged, RetryRefused)


_STEP_PARAMETERS = {
    "workspace_path", "train_data", "base_model", "eval_data", "model", "metrics", "report", "train_config",
    "kubernetes_config", "backend", "runtime_name", "runtime_kind", "num_nodes", "num_proc_per_node",
    "timeout_seconds", "cleanup_policy", "trainer_image", "run_id", "task_name", "task_id", "workspace_pvc",
    "export_format", "gpu_memory_gib", "queue_name", "priority_class", "queue_timeout_seconds", "allow_slow_network",
    "engine", "engine_images", "mlflow_tracking_uri", "mlflow_experiment",
}  # fmt: skip


def component_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The component's training settings with the one "unset" convention read (`_shared/unset.py`): -1, "", [],
    {} and "auto" become None (the base config's value); on/off settings ("auto" | "true" | "false") become
    None / True / False. A 0 stays 0: the typed config refuses it where it is not a valid value."""
    given = {k: v for k, v in params.items() if k not in _STEP_PARAMETERS}
    try:
        return unset.settings_from_parameters(given, switches=SWITCHES)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def train_config_metadata(run: ResolvedRun, files: list[str]) -> dict:
    """The train_config artifact's metadata: the recipe, the config, its files and the defaults chosen."""
    return TrainConfig(
        recipe=run.recipe,
        config=run.config_name or "user file",
        files=files,
        defaults=as_metadata(run.defaults),
    ).to_metadata()


def engine_images(params: dict[str, Any]) -> dict[str, str]:
    """Each engine's trainer image, the engine_images parameter over this version's own; checked before anything
    is read or launched."""
    given = params.get("engine_images") or {}
    if not isinstance(given, dict):
        raise ConfigError(
            'engine_images must map an engine\'s name to an image, e.g. {"torchtune": "reg/img:1"}'
        )
    known = engines.trainer_images()
    for name, reference in given.items():
        if name not in known:
            raise ConfigError(f"engine_images: {name!r} is not an engine: use {', '.join(known)}")
        problem = images.reference_problem(reference) if isinstance(reference, str) else "not a string"
        if problem:
            raise ConfigError(f"engine_images[{name!r}]: {problem}")
    return {**known, **given}


def model_image(params: dict[str, Any], images_by_engine: dict[str, str], engine: str) -> str:
    """The image evaluate and export load the tuned model in (the component's `model_image` output): the one that
    trained it — trainer_image when set, else the engine's own — so its packages build the eval rows and merge
    or convert the weights as training did."""
    return params.get("trainer_image") or images_by_engine[engine or engines.DEFAULT_ENGINE]


def queue_settings(params: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob backend's Kueue settings, checked before anything is read or created (one problem named by
    its parameter fails the step)."""
    queue_name, priority_class = params.get("queue_name", ""), params.get("priority_class", "")
    queue_timeout = params.get("queue_timeout_seconds", DEFAULT_QUEUE_TIMEOUT_SECONDS)
    found = queue_problems(
        queue_name=queue_name, priority_class=priority_class, queue_timeout_seconds=queue_timeout
    )
    if found:  # named as the pipelines name it, as the step's other messages
        raise ConfigError(found[0].named(f"tune_{found[0].setting}"))
    if params["backend"] != "trainjob":
        if queue_name:
            log.info(
                "queue_name %r is not used: backend %s trains in this step's pod",
                queue_name,
                params["backend"],
            )
        return {}
    return {
        "queue_name": queue_name,
        "priority_class": priority_class,
        "queue_timeout": queue_timeout or None,
    }


def run_component(**params: Any) -> FinetuneResult:
    """What the component body calls with all its parameters: the rest of them are training settings. A failure
    is recorded for the task's KFP retry, which trains again only after an infrastructure failure (attempts.py)."""
    run_id = params["run_id"] or "local"
    if not params["run_id"]:  # not under KFP: no retry to sort failures for
        return _run_component(params, run_id)
    run_dir = area_dir(
        params["workspace_path"],
        "runs",
        trainjob_name(run_id, params["task_name"], params.get("task_id", "")),
    )
    check_retry(run_dir)  # an automatic retry after a crash or a bad setting fails at once (attempts.py)
    try:
        return _run_component(params, run_id)
    except ConfigError:
        raise  # refused before anything was downloaded or launched: a retry refuses again, in seconds
    except (Exception, Interrupted) as error:
        attempt = record_attempt(run_dir, error)
        log.info(
            "this attempt failed: %s",
            "a retry trains again" if attempt.outcome == INFRASTRUCTURE else "not retried",
        )
        raise


def _run_component(params: dict[str, Any], run_id: str) -> FinetuneResult:
    from kfp_finetune.components._shared.artifacts import write_artifact
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import (
        trainjob_spec_from_task_config,
        workspace_volume,
    )

    settings = component_settings(params)
    images_by_engine = engine_images(params)
    tracking.check_tracking(params.get("mlflow_tracking_uri", ""))
    pod = trainjob_spec_from_task_config(params["kubernetes_config"])
    if params.get("workspace_pvc") and not any(
        m.get("mountPath") == params["workspace_path"] for m in pod.volume_mounts
    ):
        # KFP without TaskConfig passthrough (or kfp.local) does not hand us the workspace volume: mount the named
        # claim in the node pods at the path this step sees, so the resolved YAML's paths hold there too.
        volume, mount = workspace_volume(params["workspace_pvc"], params["workspace_path"])
        pod.volumes.append(volume)
        pod.volume_mounts.append(mount)
    base_model = ArtifactInput.of(params["base_model"])
    mark_base_model_used(base_model.metadata if base_model else {})
    backend = backend_for(
        params["backend"],
        devices=params["num_proc_per_node"] or max(pod.gpus, 1),
        nodes=params["num_nodes"],
        pod=pod,
        workspace_path=params["workspace_path"],
        runtime=params["runtime_name"],
        runtime_kind=params["runtime_kind"],
        image=params["trainer_image"] or None,
        timeout=params["timeout_seconds"] or None,
        cleanup=params["cleanup_policy"],
        run_id=run_id,
        task_name=params["task_name"],
        task_id=params.get("task_id", ""),
        **queue_settings(params),
        **({"allow_slow_network": True} if params.get("allow_slow_network") else {}),
        persistent_compile_root=persistent_compile_root(base_model.metadata if base_model else {}),
    )

    result = run_finetune(
        workspace=params["workspace_path"],
        train_data=ArtifactInput.of(params["train_data"]),
        base_model=base_model,
        eval_data=ArtifactInput.of(params.get("eval_data")),
        settings=settings,
        run_id=run_id,
        task_name=params["task_name"],
        backend=backend,
        export_format=params.get("export_format", ""),
        task_id=params.get("task_id", ""),
        gpu_memory_gib=gpu_memory_for(params.get("gpu_memory_gib"), pod.node_selector, pod.affinity),
        engine=params.get("engine") or engines.AUTO,
    )
    image = model_image(params, images_by_engine, result.model_metadata.get("engine", ""))
    result.model_metadata["model_image"] = image  # the step's output too; select-best reads it here
    log.info("model_image (evaluate and export load the model there): %s", image)
    kept = keep_local_copy(result.checkpoint, params["task_name"], result.run.model_path)
    if kept:
        log.info("tuned model kept outside the run workspace: %s", kept)
    write_artifact(
        params["model"], {"kind": "finetuned-model", **result.model_metadata}, result.model_metadata
    )
    for name, value in result.metrics.items():
        params["metrics"].log_metric(name, value)
    Path(params["report"].path).parent.mkdir(parents=True, exist_ok=True)
    Path(params["report"].path).write_text(result.report_html)
    config_dir = Path(params["train_config"].path)
    config_dir.mkdir(parents=True, exist_ok=True)
    for name, text in result.config_files.items():
        (config_dir / name).write_text(text)
    params["train_config"].metadata.update(result.train_config)
    log.info("model: %s", json.dumps({k: result.model_metadata[k] for k in ("merged_path", "adapter_path")}))
    tracking.track_step(
        params.get("mlflow_tracking_uri", ""), params.get("mlflow_experiment", ""),
        run_name=f"{run_id}/{params['task_name']}/fine-tune",
        tags={"kfp.run_id": run_id, "kfp.task": params["task_name"], "kfp_finetune.step": "fine-tune"},
        params={k: v for k, v in result.model_metadata.items() if isinstance(v, str | int | float | bool)},
        metrics=result.metrics, steps=result.steps,
        files={"train_config": sorted(config_dir.iterdir())}, texts={"reports/fine-tune.html": result.report_html},
    )  # fmt: skip
    return result
