"""The torchtune-finetune KFP component (signature + docstring; the implementation is finetune.py)."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(
    base_image=COMPONENT_IMAGE,
    install_kfp_package=False,
    task_config_passthroughs=[
        dsl.TaskConfigField.RESOURCES,
        dsl.TaskConfigField.KUBERNETES_TOLERATIONS,
        dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR,
        dsl.TaskConfigField.KUBERNETES_AFFINITY,
        dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.ENV, apply_to_task=True),
        dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.KUBERNETES_VOLUMES, apply_to_task=True),
    ],
)
def torchtune_finetune(
    workspace_path: str,
    train_data: Input[Dataset],
    base_model: Input[Model],
    model: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    train_config: Output[Artifact],
    kubernetes_config: dsl.TaskConfig,
    eval_data: Input[Dataset] = None,
    method: str = "lora",
    recipe: str = "",
    config: str = "",
    epochs: int = -1,
    max_steps_per_epoch: int = -1,
    batch_size: int = -1,
    gradient_accumulation_steps: int = -1,
    learning_rate: float = -1.0,
    weight_decay: float = -1.0,
    optimizer: str = "",
    optimizer_fused: str = "auto",
    lr_scheduler: str = "",
    num_warmup_steps: int = -1,
    loss: str = "",
    device: str = "auto",
    dtype: str = "",
    enable_activation_checkpointing: str = "auto",
    enable_activation_offloading: str = "auto",
    lora_rank: int = -1,
    lora_alpha: float = -1.0,
    lora_dropout: float = -1.0,
    lora_attn_modules: list = [],  # noqa: B006 (KFP needs a literal default)
    apply_lora_to_mlp: str = "auto",
    apply_lora_to_output: str = "auto",
    lora_target_parameters: list = [],  # noqa: B006
    save_adapter_weights_only: str = "auto",
    export_format: str = "merged",
    dataset_type: str = "",
    column_map: dict = {},  # noqa: B006
    train_on_input: str = "auto",
    new_system_prompt: str = "",
    conversation_style: str = "",
    packed: str = "auto",
    max_seq_len: int = -1,
    compile: str = "auto",
    seed: int = -1,
    resume: str = "auto",
    checkpoint_every_steps: int = -1,
    checkpoint_every_minutes: float = -1.0,
    overrides: dict = {},  # noqa: B006
    engine: str = "auto",
    backend: str = "trainjob",
    runtime_name: str = "auto",
    runtime_kind: str = "ClusterTrainingRuntime",
    num_nodes: int = 1,
    allow_slow_network: bool = False,
    num_proc_per_node: int = 0,
    gpu_memory_gib: float = -1.0,
    timeout_seconds: int = 86400,
    queue_name: str = "",
    priority_class: str = "",
    queue_timeout_seconds: int = 86400,
    cleanup_policy: str = "on-success",
    trainer_image: str = "",
    engine_images: dict = {},  # noqa: B006 (KFP needs a literal default)
    run_id: str = "",
    task_name: str = "finetune",
    workspace_pvc: str = "",
    task_id: str = "",
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "kfp-finetune",
) -> NamedTuple("Outputs", [("model_image", str)]):
    """Fine-tune with torchtune (full, LoRA, QLoRA, DoRA): 0.6.1's families, Qwen3, Gemma 3, SmolLM2, Mistral-Nemo.

    Reads the base model folder (config.json, weights, tokenizer) and the dataset, picks the torchtune recipe and
    base config (or uses the ones you name), and writes one complete torchtune YAML to
    `<workspace>/runs/<job>/torchtune_config.yaml` (`<job>`: the TrainJob's name, unique per task instance),
    validated before any GPU time is spent. With backend=trainjob it creates a Kubeflow Trainer TrainJob whose
    node pods mount this workspace, streams the rank-0 log here and waits (a retry of this task re-attaches
    instead of training twice; cancelling the run deletes the TrainJob). With backend=local it trains in this
    step's own pod, in a child process that checks the run first as TrainJob node pods do and stops when this
    step does, even killed outright. A setting left unset keeps the value of torchtune's base config: -1 for
    numbers, "" for text, [] / {} for lists and mappings, "auto" for on/off settings (which take "auto", "true" or
    "false").
    GPUs, tolerations, node selectors, env and volumes set on this task are forwarded to the TrainJob's node pods.

    Args:
        workspace_path: The run workspace; pass `dsl.WORKSPACE_PATH_PLACEHOLDER`.
        train_data: Training split from dataset-initialize (its metadata gives files and dataset type).
        base_model: Base model from model-initialize.
        kubernetes_config: Filled by KFP from the task's resources, tolerations, node selector, affinity, env
            and volumes; forwarded to the TrainJob.
        eval_data: Held-out split from dataset-initialize; recorded for evaluate (torchtune 0.6.1 recipes have
            no validation loop).
        method: full, lora, qlora (4-bit base + LoRA) or dora.
        recipe: torchtune recipe, e.g. lora_finetune_distributed; empty: chosen from method and device count.
        config: torchtune config name (see `tune ls`) or YAML path for the base hyperparameters; empty: the
            model family's config nearest in size.
        epochs: Passes over the training data; -1: the base config's, raised (to at most 3) where the data
            are too few for 20 optimizer steps.
        max_steps_per_epoch: Cap on optimizer steps per epoch; -1: the base config's (whole epochs).
        batch_size: Examples per device per step; -1: on GPUs whole sequences of about 8-16k tokens per
            micro-batch (down to a floor by model width, 1-8k tokens, where that spares activation checkpointing
            or each GPU's share of the base config's global batch is smaller; 32k on several nodes where it fits
            without it), on CPU the base config's; smaller where the data are too few for 20 optimizer steps.
        gradient_accumulation_steps: Steps accumulated per optimizer update; -1: the base config's tokens per
            optimizer step, fewer where the data are too few for 20 optimizer steps.
        learning_rate: Peak learning rate; -1: the base config's, times the square root of how much larger the
            global batch is than the base config's (at most 2x).
        weight_decay: Optimizer weight decay (0 turns it off); -1: the base config's.
        optimizer: Optimizer component, e.g. torch.optim.AdamW; empty: the base config's.
        optimizer_fused: Use the fused optimizer kernel: true, false or auto (the base config's).
        lr_scheduler: Scheduler component, e.g. torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup;
            empty: the base config's (torchtune's cosine becomes the same cosine with no first step at lr 0).
        num_warmup_steps: Learning-rate warmup steps (0: none); -1: the base config's, at most 5% of the planned
            optimizer steps.
        loss: Loss component, e.g. torchtune.modules.loss.CEWithChunkedOutputLoss; empty: the base config's.
        device: cuda, cpu, ... or auto (cuda when the task or TrainJob has GPUs, else cpu).
        dtype: bf16, fp16 or fp32; empty: the base config's (fp32 on CPU).
        enable_activation_checkpointing: Recompute activations to save memory: true, false or auto (the base
            config's).
        enable_activation_offloading: Offload activations to CPU memory (CUDA only): true, false or auto (the
            base config's).
        lora_rank: LoRA rank (lora/qlora/dora); -1: the base config's.
        lora_alpha: LoRA scaling alpha; -1: the base config's.
        lora_dropout: Dropout on the LoRA path (0 turns it off); -1: the base config's.
        lora_attn_modules: Attention projections with adapters, from q_proj, k_proj, v_proj, output_proj; empty:
            the base config's.
        apply_lora_to_mlp: Adapters on the MLP layers too: true, false or auto (the base config's).
        apply_lora_to_output: An adapter on the output projection (not for tied embeddings): true, false or auto.
        lora_target_parameters: 3D weights that get adapters too, by their name within a layer: a mixture of
            experts' fused experts (e.g. mlp.experts.gate_up_proj, mlp.experts.down_proj; the step log names a
            model's); transformers engine only, with lora_dropout 0; empty: none.
        save_adapter_weights_only: Save only the adapter, no merged model (lora/qlora/dora): true, false or auto
            (true: no GPU idles while the merged model is written at every epoch end; export and evaluate merge
            the adapter into the base after training, on CPU). false: torchtune also writes the merged model at
            every epoch end.
        export_format: The format export will publish (merged, adapter or both), checked before training (adapter
            and both need lora/qlora/dora); empty: none.
        dataset_type: instruct, chat or text; empty: from the train_data artifact.
        column_map: Maps torchtune's column names to the data's, e.g. {"input": "question"}; empty: none.
        train_on_input: Also train on the prompt tokens: true, false or auto (the base config's; usually only
            the response).
        new_system_prompt: A system prompt prepended to every example; empty: none.
        conversation_style: openai (messages) or sharegpt (conversations), for chat data; empty: from the data.
        packed: Pack examples into max_seq_len sequences: true, false or auto (on CUDA: packed where the
            family's attention takes packed batches; elsewhere the base config's).
        max_seq_len: Truncate (or pack) examples to this many tokens; -1: the 99th percentile of the tokenized
            lengths (never set by the single longest row) rounded up to 256, capped by the model
            (dataset-initialize's pack length), on every device; the model's limit where no lengths are known.
            Rows whose prompt fills it train nothing and are counted; more than 1% of the rows is refused.
        compile: torch.compile the model and loss: true, false or auto (on CUDA: on; elsewhere the base
            config's).
        seed: Random seed; -1: the base config's.
        resume: Continue from the newest complete checkpoint in the run folder when the step is retried or its
            TrainJob's pods are replaced (the same steps, learning rates and data order as an uninterrupted
            run): true, false or auto (on). Off: no checkpoints inside an epoch, and a retry starts over.
        checkpoint_every_steps: Save the training state for resuming every this many optimizer steps (0: no
            step interval); -1: none. A checkpoint is also saved when the pod stops (preemption, eviction).
        checkpoint_every_minutes: Save the training state for resuming every this many minutes (0: no time
            interval); -1: every 30 minutes.
        overrides: Any other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}; '+key' adds, '~key' removes;
            empty: none.
        engine: The fine-tuning engine: auto (torchtune for every family it serves, else transformers: TRL's SFT
            trainer with PEFT, for causal LMs transformers builds natively, e.g. mixture-of-experts; the choice
            and its reason are in the log and report; classification data: transformers, which trains a
            sequence classifier), torchtune or transformers.
        backend: trainjob (a Kubeflow Trainer TrainJob) or local (train in this step's process: on a cluster, with
            the step pod's own resources, so CPU unless GPUs are applied to the pod itself). The step runs on the
            component image, which has no torch: for local on a cluster, give the task the trainer image
            (`task.set_container_image(...)`).
        runtime_name: The (Cluster)TrainingRuntime the TrainJob uses (see runtimes/ in kfp-finetune); auto: the
            engine's own (torchtune, or transformers for the transformers engine).
        runtime_kind: ClusterTrainingRuntime or TrainingRuntime.
        num_nodes: Nodes (pods) for the TrainJob; more than 1 needs a ReadWriteMany workspace.
        allow_slow_network: Train on several nodes even when the runtime requests no RDMA network (label
            kfp-finetune.io/network: rdma); otherwise such a TrainJob is refused before it is created.
        num_proc_per_node: Processes per node; 0: one per GPU requested on this task (1 without GPUs).
        gpu_memory_gib: Memory of one training GPU, for the activation checkpointing and micro-batch defaults; -1:
            from the GPU product (nvidia.com/gpu.product) this task's node selector or affinity names, else 80.
        timeout_seconds: The TrainJob is deleted and this step fails after this long; 0: no limit. In a Kueue
            queue, counted from the latest admission.
        queue_name: Kueue LocalQueue the TrainJob waits in for admission (`kubectl get localqueues`); empty: no
            Kueue.
        priority_class: Kueue WorkloadPriorityClass of the TrainJob; empty: the queue's default.
        queue_timeout_seconds: The TrainJob is deleted and this step fails when Kueue has not admitted it after
            this long in its queue (all waits, re-queues after preemption included); 0: no limit.
        cleanup_policy: Delete the TrainJob on-success (keep one that failed by itself, for debugging; one the
            step stopped, e.g. pods that could not start, is deleted), always, or never.
        trainer_image: Container image for the TrainJob's node pods; empty: the runtime's image.
        engine_images: Each engine's trainer image, {"torchtune": ..., "transformers": ...}: what `model_image`
            names for a model that engine trained. The pipelines pass the images they were compiled with
            (KFP_FINETUNE_*_IMAGE); an engine not named: this version's own (kfp-finetune-trainer[-transformers]).
        run_id: The KFP run id; pass `dsl.PIPELINE_JOB_ID_PLACEHOLDER` (names the run folder and TrainJob).
        task_name: Readable part of the run folder's and TrainJob's name.
        workspace_pvc: PVC of the workspace, mounted in the TrainJob's node pods at workspace_path; empty: the
            workspace volume KFP forwards through kubernetes_config (KFP >= 2.15).
        task_id: KFP's id of this task; pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (gives each use of this step in a
            run its own run folder and TrainJob; a restarted step re-attaches to its own); empty: not under KFP.
        mlflow_tracking_uri: MLflow tracking server (http:// or https://, no credentials in it) this step also
            logs to; empty: none, unless KFP made an MLflow run for the task (MLFLOW_TRACKING_URI and MLFLOW_RUN_ID
            in the environment), which is used instead. Credentials: MLFLOW_TRACKING_TOKEN or
            MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD from a Secret.
        mlflow_experiment: The MLflow experiment the run is created in (with mlflow_tracking_uri).

    Returns:
        model: manifest.json; metadata gives `workspace_path` (the merged model, or the adapter when only the
            adapter was saved), `merged_path` (empty until export or evaluate merges the adapter into
            `<run_dir>/merged/`), `adapter_path`, `run_dir`, base model + revision,
            recipe, config, method, steps, final/min loss, tokens/s, files with sha256.
        metrics: final_loss, min_loss, first_loss, steps, tokens_per_second, trained_tokens_estimate,
            wall_seconds (and peak_memory_gib on GPUs).
        report: Loss, learning-rate and throughput curves with the key settings and the resolved config.
        train_config: A folder with torchtune_config.yaml and, for backend=trainjob, trainjob.yaml.
        model_image: The image that loads this model as training did: trainer_image when set, else the trainer
            image of the engine that trained it (also the model's `model_image` metadata). Run evaluate and
            export there: `evaluate(...).set_container_image(tune.outputs["model_image"])` (the pipelines do).
    """
    parameters = dict(locals())  # taken first: exactly this component's parameters
    from collections import namedtuple

    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.torchtune_finetune.finetune import USAGE_ERRORS, run_component

    outputs = namedtuple("Outputs", ["model_image"])
    with usage_errors(*USAGE_ERRORS):
        return outputs(run_component(**parameters).model_metadata["model_image"])
