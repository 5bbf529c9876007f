"""The preflight KFP component (signature + docstring; the implementation is preflight.py and run_settings.py)."""

from kfp import dsl

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def preflight(
    export_destination: str = "",
    model_uri: str = "",
    data_uri: str = "",
    data_type: str = "instruct",
    s3_endpoint_url: str = "",
    hf_token_secret: str = "hf-token",
    s3_secret: str = "s3-credentials",
    tune_engine: str = "auto",
    tune_backend: str = "trainjob",
    tune_runtime: str = "auto",
    tune_runtime_kind: str = "ClusterTrainingRuntime",
    tune_method: str = "lora",
    tune_recipe: str = "",
    tune_config: str = "",
    tune_epochs: int = -1,
    tune_max_steps_per_epoch: int = -1,
    tune_batch_size: int = -1,
    tune_gradient_accumulation_steps: int = -1,
    tune_dtype: str = "",
    tune_learning_rate: float = -1.0,
    tune_optimizer: str = "",
    tune_optimizer_fused: str = "auto",
    tune_weight_decay: float = -1.0,
    tune_lr_scheduler: str = "",
    tune_loss: str = "",
    tune_lora_rank: int = -1,
    tune_lora_alpha: float = -1.0,
    tune_lora_dropout: float = -1.0,
    tune_lora_attn_modules: list = [],  # noqa: B006
    tune_apply_lora_to_mlp: str = "auto",
    tune_apply_lora_to_output: str = "auto",
    tune_lora_target_parameters: list = [],  # noqa: B006
    tune_max_seq_len: int = -1,
    tune_num_warmup_steps: int = -1,
    tune_packed: str = "auto",
    tune_train_on_input: str = "auto",
    tune_new_system_prompt: str = "",
    tune_conversation_style: str = "",
    tune_enable_activation_checkpointing: str = "auto",
    tune_enable_activation_offloading: str = "auto",
    tune_compile: str = "auto",
    tune_seed: int = -1,
    tune_resume: str = "auto",
    tune_checkpoint_every_steps: int = -1,
    tune_checkpoint_every_minutes: float = -1.0,
    tune_overrides: dict = {},  # noqa: B006
    tune_device: str = "auto",
    tune_num_nodes: int = 1,
    tune_gpus_per_node: int = 1,
    tune_gpu_memory_gib: float = -1.0,
    tune_timeout_seconds: int = 86400,
    tune_queue_name: str = "",
    tune_priority_class: str = "",
    tune_queue_timeout_seconds: int = 86400,
    tune_allow_slow_network: bool = False,
    tune_cleanup_policy: str = "on-success",
    tune_trainer_image: str = "",
    eval_max_samples: int = 200,
    eval_max_new_tokens: int = 64,
    eval_gate_metric: str = "eval_loss",
    eval_min_improvement: float = 0.0,
    eval_confidence: float = 0.95,
    eval_thresholds: dict = {},  # noqa: B006
    eval_lm_eval_tasks: list = [],  # noqa: B006
    eval_device: str = "auto",
    eval_gpus: int = -1,
    export_format: str = "merged",
    export_dtype: str = "",
    export_oci_base_image: str = "docker.io/library/busybox:1.37",
    registry_address: str = "",
    registry_model_name: str = "",
    registry_version: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "kfp-finetune",
):
    """Check in seconds, before anything is downloaded or trained, what would otherwise fail a run hours later.

    The first step of the pipelines, on the small CPU image. It checks every tune_, eval_ and export_ parameter
    with the rules the steps apply (types, ranges, finite numbers, closed vocabularies with the nearest value
    for a typo, combinations; the device against the GPU counts; the trainer image reference); fetches the
    model's config.json and tokenizer files, never its weights, checks the family and layout and resolves the
    complete torchtune run as the fine-tune step will (recipe, base config, every key, every `_component_`
    path checked against torchtune's and torch's own names); checks that the credentials the Kubernetes
    Secrets give are in the step's environment (HF_TOKEN for an hf:// destination, AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY for s3:// unless another credential source is configured); that the export
    destination is writable with them (s3://: a small probe object is written under the prefix and deleted;
    hf://: the hub says the token may write to the repo's namespace; a path: a file can be created in the
    folder, or in its nearest existing parent); that hf:// and s3:// model and dataset sources exist, hold files
    and are readable with them (a gated repo's file metadata with the token; an S3 prefix's listing and one
    object's metadata at the endpoint given); and, for tune_backend trainjob, that the TrainingRuntime or
    ClusterTrainingRuntime exists. Every problem found fails the step with one `error:` line listing them all,
    each naming the pipeline parameter and the fix. The step needs the same Secrets (and volumes) as the steps
    it checks for.

    Args:
        export_destination: Where the model will be exported (s3://, hf://, oci:// or a path); empty: not checked.
        model_uri: The base model: an hf:// repo or s3:// prefix is checked for access; its config.json and
            tokenizer files are fetched (no weights) and the run resolved; empty: not checked.
        data_uri: The dataset; an hf:// repo or s3:// prefix is checked for access; empty: not checked.
        data_type: The data's type (instruct, chat, text, classification, multimodal): what the model learns,
            which decides the engine (a classifier or a vision-language model trains on transformers).
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; empty: AWS_ENDPOINT_URL from the environment, else AWS.
        hf_token_secret: Name of the Secret that gives HF_TOKEN (named in the fix when HF_TOKEN is missing).
        s3_secret: Name of the Secret that gives AWS_* (named in the fix when S3 credentials are missing).
        tune_engine: auto (torchtune for the families it serves, else transformers where it builds the model),
            torchtune or transformers; the choice and its reason are logged.
        tune_backend: trainjob (the runtime is checked on the cluster) or local (no cluster needed).
        tune_runtime: The (Cluster)TrainingRuntime the fine-tune's TrainJob will name; auto: the chosen engine's
            (torchtune or transformers).
        tune_runtime_kind: ClusterTrainingRuntime or TrainingRuntime (namespaced, in the step's namespace).
        tune_method: full, lora, qlora (LoRA on a 4-bit base: KEP-2401 quantize_base) or dora (use_dora).
        tune_recipe: torchtune recipe; empty: chosen from the method and GPU count.
        tune_config: torchtune config name or YAML path; empty: the model family's config nearest in size.
        tune_epochs: Passes over the training data; -1: the base config's, raised (to at most 3) where the
            data are too few for 20 optimizer steps.
        tune_max_steps_per_epoch: Cap on optimizer steps per epoch; -1: the base config's (whole epochs).
        tune_batch_size: Examples per device per step; -1: on GPUs whole sequences of about 8-16k tokens per
            micro-batch (down to a floor by model width, 1-8k tokens, where that spares activation checkpointing
            or each GPU's share of the base config's global batch is smaller; 32k on several nodes where it fits
            without it), on CPU the base config's; smaller where the data are too few for 20 optimizer steps.
        tune_gradient_accumulation_steps: Steps accumulated per optimizer update (a larger effective batch);
            -1: the base config's tokens per optimizer step, fewer where the data are too few for 20 optimizer
            steps.
        tune_dtype: bf16, fp16 or fp32; empty: the base config's (fp32 on CPU).
        tune_learning_rate: Peak learning rate; -1: the base config's, times the square root of how much
            larger the global batch is than the base config's (at most 2x).
        tune_optimizer: Optimizer component, e.g. torch.optim.AdamW; empty: the base config's.
        tune_optimizer_fused: Use the fused optimizer kernel: true, false or auto (the base config's).
        tune_weight_decay: Optimizer weight decay (0 turns it off); -1: the base config's.
        tune_lr_scheduler: Learning-rate scheduler component, e.g.
            torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup; empty: the base config's
            (torchtune's cosine becomes the same cosine with no first step at lr 0).
        tune_loss: Loss component, e.g. torchtune.modules.loss.CEWithChunkedOutputLoss; empty: the base
            config's.
        tune_lora_rank: LoRA rank; -1: the base config's.
        tune_lora_alpha: LoRA scaling alpha (usually twice the rank); -1: the base config's.
        tune_lora_dropout: Dropout on the LoRA path (0 turns it off); -1: the base config's.
        tune_lora_attn_modules: Attention projections with LoRA adapters, from q_proj, k_proj, v_proj,
            output_proj; empty: the base config's.
        tune_apply_lora_to_mlp: LoRA adapters on the MLP layers too: true, false or auto (the base config's).
        tune_apply_lora_to_output: A LoRA adapter on the output projection (not with tied embeddings): true,
            false or auto (the base config's).
        tune_lora_target_parameters: 3D weights that get LoRA adapters too, by their name within a layer: a
            mixture of experts' fused experts (e.g. mlp.experts.gate_up_proj, mlp.experts.down_proj; the step log
            names a model's); transformers engine only, with tune_lora_dropout 0; empty: none.
        tune_max_seq_len: Truncate (or pack) examples to this many tokens; -1: the 99th percentile of the
            tokenized lengths (never set by the single longest row) rounded up to 256, capped by the model, on
            every device; rows whose prompt fills it train nothing and are counted (more than 1% of the rows
            is refused).
        tune_num_warmup_steps: Learning-rate warmup steps (0: none; adds a cosine schedule if the config has
            none); -1: the base config's, at most 5% of the planned optimizer steps.
        tune_packed: Pack examples into tune_max_seq_len sequences: true, false or auto (on CUDA: packed where
            the family's attention takes packed batches; elsewhere the base config's).
        tune_train_on_input: Also train on the prompt tokens: true, false or auto (the base config's; usually
            only the response).
        tune_new_system_prompt: A system prompt prepended to every training example; empty: none.
        tune_conversation_style: openai (messages) or sharegpt (conversations), for chat data; empty: from the
            data.
        tune_enable_activation_checkpointing: Recompute activations to save GPU memory: true, false or auto
            (the base config's).
        tune_enable_activation_offloading: Offload activations to CPU memory (CUDA only): true, false or auto
            (the base config's).
        tune_compile: torch.compile the model and loss (faster steps after a slower first one): true, false or
            auto (on CUDA: on; elsewhere the base config's).
        tune_seed: Random seed; -1: the base config's.
        tune_resume: Continue a retried or preempted fine-tune from its newest checkpoint: true, false or auto (on).
        tune_checkpoint_every_steps: Save the training state for resuming every this many optimizer steps (0: no
            step interval); -1: none. Also saved when the pod stops.
        tune_checkpoint_every_minutes: Save the training state for resuming every this many minutes (0: no time
            interval); -1: every 30 minutes.
        tune_overrides: Any other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}; applied last, over the
            typed tune_ settings; empty: none.
        tune_device: cuda, cpu or auto (cuda when GPUs are requested).
        tune_num_nodes: TrainJob nodes; more than 1 needs a ReadWriteMany workspace.
        tune_gpus_per_node: GPUs per TrainJob node (nvidia.com/gpu); 0 for CPU training.
        tune_gpu_memory_gib: Memory of one training GPU for the throughput defaults; -1: from the node
            selector's GPU product, else 80.
        tune_timeout_seconds: The TrainJob is deleted and the step fails after this long; 0: no limit. In a
            Kueue queue, counted from the latest admission.
        tune_queue_name: Kueue LocalQueue the TrainJob waits in for admission (`kubectl get localqueues`);
            empty: no Kueue.
        tune_priority_class: Kueue WorkloadPriorityClass of the TrainJob; empty: the queue's default.
        tune_queue_timeout_seconds: The TrainJob is deleted and the step fails when Kueue has not admitted it
            after this long in its queue (all waits, re-queues after preemption included); 0: no limit.
        tune_allow_slow_network: Allow several TrainJob nodes on a runtime that requests no RDMA network.
        tune_cleanup_policy: on-success (keep TrainJobs that failed by themselves; delete those the step
            stopped), always or never.
        tune_trainer_image: Container image of the TrainJob's node pods, e.g. ghcr.io/org/trainer:1.0; empty:
            the runtime's image.
        eval_max_samples: Held-out rows evaluated; 0: all.
        eval_max_new_tokens: Generation length limit.
        eval_gate_metric: Metric the tuned model must improve over the base (eval_loss, exact_match, ...).
        eval_min_improvement: Required gain on eval_gate_metric, on top of a gain beyond the eval set's noise;
            0: no more.
        eval_confidence: Confidence level (0-1) of the improvement's interval, whose lower bound must be above
            0 to pass.
        eval_thresholds: Absolute bounds for the tuned model, e.g. {"exact_match": 0.5}.
        eval_lm_eval_tasks: lm-eval-harness tasks to run as well; empty: none.
        eval_device: cuda, cpu or auto.
        eval_gpus: GPUs for the evaluate step; -1: one when the fine-tune uses GPUs, else none.
        export_format: merged (HF safetensors folder; an adapter run's adapter is merged into the base at export,
            on CPU), adapter (PEFT) or both.
        export_dtype: Convert weights to bf16, fp16 or fp32 on export; empty: as trained.
        export_oci_base_image: For an oci:// export_destination: the ModelCar's base image, whose manifest must
            be readable.
        registry_address: The Kubeflow Model Registry the model will be registered in: it must answer with the
            token (MODEL_REGISTRY_TOKEN from the Secret named by registry_secret, else the service account's),
            and the version must not be taken; empty: not checked.
        registry_model_name: The registered model's name; empty: export_destination's last part.
        registry_version: The version that will be registered; empty: the run's name (not checked).
        mlflow_tracking_uri: The MLflow tracking server the fine-tune and evaluate steps will log to: a probe run
            is created and deleted in mlflow_experiment (credentials from the Secret named by mlflow_secret);
            empty: not checked.
        mlflow_experiment: The MLflow experiment the steps' runs go to.
    """
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

    settings = {
        "data_type": data_type,
        "tune_method": tune_method,
        "tune_recipe": tune_recipe,
        "tune_config": tune_config,
        "tune_epochs": tune_epochs,
        "tune_max_steps_per_epoch": tune_max_steps_per_epoch,
        "tune_batch_size": tune_batch_size,
        "tune_gradient_accumulation_steps": tune_gradient_accumulation_steps,
        "tune_dtype": tune_dtype,
        "tune_learning_rate": tune_learning_rate,
        "tune_optimizer": tune_optimizer,
        "tune_optimizer_fused": tune_optimizer_fused,
        "tune_weight_decay": tune_weight_decay,
        "tune_lr_scheduler": tune_lr_scheduler,
        "tune_loss": tune_loss,
        "tune_lora_rank": tune_lora_rank,
        "tune_lora_alpha": tune_lora_alpha,
        "tune_lora_dropout": tune_lora_dropout,
        "tune_lora_attn_modules": tune_lora_attn_modules,
        "tune_apply_lora_to_mlp": tune_apply_lora_to_mlp,
        "tune_apply_lora_to_output": tune_apply_lora_to_output,
        "tune_lora_target_parameters": tune_lora_target_parameters,
        "tune_max_seq_len": tune_max_seq_len,
        "tune_num_warmup_steps": tune_num_warmup_steps,
        "tune_packed": tune_packed,
        "tune_train_on_input": tune_train_on_input,
        "tune_new_system_prompt": tune_new_system_prompt,
        "tune_conversation_style": tune_conversation_style,
        "tune_enable_activation_checkpointing": tune_enable_activation_checkpointing,
        "tune_enable_activation_offloading": tune_enable_activation_offloading,
        "tune_compile": tune_compile,
        "tune_seed": tune_seed,
        "tune_resume": tune_resume,
        "tune_checkpoint_every_steps": tune_checkpoint_every_steps,
        "tune_checkpoint_every_minutes": tune_checkpoint_every_minutes,
        "tune_overrides": tune_overrides,
        "tune_device": tune_device,
        "tune_engine": tune_engine,
        "tune_num_nodes": tune_num_nodes,
        "tune_gpus_per_node": tune_gpus_per_node,
        "tune_gpu_memory_gib": tune_gpu_memory_gib,
        "tune_trainer_image": tune_trainer_image,
        "tune_timeout_seconds": tune_timeout_seconds,
        "tune_cleanup_policy": tune_cleanup_policy,
        "tune_queue_name": tune_queue_name,
        "tune_priority_class": tune_priority_class,
        "tune_queue_timeout_seconds": tune_queue_timeout_seconds,
        "tune_allow_slow_network": tune_allow_slow_network,
        "eval_max_samples": eval_max_samples,
        "eval_max_new_tokens": eval_max_new_tokens,
        "eval_gate_metric": eval_gate_metric,
        "eval_min_improvement": eval_min_improvement,
        "eval_confidence": eval_confidence,
        "eval_thresholds": eval_thresholds,
        "eval_lm_eval_tasks": eval_lm_eval_tasks,
        "eval_device": eval_device,
        "eval_gpus": eval_gpus,
        "export_format": export_format,
        "export_dtype": export_dtype,
    }
    with usage_errors(PreflightError):
        run_preflight(
            export_destination=export_destination,
            model_uri=model_uri,
            data_uri=data_uri,
            s3_endpoint_url=s3_endpoint_url,
            hf_token_secret=hf_token_secret,
            s3_secret=s3_secret,
            tune_backend=tune_backend,
            tune_runtime=tune_runtime,
            tune_runtime_kind=tune_runtime_kind,
            settings=settings,
            mlflow_tracking_uri=mlflow_tracking_uri,
            mlflow_experiment=mlflow_experiment,
            export_oci_base_image=export_oci_base_image,
            registry=(registry_address, registry_model_name, registry_version),
        )
