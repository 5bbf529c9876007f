"""`sweep_pipeline`: fine-tune one configuration per (learning rate, LoRA rank), evaluate each, export the best.

Trials share one prepared workspace (dataset and model are fetched once) and run `tune_and_evaluate` in a
bounded `dsl.ParallelFor`; each trial's name keeps its run folder and TrainJob apart from the others.
"""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Model

from kfp_finetune.components.sweep.component import select_best, sweep_grid
from kfp_finetune.pipelines import settings
from kfp_finetune.pipelines.finetune import check_first, prepare_inputs, publish, step, tune_and_evaluate


class SweepOutputs(NamedTuple):
    best_model: Model
    best_eval_metrics: Metrics
    passed: bool


@dsl.pipeline(name="sweep-pipeline", pipeline_config=settings.pipeline_config())
def sweep_pipeline(
    model_uri: str,
    data_uri: str,
    export_destination: str,
    sweep_learning_rates: list = [1e-4, 3e-4],  # noqa: B006 (KFP needs a literal default)
    sweep_lora_ranks: list = [8, 16],  # noqa: B006
    sweep_metric: str = "eval_loss",
    data_type: str = "instruct",
    data_column_map: dict = {},  # noqa: B006
    data_train_split: str = "train",
    data_eval_split: str = "",
    data_eval_fraction: float = 0.05,
    data_seed: int = 42,
    tune_method: str = "lora",
    tune_config: str = "",
    tune_epochs: int = 1,
    tune_max_steps_per_epoch: int = 0,
    tune_batch_size: int = 0,
    tune_max_seq_len: int = 0,
    tune_num_warmup_steps: int = -1,
    tune_seed: int = -1,
    tune_overrides: dict = {},  # noqa: B006
    tune_backend: str = "trainjob",
    tune_device: str = "auto",
    tune_runtime: str = "torchtune",
    tune_num_nodes: int = 1,
    tune_gpus_per_node: int = 1,
    tune_timeout_seconds: int = 86400,
    eval_max_samples: int = 200,
    eval_max_new_tokens: int = 64,
    eval_gate_metric: str = "eval_loss",
    eval_min_improvement: float = 0.0,
    eval_device: str = "auto",
    eval_gpus: int = 0,
    export_format: str = "merged",
    export_dtype: str = "",
    export_overwrite: bool = False,
    s3_endpoint_url: str = "",
    hf_token_secret: str = "hf-token",
    s3_secret: str = "s3-credentials",
    model_cache_path: str = settings.MODEL_CACHE_PATH,
) -> SweepOutputs:
    """Sweep learning rate x LoRA rank with torchtune, evaluate every trial, export only the best.

    A pre-flight step first checks the export destination, the Secrets' credentials, gated hub repos and the
    training runtime, in seconds; the model and dataset are fetched only when it passes.

    Args:
        model_uri: Base model: hf://org/repo[@revision], s3://bucket/prefix, or a path on a mounted volume.
        data_uri: Dataset: hf://org/name[@revision], s3://..., https://... (one file), or a path.
        export_destination: Where the best model goes: s3://bucket/prefix, hf://org/repo, or a path.
        sweep_learning_rates: Peak learning rates to try; 0 keeps the torchtune config's.
        sweep_lora_ranks: LoRA ranks to try; 0 keeps the torchtune config's (use [0] for full fine-tuning).
        sweep_metric: Evaluate metric that picks the best trial (eval_loss, perplexity, exact_match, ...).
        data_type: instruct (input/output or alpaca), chat (messages or conversations) or text.
        data_column_map: Renames the data's columns to the standard ones, e.g. {"input": "question"}.
        data_train_split: Training split, a datasets split expression such as train or train[:5000].
        data_eval_split: A named held-out split; empty: carve data_eval_fraction out of the training split.
        data_eval_fraction: Share of the training split held out for evaluation (seeded).
        data_seed: Seed of the held-out split.
        tune_method: full, lora, qlora or dora.
        tune_config: torchtune config name or YAML path; empty: the model family's config nearest in size.
        tune_epochs: Passes over the training data.
        tune_max_steps_per_epoch: Cap on optimizer steps per epoch; 0: whole epochs.
        tune_batch_size: Examples per device per step; 0: the base config's.
        tune_max_seq_len: Truncate examples to this many tokens; 0: no limit.
        tune_num_warmup_steps: Learning-rate warmup steps (adds a cosine schedule if the config has none); -1: the config's.
        tune_seed: Random seed; -1: the base config's.
        tune_overrides: Other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}.
        tune_backend: trainjob (Kubeflow Trainer) or local (in the step's own pod; small models).
        tune_device: cuda, cpu or auto (cuda when GPUs are requested).
        tune_runtime: ClusterTrainingRuntime for the TrainJobs (see runtimes/).
        tune_num_nodes: Nodes per TrainJob; more than 1 needs a ReadWriteMany workspace.
        tune_gpus_per_node: GPUs per TrainJob node (nvidia.com/gpu); 0 for CPU training.
        tune_timeout_seconds: Each TrainJob is deleted and its step fails after this long; 0: no limit.
        eval_max_samples: Held-out rows evaluated per trial; 0: all.
        eval_max_new_tokens: Generation length limit.
        eval_gate_metric: Metric each trial must improve over the base for its gate.
        eval_min_improvement: Required gain on eval_gate_metric; 0: not worse.
        eval_device: cuda, cpu or auto.
        eval_gpus: GPUs for each evaluate step.
        export_format: merged (HF safetensors folder), adapter (PEFT) or both.
        export_dtype: Convert weights to bf16, fp16 or fp32 on export; empty: as trained.
        export_overwrite: Replace different content already at the destination.
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; empty: AWS or AWS_ENDPOINT_URL.
        hf_token_secret: Kubernetes Secret with key HF_TOKEN; optional.
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
    grid = step(
        sweep_grid(learning_rates=sweep_learning_rates, lora_ranks=sweep_lora_ranks), "Sweep grid", 600
    )
    with dsl.ParallelFor(grid.output, parallelism=settings.SWEEP_PARALLELISM, name="trials") as trial:
        tuned = tune_and_evaluate(
            base_model=inputs.outputs["model"],
            train_data=inputs.outputs["train"],
            eval_data=inputs.outputs["eval"],
            tune_method=tune_method,
            tune_config=tune_config,
            tune_epochs=tune_epochs,
            tune_max_steps_per_epoch=tune_max_steps_per_epoch,
            tune_batch_size=tune_batch_size,
            tune_learning_rate=trial.learning_rate,
            tune_lora_rank=trial.lora_rank,
            tune_max_seq_len=tune_max_seq_len,
            tune_num_warmup_steps=tune_num_warmup_steps,
            tune_seed=tune_seed,
            tune_overrides=tune_overrides,
            tune_backend=tune_backend,
            tune_device=tune_device,
            tune_runtime=tune_runtime,
            tune_num_nodes=tune_num_nodes,
            tune_gpus_per_node=tune_gpus_per_node,
            tune_timeout_seconds=tune_timeout_seconds,
            tune_run_name=trial.trial_name,
            eval_max_samples=eval_max_samples,
            eval_max_new_tokens=eval_max_new_tokens,
            eval_gate_metric=eval_gate_metric,
            eval_min_improvement=eval_min_improvement,
            eval_device=eval_device,
            eval_gpus=eval_gpus,
            export_format=export_format,
        ).set_display_name("Trial: tune and evaluate")
    best = select_best(
        models=dsl.Collected(tuned.outputs["model"]),
        eval_metrics=dsl.Collected(tuned.outputs["eval_metrics"]),
        metric=sweep_metric,
    )
    step(best, "Select the best trial", 600)
    with dsl.If(best.outputs["Output"] == True, name="best-trial-passed"):  # noqa: E712 (a KFP condition)
        publish(
            "Export the best model",
            hf_token_secret,
            s3_secret,
            model=best.outputs["best_model"],
            metrics=best.outputs["best_metrics"],
            destination=export_destination,
            format=export_format,
            dtype=export_dtype,
            overwrite=export_overwrite,
            s3_endpoint_url=s3_endpoint_url,
        )
    return SweepOutputs(
        best_model=best.outputs["best_model"],
        best_eval_metrics=best.outputs["best_metrics"],
        passed=best.outputs["Output"],
    )
