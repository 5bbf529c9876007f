"""The fine-tuning DAGs: `prepare_inputs` (dataset + model), `tune_and_evaluate` (finetune + evaluate), and
`finetune_pipeline`, built from them, which exports the model only when evaluation says it is better.

Parameters are grouped by stage through their prefixes (data_, model_, tune_, eval_, export_). Every step writes
to the run's workspace, so caching is off (a cached step would point into another run's workspace). Every step
that writes there gets KFP's id of its task instance (`task_id=TASK_ID`), which names what it writes: nested
uses of these DAGs in one run, and sweep trials, never share a folder or a TrainJob.
"""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Dataset, Metrics, Model

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.evaluate.component import evaluate
from kfp_finetune.components.export.component import export
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.preflight.component import preflight
from kfp_finetune.components.quality_gate.component import quality_gate
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune
from kfp_finetune.pipelines import settings

HF_TOKEN_KEYS = {"HF_TOKEN": "HF_TOKEN"}
S3_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
# Resolved by KFP once per task execution: unique per nested use and ParallelFor iteration (see _shared/names.py).
TASK_ID = dsl.PIPELINE_TASK_ID_PLACEHOLDER


def with_credentials(task: dsl.PipelineTask, hf_token_secret, s3_secret) -> dsl.PipelineTask:
    """HF and S3 credentials from Kubernetes Secrets (their names are pipeline parameters; both optional)."""
    kubernetes.use_secret_as_env(
        task, secret_name=hf_token_secret, secret_key_to_env=HF_TOKEN_KEYS, optional=True
    )
    kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_KEYS, optional=True)
    return task


