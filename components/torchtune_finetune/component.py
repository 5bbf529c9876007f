"""The torchtune-finetune KFP component (signature + docstring; the implementation is finetune.py)."""

from typing import Optional

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from kfp_finetune.components._shared.images import TRAINER_IMAGE


@dsl.component(
    base_image=TRAINER_IMAGE,
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
    epochs: int = 1,
    max_steps_per_epoch: int = 0,
    batch_size: int = 0,
    gradient_accumulation_steps: int = 0,
    learning_rate: Optional[float] = None,
    weight_decay: Optional[float] = None,
    optimizer: Optional[str] = None,
    optimizer_fused: Optional[bool] = None,
    lr_scheduler: Optional[str] = None,
    num_warmup_steps: int = -1,
    loss: Optional[str] = None,
    device: str = "auto",
    dtype: Optional[str] = None,
    enable_activation_checkpointing: Optional[bool] = None,
    enable_activation_offloading: Optional[bool] = None,
    lora_rank: int = 0,
    lora_alpha: Optional[float] = None,
    lora_dropout: Optional[float] = None,
    lora_attn_modules: Optional[list] = None,
    apply_lora_to_mlp: Optional[bool] = None,
    apply_lora_to_output: Optional[bool] = None,
    save_adapter_weights_only: Optional[bool] = None,
    export_format: str = "merged",
    dataset_type: Optional[str] = None,
    column_map: Optional[dict] = None,
    train_on_input: Optional[bool] = None,
    new_system_prompt: Optional[str] = None,
    conversation_style: Optional[str] = None,
    packed: bool = False,
    max_seq_len: int = 0,
    compile: bool = False,
    seed: int = -1,
    overrides: Optional[dict] = None,
    backend: str = "trainjob",
    runtime_name: str = "torchtune",
    runtime_kind: str = "ClusterTrainingRuntime",
    num_nodes: int = 1,
    num_proc_per_node: int = 0,
    timeout_seconds: int = 86400,
    cleanup_policy: str = "on-success",
    trainer_image: str = "",
    run_id: str = "",
    task_name: str = "finetune",
    workspace_pvc: str = "",
    task_id: str = "",
):
    """Fine-tune a model with torchtune: full, LoRA, QLoRA or DoRA, on any model family torchtune supports.

    Reads the base model folder (config.json, weights, tokenizer) and the dataset, picks the torchtune recipe and
    base config (or uses the ones you name), and writes one complete torchtune YAML to
    `<workspace>/runs/<job>/torchtune_config.yaml` (`<job>`: the TrainJob's name, unique per task instance),
    validated before any GPU time is spent. With backend=trainjob it creates a Kubeflow Trainer TrainJob whose
    node pods mount this workspace, streams the rank-0 log here and waits (a retry of this task re-attaches
    instead of training twice; cancelling the run deletes the TrainJob). With backend=local it trains in this
    step's own process. Parameters left empty (or 0 / -1 where noted) keep the value of torchtune's base config.
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
        epochs: Passes over the training data.
        max_steps_per_epoch: Cap on optimizer steps per epoch; 0: the whole epoch.
        batch_size: Examples per device per step; 0: the base config's.
        gradient_accumulation_steps: Steps accumulated per optimizer update; 0: the base config's.
        learning_rate: Peak learning rate; empty: the base config's.
        weight_decay: Optimizer weight decay; empty: the base config's.
        optimizer: Optimizer component, e.g. torch.optim.AdamW; empty: the base config's.
        optimizer_fused: Use the fused optimizer kernel; empty: the base config's.
        lr_scheduler: Scheduler component, e.g. torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup.
        num_warmup_steps: Learning-rate warmup steps; -1: the base config's.
        loss: Loss component, e.g. torchtune.modules.loss.CEWithChunkedOutputLoss; empty: the base config's.
        device: cuda, cpu, ... or auto (cuda when the task or TrainJob has GPUs, else cpu).
        dtype: bf16, fp16 or fp32; empty: the base config's (fp32 on CPU).
        enable_activation_checkpointing: Recompute activations to save memory; empty: the base config's.
        enable_activation_offloading: Offload activations to CPU memory (CUDA only); empty: the base config's.
        lora_rank: LoRA rank (lora/qlora/dora); 0: the base config's.
        lora_alpha: LoRA scaling alpha; empty: the base config's.
        lora_dropout: Dropout on the LoRA path; empty: the base config's.
        lora_attn_modules: Attention projections with adapters, from q_proj, k_proj, v_proj, output_proj.
        apply_lora_to_mlp: Adapters on the MLP layers too; empty: the base config's.
        apply_lora_to_output: An adapter on the output projection (not for tied embeddings).
        save_adapter_weights_only: Save only the adapter, no merged model (lora/qlora/dora).
        export_format: The format export will publish (merged, adapter or both), checked before training; empty: none.
        dataset_type: instruct, chat or text; empty: from the train_data artifact.
        column_map: Maps torchtune's column names to the data's, e.g. {"input": "question"}.
        train_on_input: Also train on the prompt tokens (default: only the response).
        new_system_prompt: A system prompt prepended to every example.
        conversation_style: openai (messages) or sharegpt (conversations), for chat data.
        packed: Pack examples into max_seq_len sequences (needs max_seq_len).
        max_seq_len: Truncate (or pack) examples to this many tokens; 0: no limit.
        compile: torch.compile the model and loss.
        seed: Random seed; -1: the base config's.
        overrides: Any other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}; '+key' adds, '~key' removes.
        backend: trainjob (a Kubeflow Trainer TrainJob) or local (train in this step's process: on a cluster, with
            the step pod's own resources, so CPU unless GPUs are applied to the pod itself).
        runtime_name: The (Cluster)TrainingRuntime the TrainJob uses (see runtimes/ in kfp-finetune).
        runtime_kind: ClusterTrainingRuntime or TrainingRuntime.
        num_nodes: Nodes (pods) for the TrainJob; more than 1 needs a ReadWriteMany workspace.
        num_proc_per_node: Processes per node; 0: one per GPU requested on this task (1 without GPUs).
        timeout_seconds: The TrainJob is deleted and this step fails after this long; 0: no limit.
        cleanup_policy: Delete the TrainJob on-success (keep failed ones for debugging), always, or never.
        trainer_image: Container image for the TrainJob's node pods; empty: the runtime's image.
        run_id: The KFP run id; pass `dsl.PIPELINE_JOB_ID_PLACEHOLDER` (names the run folder and TrainJob).
        task_name: Readable part of the run folder's and TrainJob's name.
        workspace_pvc: PVC of the workspace, mounted in the TrainJob's node pods at workspace_path; empty: the
            workspace volume KFP forwards through kubernetes_config (KFP >= 2.15).
        task_id: KFP's id of this task; pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (gives each use of this step in a
            run its own run folder and TrainJob; a restarted step re-attaches to its own); empty: not under KFP.

    Returns:
        model: manifest.json; metadata gives `workspace_path` (the merged model, or the adapter with
            save_adapter_weights_only), `merged_path`, `adapter_path`, `run_dir`, base model + revision,
            recipe, config, method, steps, final/min loss, tokens/s, files with sha256.
        metrics: final_loss, min_loss, first_loss, steps, tokens_per_second, trained_tokens_estimate,
            wall_seconds (and peak_memory_gib on GPUs).
        report: Loss, learning-rate and throughput curves with the key settings and the resolved config.
        train_config: A folder with torchtune_config.yaml and, for backend=trainjob, trainjob.yaml.
    """
    parameters = dict(locals())  # taken first: exactly this component's parameters
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.torchtune_finetune.finetune import USAGE_ERRORS, run_component

    with usage_errors(*USAGE_ERRORS):
        run_component(**parameters)