def with_model_cache(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Mount the model cache PVC (settings.MODEL_CACHE_PVC, when set) on a step that reads or fills the cache. The
    fine-tune step forwards its volumes to the TrainJob's node pods, which read a base model used in place there."""
    if settings.MODEL_CACHE_PVC:
        kubernetes.mount_pvc(
            task, pvc_name=settings.MODEL_CACHE_PVC, mount_path=settings.MODEL_CACHE_MOUNT_PATH
        )
    return task


def step(task: dsl.PipelineTask, display_name: str, timeout_seconds: int) -> dsl.PipelineTask:
    task.set_display_name(display_name)
    task.set_caching_options(False)
    kubernetes.set_timeout(task, timeout_seconds)
    return task


def publish(display_name: str, hf_token_secret, s3_secret, **export_arguments) -> dsl.PipelineTask:
    """The export step as every pipeline runs it: time-limited, with credentials from Secrets.

    No KFP-level retry: it cannot tell a typo from a network blip, so a bad destination would fail several times
    over minutes. The export retries transient errors (network, 5xx, throttling) itself, in-process."""
    task = export(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_id=TASK_ID,
        **export_arguments,
    )
    step(task, display_name, settings.EXPORT_TIMEOUT_SECONDS)
    with_model_cache(task)
    return with_credentials(task, hf_token_secret, s3_secret)


def check_first(hf_token_secret, s3_secret, **preflight_arguments) -> dsl.PipelineTask:
    """The pre-flight step, the first of a pipeline: the steps that download `.after()` it. It gets the Secrets and
    volumes the export gets, so it sees the destination as the export will."""
    task = preflight(hf_token_secret=hf_token_secret, s3_secret=s3_secret, **preflight_arguments)
    step(task, "Pre-flight checks", 600)
    with_model_cache(task)
    return with_credentials(task, hf_token_secret, s3_secret)


class PreparedInputs(NamedTuple):
    model: Model
    train: Dataset
    eval: Dataset


@dsl.pipeline(name="prepare-inputs", pipeline_config=settings.pipeline_config())
def prepare_inputs(
    model_uri: str,
    data_uri: str,
    data_type: str = "instruct",
    data_column_map: dict = {},  # noqa: B006 (KFP needs a literal default)
    data_train_split: str = "train",
    data_eval_split: str = "",
    data_eval_fraction: float = 0.05,
    data_seed: int = 42,
    s3_endpoint_url: str = "",
    hf_token_secret: str = "hf-token",
    s3_secret: str = "s3-credentials",
    model_cache_path: str = settings.MODEL_CACHE_PATH,
) -> PreparedInputs:
    """Bring the base model and the dataset into the run workspace, in parallel, verified.

    Args:
        model_uri: Base model: hf://org/repo[@revision], s3://bucket/prefix, or a path on a mounted volume.
        data_uri: Dataset: hf://org/name[@revision], s3://..., https://... (one file), or a path.
        data_type: instruct (input/output or alpaca), chat (messages or conversations) or text.
        data_column_map: Renames the data's columns to the standard ones, e.g. {"input": "question"}.
        data_train_split: Training split, a datasets split expression such as train or train[:5000].
        data_eval_split: A named held-out split; empty: carve data_eval_fraction out of the training split.
        data_eval_fraction: Share of the training split held out for evaluation (seeded).
        data_seed: Seed of the held-out split.
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; empty: AWS or AWS_ENDPOINT_URL.
        hf_token_secret: Kubernetes Secret with key HF_TOKEN (gated/private models); optional.
        s3_secret: Kubernetes Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; optional.
        model_cache_path: A directory on a volume that outlives runs (a PVC mounted on the steps): the base model is
            fetched there once per content and hard-linked or used in place; empty: no cache.
    """
    model_task = model_initialize(
        source_uri=model_uri,
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        s3_endpoint_url=s3_endpoint_url,
        cache_path=model_cache_path,
        task_id=TASK_ID,
    )
    with_model_cache(model_task)
    data_task = dataset_initialize(
        source_uri=data_uri,
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        dataset_type=data_type,
        column_map=data_column_map,
        train_split=data_train_split,
        eval_split=data_eval_split,
        eval_fraction=data_eval_fraction,
        seed=data_seed,
        s3_endpoint_url=s3_endpoint_url,
        task_id=TASK_ID,
    )
    for task, name in ((model_task, "Initialize model"), (data_task, "Initialize dataset")):
        # No KFP-level retry (see `publish`): transient errors are retried in-process, bad input fails at once.
        step(task, name, settings.INITIALIZE_TIMEOUT_SECONDS)
        with_credentials(task, hf_token_secret, s3_secret)
    return PreparedInputs(
        model=model_task.outputs["model"], train=data_task.outputs["train"], eval=data_task.outputs["eval"]
    )


class TunedAndEvaluated(NamedTuple):
    model: Model
    train_metrics: Metrics
    train_report: HTML
    eval_metrics: Metrics
    eval_report: HTML
    eval_samples: Dataset
    passed: bool


@dsl.pipeline(name="tune-and-evaluate", pipeline_config=settings.pipeline_config())
def tune_and_evaluate(
    base_model: Model,
    train_data: Dataset,
    eval_data: Dataset,
    tune_method: str = "lora",
    tune_recipe: str = "",
    tune_config: str = "",
    tune_epochs: int = 1,
    tune_max_steps_per_epoch: int = 0,
    tune_batch_size: int = 0,
    tune_learning_rate: float = 0.0,
    tune_lora_rank: int = 0,
    tune_max_seq_len: int = 0,
    tune_num_warmup_steps: int = -1,
    tune_packed: bool = False,
    tune_seed: int = -1,
    tune_overrides: dict = {},  # noqa: B006
    tune_backend: str = "trainjob",
    tune_device: str = "auto",
    tune_runtime: str = "torchtune",
    tune_num_nodes: int = 1,
    tune_gpus_per_node: int = 1,
    tune_timeout_seconds: int = 86400,
    tune_cleanup_policy: str = "on-success",
    tune_workspace_pvc: str = "",
    tune_run_name: str = "torchtune-finetune",
    eval_max_samples: int = 200,
    eval_max_new_tokens: int = 64,
    eval_gate_metric: str = "eval_loss",
    eval_min_improvement: float = 0.0,
    eval_thresholds: dict = {},  # noqa: B006
    eval_lm_eval_tasks: list = [],  # noqa: B006
    eval_device: str = "auto",
    eval_gpus: int = 0,
    export_format: str = "merged",
) -> TunedAndEvaluated:
    """Fine-tune with torchtune (a Kubeflow Trainer TrainJob by default) and compare the result with the base.

    Args:
        base_model: model-initialize's output.
        train_data: dataset-initialize's train output.
        eval_data: dataset-initialize's eval output (held out).
        tune_method: full, lora, qlora or dora.
        tune_recipe: torchtune recipe; empty: chosen from the method and GPU count.
        tune_config: torchtune config name or YAML path; empty: the model family's config nearest in size.
        tune_epochs: Passes over the training data.
        tune_max_steps_per_epoch: Cap on optimizer steps per epoch; 0: whole epochs.
        tune_batch_size: Examples per device per step; 0: the base config's.
        tune_learning_rate: Peak learning rate; 0: the base config's.
        tune_lora_rank: LoRA rank; 0: the base config's.
        tune_max_seq_len: Truncate (or pack) examples to this many tokens; 0: no limit.
        tune_num_warmup_steps: Learning-rate warmup steps (adds a cosine schedule if the config has none); -1: the config's.
        tune_packed: Pack examples into tune_max_seq_len sequences.
        tune_seed: Random seed; -1: the base config's.
        tune_overrides: Other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}.
        tune_backend: trainjob (Kubeflow Trainer) or local (in the step's own pod; small models).
        tune_device: cuda, cpu or auto (cuda when GPUs are requested).
        tune_runtime: ClusterTrainingRuntime for the TrainJob (see runtimes/).
        tune_num_nodes: TrainJob nodes; more than 1 needs a ReadWriteMany workspace.
        tune_gpus_per_node: GPUs per TrainJob node (nvidia.com/gpu); 0 for CPU training.
        tune_timeout_seconds: The TrainJob is deleted and the step fails after this long; 0: no limit.
        tune_cleanup_policy: on-success (keep failed TrainJobs), always or never.
        tune_workspace_pvc: The workspace's PVC name, when KFP does not forward the workspace volume itself.
        tune_run_name: Readable part of the run folder, TrainJob and eval folder names (KFP's task id keeps them apart).
        eval_max_samples: Held-out rows evaluated; 0: all.
        eval_max_new_tokens: Generation length limit.
        eval_gate_metric: Metric the tuned model must improve over the base (eval_loss, exact_match, ...).
        eval_min_improvement: Required gain on eval_gate_metric; 0: not worse.
        eval_thresholds: Absolute bounds for the tuned model, e.g. {"exact_match": 0.5}.
        eval_lm_eval_tasks: lm-eval-harness tasks to run as well; empty: none.
        eval_device: cuda, cpu or auto.
        eval_gpus: GPUs for the evaluate step.
        export_format: What the model will be exported as (merged, adapter or both): training saves what it needs.
    """
    tune = torchtune_finetune(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        train_data=train_data,
        eval_data=eval_data,
        base_model=base_model,
        method=tune_method,
        recipe=tune_recipe,
        config=tune_config,
        epochs=tune_epochs,
        max_steps_per_epoch=tune_max_steps_per_epoch,
        batch_size=tune_batch_size,
        learning_rate=tune_learning_rate,
        lora_rank=tune_lora_rank,
        max_seq_len=tune_max_seq_len,
        num_warmup_steps=tune_num_warmup_steps,
        packed=tune_packed,
        seed=tune_seed,
        overrides=tune_overrides,
        backend=tune_backend,
        device=tune_device,
        runtime_name=tune_runtime,
        num_nodes=tune_num_nodes,
        timeout_seconds=tune_timeout_seconds,
        cleanup_policy=tune_cleanup_policy,
        workspace_pvc=tune_workspace_pvc,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=tune_run_name,
        task_id=TASK_ID,
        export_format=export_format,
    )
    step(tune, "Fine-tune (torchtune)", settings.TRAIN_STEP_TIMEOUT_SECONDS)
    with_model_cache(tune)
    # Reaches the TrainJob's node pods through the task config, not this launcher pod.
    tune.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(tune_gpus_per_node)

    check = evaluate(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=tune.outputs["model"],
        base_model=base_model,
        eval_data=eval_data,
        max_samples=eval_max_samples,
        max_new_tokens=eval_max_new_tokens,
        gate_metric=eval_gate_metric,
        min_improvement=eval_min_improvement,
        thresholds=eval_thresholds,
        lm_eval_tasks=eval_lm_eval_tasks,
        device=eval_device,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=tune_run_name,
        task_id=TASK_ID,
    )
    step(check, "Evaluate: base vs tuned", settings.EVALUATE_TIMEOUT_SECONDS)
    with_model_cache(check)
    check.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(eval_gpus)
    return TunedAndEvaluated(
        model=tune.outputs["model"],
        train_metrics=tune.outputs["metrics"],
        train_report=tune.outputs["report"],
        eval_metrics=check.outputs["metrics"],
        eval_report=check.outputs["report"],
        eval_samples=check.outputs["samples"],
        passed=check.outputs["passed"],
    )


class FinetuneOutputs(NamedTuple):
    model: Model
    train_metrics: Metrics
    train_report: HTML
    eval_metrics: Metrics
    eval_report: HTML
    eval_samples: Dataset
    passed: bool


@dsl.pipeline(name="finetune-pipeline", pipeline_config=settings.pipeline_config())
def finetune_pipeline(
    model_uri: str,
    data_uri: str,
    export_destination: str,
    data_type: str = "instruct",
    data_column_map: dict = {},  # noqa: B006
    data_train_split: str = "train",
    data_eval_split: str = "",
    data_eval_fraction: float = 0.05,
    data_seed: int = 42,
    tune_method: str = "lora",
    tune_recipe: str = "",
    tune_config: str = "",
    tune_epochs: int = 1,
    tune_max_steps_per_epoch: int = 0,
    tune_batch_size: int = 0,
    tune_learning_rate: float = 0.0,
    tune_lora_rank: int = 0,
    tune_max_seq_len: int = 0,
    tune_num_warmup_steps: int = -1,
    tune_packed: bool = False,
    tune_seed: int = -1,
    tune_overrides: dict = {},  # noqa: B006
    tune_backend: str = "trainjob",
    tune_device: str = "auto",
    tune_runtime: str = "torchtune",
    tune_num_nodes: int = 1,
    tune_gpus_per_node: int = 1,
    tune_timeout_seconds: int = 86400,
    tune_cleanup_policy: str = "on-success",
    tune_workspace_pvc: str = "",
    eval_max_samples: int = 200,
    eval_max_new_tokens: int = 64,
    eval_gate_metric: str = "eval_loss",
    eval_min_improvement: float = 0.0,
    eval_thresholds: dict = {},  # noqa: B006
    eval_lm_eval_tasks: list = [],  # noqa: B006
    eval_device: str = "auto",
    eval_gpus: int = 0,
    export_format: str = "merged",
    export_dtype: str = "",
    export_overwrite: bool = False,
    export_hf_private: bool = True,
    s3_endpoint_url: str = "",
    hf_token_secret: str = "hf-token",
    s3_secret: str = "s3-credentials",
    model_cache_path: str = settings.MODEL_CACHE_PATH,
) -> FinetuneOutputs:
    """Fine-tune an LLM with torchtune and publish it only if it beats the base model.

    A pre-flight step first checks in seconds that the destination is writable, the Secrets' credentials are
    there, gated hub repos are readable and the training runtime exists; then dataset and model initialize in
    parallel into the run's workspace; torchtune-finetune trains (a Kubeflow Trainer TrainJob by default); evaluate compares base and tuned on the held-out split; export runs only when
    the quality gate passes.

    Args:
        model_uri: Base model: hf://org/repo[@revision], s3://bucket/prefix, or a path on a mounted volume.
        data_uri: Dataset: hf://org/name[@revision], s3://..., https://... (one file), or a path.
        export_destination: Where the model goes: s3://bucket/prefix, hf://org/repo, or a path.
        data_type: instruct (input/output or alpaca), chat (messages or conversations) or text.
        data_column_map: Renames the data's columns to the standard ones, e.g. {"input": "question"}.
        data_train_split: Training split, a datasets split expression such as train or train[:5000].
        data_eval_split: A named held-out split; empty: carve data_eval_fraction out of the training split.
        data_eval_fraction: Share of the training split held out for evaluation (seeded).
        data_seed: Seed of the held-out split.
        tune_method: full, lora, qlora or dora.
        tune_recipe: torchtune recipe; empty: chosen from the method and GPU count.
        tune_config: torchtune config name or YAML path; empty: the model family's config nearest in size.
        tune_epochs: Passes over the training data.
        tune_max_steps_per_epoch: Cap on optimizer steps per epoch; 0: whole epochs.
        tune_batch_size: Examples per device per step; 0: the base config's.
        tune_learning_rate: Peak learning rate; 0: the base config's.
        tune_lora_rank: LoRA rank; 0: the base config's.
        tune_max_seq_len: Truncate (or pack) examples to this many tokens; 0: no limit.
        tune_num_warmup_steps: Learning-rate warmup steps (adds a cosine schedule if the config has none); -1: the config's.
        tune_packed: Pack examples into tune_max_seq_len sequences.
        tune_seed: Random seed; -1: the base config's.
        tune_overrides: Other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}.
        tune_backend: trainjob (Kubeflow Trainer) or local (in the step's own pod; small models).
        tune_device: cuda, cpu or auto (cuda when GPUs are requested).
        tune_runtime: ClusterTrainingRuntime for the TrainJob (see runtimes/).
        tune_num_nodes: TrainJob nodes; more than 1 needs a ReadWriteMany workspace.
        tune_gpus_per_node: GPUs per TrainJob node (nvidia.com/gpu); 0 for CPU training.
        tune_timeout_seconds: The TrainJob is deleted and the step fails after this long; 0: no limit.
        tune_cleanup_policy: on-success (keep failed TrainJobs), always or never.
        tune_workspace_pvc: The workspace's PVC name, when KFP does not forward the workspace volume itself.
        eval_max_samples: Held-out rows evaluated; 0: all.
        eval_max_new_tokens: Generation length limit.
        eval_gate_metric: Metric the tuned model must improve over the base (eval_loss, exact_match, ...).
        eval_min_improvement: Required gain on eval_gate_metric; 0: not worse.
        eval_thresholds: Absolute bounds for the tuned model, e.g. {"exact_match": 0.5}.
        eval_lm_eval_tasks: lm-eval-harness tasks to run as well; empty: none.
        eval_device: cuda, cpu or auto.
        eval_gpus: GPUs for the evaluate step.
        export_format: merged (HF safetensors folder), adapter (PEFT) or both.
        export_dtype: Convert weights to bf16, fp16 or fp32 on export; empty: as trained.
        export_overwrite: Replace different content already at the destination.
        export_hf_private: Create hf:// repos as private.
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; empty: AWS or AWS_ENDPOINT_URL.
        hf_token_secret: Kubernetes Secret with key HF_TOKEN (gated/private models, hf:// export); optional.
        s3_secret: Kubernetes Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; optional.
        model_cache_path: A directory on a volume that outlives runs (a PVC mounted on the steps): the base model is
            fetched there once per content and hard-linked or used in place; empty: no cache.
    """
    checked = check_first(
        hf_token_secret,
        s3_secret,
        export_destination=export_destination,
        model_uri=model_uri,
        data_uri=data_uri,
        s3_endpoint_url=s3_endpoint_url,
        tune_backend=tune_backend,
        tune_runtime=tune_runtime,
    )
    inputs = prepare_inputs(
        model_uri=model_uri,
        data_uri=data_uri,
        data_type=data_type,
        data_column_map=data_column_map,
        data_train_split=data_train_split,
        data_eval_split=data_eval_split,
        data_eval_fraction=data_eval_fraction,
        data_seed=data_seed,
        s3_endpoint_url=s3_endpoint_url,
        hf_token_secret=hf_token_secret,
        s3_secret=s3_secret,
        model_cache_path=model_cache_path,
    ).set_display_name("Prepare inputs")
    inputs.after(checked)
    tuned = tune_and_evaluate(
        base_model=inputs.outputs["model"],
        train_data=inputs.outputs["train"],
        eval_data=inputs.outputs["eval"],
        tune_method=tune_method,
        tune_recipe=tune_recipe,
        tune_config=tune_config,
        tune_epochs=tune_epochs,
        tune_max_steps_per_epoch=tune_max_steps_per_epoch,
        tune_batch_size=tune_batch_size,
        tune_learning_rate=tune_learning_rate,
        tune_lora_rank=tune_lora_rank,
        tune_max_seq_len=tune_max_seq_len,
        tune_num_warmup_steps=tune_num_warmup_steps,
        tune_packed=tune_packed,
        tune_seed=tune_seed,
        tune_overrides=tune_overrides,
        tune_backend=tune_backend,
        tune_device=tune_device,
        tune_runtime=tune_runtime,
        tune_num_nodes=tune_num_nodes,
        tune_gpus_per_node=tune_gpus_per_node,
        tune_timeout_seconds=tune_timeout_seconds,
        tune_cleanup_policy=tune_cleanup_policy,
        tune_workspace_pvc=tune_workspace_pvc,
        eval_max_samples=eval_max_samples,
        eval_max_new_tokens=eval_max_new_tokens,
        eval_gate_metric=eval_gate_metric,
        eval_min_improvement=eval_min_improvement,
        eval_thresholds=eval_thresholds,
        eval_lm_eval_tasks=eval_lm_eval_tasks,
        eval_device=eval_device,
        eval_gpus=eval_gpus,
        export_format=export_format,
    ).set_display_name("Tune and evaluate")
    gate = step(
        quality_gate(passed=tuned.outputs["passed"], gate_metric=eval_gate_metric), "Quality gate", 600
    )
    with dsl.If(gate.output == True, name="quality-gate-passed"):  # noqa: E712 (a KFP condition)
        publish(
            "Export model",
            hf_token_secret,
            s3_secret,
            model=tuned.outputs["model"],
            metrics=tuned.outputs["eval_metrics"],
            destination=export_destination,
            format=export_format,
            dtype=export_dtype,
            overwrite=export_overwrite,
            hf_private=export_hf_private,
            s3_endpoint_url=s3_endpoint_url,
        )
    return FinetuneOutputs(
        model=tuned.outputs["model"],
        train_metrics=tuned.outputs["train_metrics"],
        train_report=tuned.outputs["train_report"],
        eval_metrics=tuned.outputs["eval_metrics"],
        eval_report=tuned.outputs["eval_report"],
        eval_samples=tuned.outputs["eval_samples"],
        passed=gate.output,
    )
