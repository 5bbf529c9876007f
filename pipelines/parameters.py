"""The one table of pipeline parameters, and the factory that turns a DAG body into a KFP pipeline from it.

Each parameter is declared once here: its name, type, default, the component argument(s) it feeds and its one
line of UI text. `pipeline(...)` gives a DAG body the real Python signature KFP reads (`inspect.Signature`) and a
docstring whose Args section is built from the table, so the four pipelines (finetune-pipeline, prepare-inputs,
tune-and-evaluate, sweep-pipeline) cannot drift apart. A body receives the parameters as one `Values` object and
passes them on with `values.feeding("component")` (the component arguments the table says they feed) or
`values.arguments_for(sub_pipeline)` (the sub-DAG's own parameters). tests/pipelines/test_parameter_table.py checks every
`feeds` entry against the component's signature (the argument exists, with the same type and default).

Parameters are grouped by stage through their prefixes: data_, model_, tune_, eval_, export_, sweep_; access
settings (credentials, endpoints) have none.

Optional settings follow the one "unset" convention of components/_shared/unset.py, the same in the components,
these pipelines and the sweep: -1 for numbers, "" for text, [] / {} for lists and mappings, "auto" for on/off
settings ("auto" | "true" | "false"); unset keeps the base torchtune config's value.
"""

# No `from __future__ import annotations`: KFP reads the signatures' annotations as types.

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kfp import dsl
from kfp.dsl import Dataset, Model

from kfp_finetune.pipelines import settings

REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Parameter:
    """One pipeline parameter: `doc` is its UI text; `feeds` lists the `component.argument`s it is passed to."""

    name: str
    type: Any
    default: Any
    doc: str
    feeds: tuple[str, ...] = ()

    @property
    def group(self) -> str:
        if self.type in (Model, Dataset):
            return "artifacts"
        prefix = self.name.split("_", 1)[0]
        return prefix if prefix in GROUPS else "access"


GROUPS = ("model", "data", "tune", "eval", "export", "sweep")


def _p(name: str, type_: Any, default: Any, doc: str, *feeds: str) -> Parameter:
    return Parameter(name, type_, default, doc, feeds)


TABLE: tuple[Parameter, ...] = (
    # --- what every run needs ---------------------------------------------------------------------------------
    _p("model_uri", str, REQUIRED,
       "Base model: hf://org/repo[@revision], s3://bucket/prefix, oci://registry/repository:tag (a ModelCar), or "
       "a path on a mounted volume.",
       "model_initialize.source_uri", "preflight.model_uri", "dataset_initialize.base_model_uri"),
    _p("data_uri", str, REQUIRED,
       "Dataset: hf://org/name[@revision], s3://..., https://... (one file), or a path.",
       "dataset_initialize.source_uri", "preflight.data_uri"),
    _p("export_destination", str, REQUIRED,
       "Where the model goes: s3://bucket/prefix, hf://org/repo, oci://registry/repository:tag (a KServe "
       "ModelCar image), or a path.",
       "export.destination", "preflight.export_destination"),
    # --- the sub-DAG tune-and-evaluate's artifact inputs --------------------------------------------------------
    _p("base_model", Model, REQUIRED, "model-initialize's output."),
    _p("train_data", Dataset, REQUIRED, "dataset-initialize's train output."),
    _p("eval_data", Dataset, REQUIRED, "dataset-initialize's eval output (held out)."),
    # --- sweep ------------------------------------------------------------------------------------------------
    _p("sweep_learning_rates", list, [1e-4, 3e-4], "Peak learning rates to try; -1 keeps the base config's.",
       "sweep_grid.learning_rates"),
    _p("sweep_lora_ranks", list, [8, 16],
       "LoRA ranks to try; -1 keeps the base config's (use [-1] for full fine-tuning).",
       "sweep_grid.lora_ranks"),
    _p("sweep_metric", str, "eval_loss",
       "Evaluate metric that picks the best trial (eval_loss, perplexity, exact_match, ...).",
       "select_best.metric"),
    # --- data -------------------------------------------------------------------------------------------------
    _p("data_type", str, "instruct",
       "instruct (input/output or alpaca), chat (messages or conversations), text, classification (text + label: "
       "trains a sequence classifier), or multimodal (instruct or chat rows + images: trains a vision-language "
       "model).",
       "dataset_initialize.dataset_type", "preflight.data_type"),
    _p("data_column_map", dict, {},
       'Renames the data\'s columns to the standard ones, e.g. {"input": "question"}.',
       "dataset_initialize.column_map"),
    _p("data_image_dir", str, "",
       "Multimodal: the folder inside the source that the rows' image paths are relative to; empty: the source's "
       "root.",
       "dataset_initialize.image_dir"),
    _p("data_image_tag", str, "<image>",
       "Multimodal: the placeholder in the text where each image goes, in order; empty: the images come before "
       "the first user turn.",
       "dataset_initialize.image_tag"),
    _p("data_train_split", str, "train",
       "Training split, a datasets split expression such as train or train[:5000].",
       "dataset_initialize.train_split"),
    _p("data_eval_split", str, "",
       "A named held-out split, e.g. test; empty: carve data_eval_fraction out of the training split.",
       "dataset_initialize.eval_split"),
    _p("data_eval_fraction", float, -1.0,
       "Share of the training split held out for evaluation (seeded); 0: none; -1: 0.05 unless data_eval_split "
       "is set.",
       "dataset_initialize.eval_fraction"),
    _p("data_seed", int, 42, "Seed of the held-out split.", "dataset_initialize.seed"),
    _p("data_format", str, "",
       "json, jsonl, csv, tsv, parquet, arrow or text; empty: from the file names (parquet first in a folder "
       "with several).",
       "dataset_initialize.data_format"),
    _p("data_csv_delimiter", str, "",
       "Column separator of CSV/TSV files, one character such as ; (\\t for a tab); empty: a comma for .csv, a tab "
       "for .tsv.",
       "dataset_initialize.csv_delimiter"),
    _p("data_subset", str, "",
       "The config (subset) of a Hub dataset or of a folder whose README.md declares several; empty: its default.",
       "dataset_initialize.subset"),
    # --- tune -------------------------------------------------------------------------------------------------
    _p("tune_method", str, "lora",
       "full, lora, qlora (LoRA on a 4-bit base: KEP-2401 quantize_base) or dora (use_dora).",
       "torchtune_finetune.method", "preflight.tune_method"),
    _p("tune_recipe", str, "", "torchtune recipe; empty: chosen from the method and GPU count.",
       "torchtune_finetune.recipe", "preflight.tune_recipe"),
    _p("tune_config", str, "",
       "torchtune config name or YAML path; empty: the model family's config nearest in size.",
       "torchtune_finetune.config", "preflight.tune_config"),
    _p("tune_epochs", int, -1,
       "Passes over the training data; -1: the base config's, raised (to at most 3) where the data are too few "
       "for 20 optimizer steps.",
       "torchtune_finetune.epochs", "preflight.tune_epochs"),
    _p("tune_max_steps_per_epoch", int, -1, "Cap on optimizer steps per epoch; -1: the base config's (whole epochs).",
       "torchtune_finetune.max_steps_per_epoch", "preflight.tune_max_steps_per_epoch"),
    _p("tune_batch_size", int, -1,
       "Examples per device per step; -1: on GPUs whole sequences of about 8-16k tokens per micro-batch (down to a "
       "floor by model width, 1-8k tokens, where that spares activation checkpointing or each GPU's share of the "
       "base config's global batch is smaller; 32k on several nodes where it fits without it), on CPU the base "
       "config's (transformers engine: 8, as for image + text rows); smaller where the data are too few for 20 "
       "optimizer steps.",
       "torchtune_finetune.batch_size", "preflight.tune_batch_size",
       "dataset_initialize.batch_size"),
    _p("tune_gradient_accumulation_steps", int, -1,
       "Steps accumulated per optimizer update (a larger effective batch); -1: the base config's tokens per "
       "optimizer step, fewer where the data are too few for 20 optimizer steps.",
       "torchtune_finetune.gradient_accumulation_steps", "preflight.tune_gradient_accumulation_steps",
       "dataset_initialize.gradient_accumulation_steps"),
    _p("tune_dtype", str, "", "bf16, fp16 or fp32; empty: the base config's (fp32 on CPU).", "torchtune_finetune.dtype", "preflight.tune_dtype"),
    _p("tune_learning_rate", float, -1.0,
       "Peak learning rate; -1: the base config's (transformers engine: 2e-4 for 8 rows per device), times the "
       "square root of how much larger the global batch is than the base config's (at most 2x).",
       "torchtune_finetune.learning_rate", "preflight.tune_learning_rate"),
    _p("tune_optimizer", str, "", "Optimizer component, e.g. torch.optim.AdamW; empty: the base config's.",
       "torchtune_finetune.optimizer", "preflight.tune_optimizer"),
    _p("tune_optimizer_fused", str, "auto", "Use the fused optimizer kernel: true, false or auto (the base config's).",
       "torchtune_finetune.optimizer_fused", "preflight.tune_optimizer_fused"),
    _p("tune_weight_decay", float, -1.0, "Optimizer weight decay (0 turns it off); -1: the base config's.",
       "torchtune_finetune.weight_decay", "preflight.tune_weight_decay"),
    _p("tune_lr_scheduler", str, "",
       "Learning-rate scheduler component, e.g. torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup; "
       "empty: the base config's (torchtune's cosine becomes the same cosine with no first step at lr 0).",
       "torchtune_finetune.lr_scheduler", "preflight.tune_lr_scheduler"),
    _p("tune_loss", str, "",
       "Loss component, e.g. torchtune.modules.loss.CEWithChunkedOutputLoss; empty: the base config's.",
       "torchtune_finetune.loss", "preflight.tune_loss"),
    _p("tune_lora_rank", int, -1, "LoRA rank; -1: the base config's.", "torchtune_finetune.lora_rank", "preflight.tune_lora_rank"),
    _p("tune_lora_alpha", float, -1.0, "LoRA scaling alpha (usually twice the rank); -1: the base config's.",
       "torchtune_finetune.lora_alpha", "preflight.tune_lora_alpha"),
    _p("tune_lora_dropout", float, -1.0, "Dropout on the LoRA path (0 turns it off); -1: the base config's.",
       "torchtune_finetune.lora_dropout", "preflight.tune_lora_dropout"),
    _p("tune_lora_attn_modules", list, [],
       "Attention projections with LoRA adapters, from q_proj, k_proj, v_proj, output_proj; empty: the base config's.",
       "torchtune_finetune.lora_attn_modules", "preflight.tune_lora_attn_modules"),
    _p("tune_apply_lora_to_mlp", str, "auto",
       "LoRA adapters on the MLP layers too: true, false or auto (the base config's).",
       "torchtune_finetune.apply_lora_to_mlp", "preflight.tune_apply_lora_to_mlp"),
    _p("tune_apply_lora_to_output", str, "auto",
       "A LoRA adapter on the output projection (not with tied embeddings): true, false or auto (the base config's).",
       "torchtune_finetune.apply_lora_to_output", "preflight.tune_apply_lora_to_output"),
    _p("tune_lora_target_parameters", list, [],
       "3D weights that get LoRA adapters too, by their name within a layer: a mixture of experts' fused experts "
       "(e.g. mlp.experts.gate_up_proj, mlp.experts.down_proj; the step log names a model's); transformers engine "
       "only, with tune_lora_dropout 0; empty: none.",
       "torchtune_finetune.lora_target_parameters", "preflight.tune_lora_target_parameters"),
    _p("tune_max_seq_len", int, -1,
       "Truncate (or pack) examples to this many tokens; -1: the 99th percentile of the tokenized lengths "
       "(never set by the single longest row) rounded up to 256, capped by the model, on every device; rows "
       "whose prompt fills it train nothing and are counted (more than 1% of the rows is refused).",
       "torchtune_finetune.max_seq_len", "dataset_initialize.max_seq_len", "preflight.tune_max_seq_len"),
    _p("tune_num_warmup_steps", int, -1,
       "Learning-rate warmup steps (0: none; adds a cosine schedule if the config has none); -1: the base config's, "
       "at most 5% of the planned optimizer steps.",
       "torchtune_finetune.num_warmup_steps", "preflight.tune_num_warmup_steps"),
    _p("tune_packed", str, "auto",
       "Pack examples into tune_max_seq_len sequences: true, false or auto (on CUDA: packed where the family's "
       "attention takes packed batches; elsewhere the base config's).",
       "torchtune_finetune.packed", "preflight.tune_packed"),
    _p("tune_train_on_input", str, "auto",
       "Also train on the prompt tokens: true, false or auto (the base config's; usually only the response).",
       "torchtune_finetune.train_on_input", "dataset_initialize.train_on_input", "preflight.tune_train_on_input"),
    _p("tune_new_system_prompt", str, "", "A system prompt prepended to every training example; empty: none.",
       "torchtune_finetune.new_system_prompt", "dataset_initialize.new_system_prompt", "preflight.tune_new_system_prompt"),
    _p("tune_conversation_style", str, "",
       "openai (messages) or sharegpt (conversations), for chat data; empty: from the data.",
       "torchtune_finetune.conversation_style", "preflight.tune_conversation_style"),
    _p("tune_enable_activation_checkpointing", str, "auto",
       "Recompute activations to save GPU memory: true, false or auto (the base config's).",
       "torchtune_finetune.enable_activation_checkpointing", "preflight.tune_enable_activation_checkpointing"),
    _p("tune_enable_activation_offloading", str, "auto",
       "Offload activations to CPU memory (CUDA only): true, false or auto (the base config's).",
       "torchtune_finetune.enable_activation_offloading", "preflight.tune_enable_activation_offloading"),
    _p("tune_compile", str, "auto",
       "torch.compile the model and loss (faster steps after a slower first one): true, false or auto (on CUDA: "
       "on; elsewhere the base config's).",
       "torchtune_finetune.compile", "preflight.tune_compile"),
    _p("tune_seed", int, -1, "Random seed; -1: the base config's.", "torchtune_finetune.seed", "preflight.tune_seed"),
    _p("tune_resume", str, "auto",
       "Continue a retried or preempted fine-tune from its newest checkpoint (the same steps, learning rates and "
       "data order as an uninterrupted run): true, false or auto (on).",
       "torchtune_finetune.resume", "preflight.tune_resume"),
    _p("tune_checkpoint_every_steps", int, -1,
       "Save the training state for resuming every this many optimizer steps (0: no step interval); -1: none. "
       "Also saved when the pod stops (preemption, eviction).",
       "torchtune_finetune.checkpoint_every_steps", "preflight.tune_checkpoint_every_steps"),
    _p("tune_checkpoint_every_minutes", float, -1.0,
       "Save the training state for resuming every this many minutes (0: no time interval); -1: every 30 minutes.",
       "torchtune_finetune.checkpoint_every_minutes", "preflight.tune_checkpoint_every_minutes"),
    _p("tune_overrides", dict, {},
       'Any other torchtune keys, dotted, e.g. {"clip_grad_norm": 1.0}; applied last, over the typed tune_ settings; empty: none.',
       "torchtune_finetune.overrides", "preflight.tune_overrides"),
    _p("tune_engine", str, "auto",
       "Fine-tuning engine: auto (torchtune for the families it serves, else transformers + TRL where it builds "
       "the model, e.g. mixture-of-experts), torchtune or transformers.",
       "torchtune_finetune.engine", "preflight.tune_engine"),
    _p("tune_backend", str, "trainjob", "trainjob (Kubeflow Trainer) or local (in the step's own pod; small models).",
       "torchtune_finetune.backend", "preflight.tune_backend"),
    _p("tune_device", str, "auto", "cuda, cpu or auto (cuda when GPUs are requested).", "torchtune_finetune.device", "preflight.tune_device"),
    _p("tune_runtime", str, "auto", "ClusterTrainingRuntime for the TrainJob (see runtimes/); auto: the engine's own (torchtune or transformers).",
       "torchtune_finetune.runtime_name", "preflight.tune_runtime"),
    _p("tune_num_nodes", int, 1, "TrainJob nodes; more than 1 needs a ReadWriteMany workspace.",
       "torchtune_finetune.num_nodes", "preflight.tune_num_nodes"),
    _p("tune_allow_slow_network", bool, False,
       "Train on several nodes even when the runtime requests no RDMA network (kfp-finetune.io/network: rdma); "
       "otherwise refused before any download.",
       "torchtune_finetune.allow_slow_network", "preflight.tune_allow_slow_network"),
    _p("tune_gpus_per_node", int, 1, "GPUs per TrainJob node (nvidia.com/gpu); 0 for CPU training.",
       "gpu_counts.tune_gpus_per_node", "preflight.tune_gpus_per_node"),
    _p("tune_gpu_memory_gib", float, -1.0,
       "Memory of one training GPU for the throughput defaults; -1: from the node selector's GPU product, else 80.",
       "torchtune_finetune.gpu_memory_gib", "preflight.tune_gpu_memory_gib"),
    _p("tune_timeout_seconds", int, 86400, "The TrainJob is deleted and the step fails after this long; 0: no limit.",
       "torchtune_finetune.timeout_seconds", "preflight.tune_timeout_seconds"),
    _p("tune_queue_name", str, "",
       "Kueue LocalQueue the TrainJob waits in for admission (`kubectl get localqueues`); empty: no Kueue.",
       "torchtune_finetune.queue_name", "preflight.tune_queue_name"),
    _p("tune_priority_class", str, "", "Kueue WorkloadPriorityClass of the TrainJob; empty: the queue's default.",
       "torchtune_finetune.priority_class", "preflight.tune_priority_class"),
    _p("tune_queue_timeout_seconds", int, 86400,
       "The TrainJob is deleted and the step fails when Kueue has not admitted it after this long in its queue "
       "(re-queues after preemption included); 0: no limit.",
       "torchtune_finetune.queue_timeout_seconds", "preflight.tune_queue_timeout_seconds"),
    _p("tune_cleanup_policy", str, "on-success", "on-success (keep TrainJobs that failed by themselves; delete those the step stopped), always or never.",
       "torchtune_finetune.cleanup_policy", "preflight.tune_cleanup_policy"),
    _p("tune_trainer_image", str, "",
       "Container image of the TrainJob's node pods, e.g. ghcr.io/org/trainer:1.0; empty: the runtime's image.",
       "torchtune_finetune.trainer_image", "preflight.tune_trainer_image"),
    _p("tune_workspace_pvc", str, "",
       "The workspace's PVC name, when KFP does not forward the workspace volume itself.",
       "torchtune_finetune.workspace_pvc"),
    _p("tune_run_name", str, "torchtune-finetune",
       "Names the run folder and TrainJob within the pipeline run (unique per fine-tune).",
       "torchtune_finetune.task_name", "evaluate.task_name"),
    # --- eval -------------------------------------------------------------------------------------------------
    _p("eval_max_samples", int, 200, "Held-out rows evaluated; 0: all.", "evaluate.max_samples", "preflight.eval_max_samples"),
    _p("eval_max_new_tokens", int, 64, "Generation length limit.", "evaluate.max_new_tokens", "preflight.eval_max_new_tokens"),
    _p("eval_gate_metric", str, "eval_loss",
       "Metric the tuned model must improve over the base (eval_loss, exact_match, accuracy, macro_f1, ...).",
       "evaluate.gate_metric", "quality_gate.gate_metric", "preflight.eval_gate_metric"),
    _p("eval_min_improvement", float, 0.0,
       "Required gain on eval_gate_metric, on top of a gain beyond the eval set's noise; 0: no more.",
       "evaluate.min_improvement", "preflight.eval_min_improvement"),
    _p("eval_confidence", float, 0.95,
       "Confidence level (0-1) of the improvement's interval, whose lower bound must be above 0 to pass.",
       "evaluate.confidence", "preflight.eval_confidence"),
    _p("eval_thresholds", dict, {}, 'Absolute bounds for the tuned model, e.g. {"exact_match": 0.5}.',
       "evaluate.thresholds", "preflight.eval_thresholds"),
    _p("eval_lm_eval_tasks", list, [], "lm-eval-harness tasks to run as well; empty: none.", "evaluate.lm_eval_tasks", "preflight.eval_lm_eval_tasks"),
    _p("eval_device", str, "auto", "cuda, cpu or auto.", "evaluate.device", "preflight.eval_device"),
    _p("eval_gpus", int, -1, "GPUs for the evaluate step; -1: one when the fine-tune uses GPUs, else none.",
       "gpu_counts.eval_gpus", "preflight.eval_gpus"),
    # --- export -----------------------------------------------------------------------------------------------
    _p("export_format", str, "merged",
       "merged (HF safetensors folder; an adapter run's adapter is merged into the base at export, on CPU), "
       "adapter (PEFT) or both.",
       "export.format", "torchtune_finetune.export_format", "preflight.export_format"),
    _p("export_dtype", str, "", "Convert weights to bf16, fp16 or fp32 on export; empty: as trained.",
       "export.dtype", "preflight.export_dtype"),
    _p("export_overwrite", bool, False, "Replace an earlier export at the destination (never files no export wrote).", "export.overwrite"),
    _p("export_hf_private", bool, True, "Create hf:// repos as private.", "export.hf_private"),
    _p("export_oci_base_image", str, "docker.io/library/busybox:1.37",
       "oci:// only: the image the ModelCar's /models layers go on; it needs the shell KServe runs in it.",
       "export.oci_base_image", "preflight.export_oci_base_image"),
    # --- access -----------------------------------------------------------------------------------------------
    _p("s3_endpoint_url", str, "", "S3 endpoint for MinIO / Ceph; empty: AWS or AWS_ENDPOINT_URL.",
       "model_initialize.s3_endpoint_url", "dataset_initialize.s3_endpoint_url", "export.s3_endpoint_url", "preflight.s3_endpoint_url"),
    _p("hf_token_secret", str, "hf-token",
       "Kubernetes Secret with key HF_TOKEN (gated/private models, hf:// export); optional.", "preflight.hf_token_secret"),
    _p("s3_secret", str, "s3-credentials", "Kubernetes Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; optional.", "preflight.s3_secret"),
    _p("registry_address", str, "",
       "Kubeflow Model Registry (http(s)://host[:port]) a model that passed the gate is registered in, with its "
       "lineage; empty: none.",
       "register_model.address", "preflight.registry_address"),
    _p("registry_model_name", str, "", "Registered model name; empty: the export destination's last part.",
       "register_model.model_name", "preflight.registry_model_name"),
    _p("registry_version", str, "", "Version name in the Model Registry; empty: the KFP run's name.",
       "register_model.version", "preflight.registry_version"),
    _p("registry_secret", str, "model-registry-token",
       "Kubernetes Secret with MODEL_REGISTRY_TOKEN for the Model Registry; optional (else the pod's service "
       "account token)."),
    _p("oci_secret", str, "oci-registry",
       "Kubernetes Secret of type kubernetes.io/dockerconfigjson with the registry credentials for oci:// "
       "sources and destinations; optional."),
    _p("mlflow_tracking_uri", str, "",
       "MLflow tracking server (http[s]://, no credentials in it) the fine-tune and evaluate steps also log to; "
       "empty: none, except a run KFP made for the task itself (its MLFLOW_TRACKING_URI / MLFLOW_RUN_ID).",
       "torchtune_finetune.mlflow_tracking_uri", "evaluate.mlflow_tracking_uri", "preflight.mlflow_tracking_uri"),
    _p("mlflow_experiment", str, "kfp-finetune", "MLflow experiment of the runs mlflow_tracking_uri gets.",
       "torchtune_finetune.mlflow_experiment", "evaluate.mlflow_experiment", "preflight.mlflow_experiment"),
    _p("mlflow_secret", str, "mlflow-credentials",
       "Kubernetes Secret with MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD; "
       "optional."),
    _p("model_cache_path", str, settings.MODEL_CACHE_PATH,
       "A directory on a volume that outlives runs (a PVC mounted on the steps): the base model is fetched there "
       "once per content and hard-linked or used in place; empty: no cache.",
       "model_initialize.cache_path"),
    _p("model_cache_keep_days", int, 30,
       "Days a model cache entry no run has used (an old version of a changed model) stays; -1: forever. Keep it "
       "above the longest run.",
       "model_initialize.cache_keep_days"),
)  # fmt: skip

PARAMETERS: dict[str, Parameter] = {p.name: p for p in TABLE}


def names(
    *, groups: tuple[str, ...] = (), extra: tuple[str, ...] = (), without: tuple[str, ...] = ()
) -> list[str]:
    """Parameter names in table order: those of `groups` plus `extra`, less `without`."""
    chosen = [p.name for p in TABLE if (p.group in groups or p.name in extra) and p.name not in without]
    unknown = set(extra) - set(chosen) - set(without)
    assert not unknown, f"not in the parameter table: {sorted(unknown)}"
    return chosen


class Values:
    """A pipeline's parameters as its body sees them (KFP channels at compile time)."""

    def __init__(self, values: dict[str, Any]):
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def feeding(self, component: str, **more: Any) -> dict[str, Any]:
        """The component arguments these parameters feed (by the table's `feeds`), plus `more`."""
        arguments = {}
        for name, value in self._values.items():
            for target in PARAMETERS[name].feeds:
                owner, _, argument = target.partition(".")
                if owner == component:
                    arguments[argument] = value
        return {**arguments, **more}

    def arguments_for(self, pipeline: Any, **more: Any) -> dict[str, Any]:
        """The parameters a sub-pipeline takes that this one has, plus `more` (which win)."""
        taken = pipeline.component_spec.inputs or {}
        return {**{k: v for k, v in self._values.items() if k in taken}, **more}


def signature(parameter_names: list[str], returns: Any) -> inspect.Signature:
    ordered = sorted(parameter_names, key=lambda n: PARAMETERS[n].default is not REQUIRED)
    return inspect.Signature(
        [
            inspect.Parameter(
                n,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=PARAMETERS[n].default,
                annotation=PARAMETERS[n].type,
            )
            for n in ordered
        ],
        return_annotation=returns,
    )


def docstring(summary: str, parameter_names: list[str]) -> str:
    """`summary` and an Args section with each parameter's line from the table (the KFP UI text)."""
    lines = [inspect.cleandoc(summary), "", "Args:"]
    lines += [f"    {n}: {PARAMETERS[n].doc}" for n in signature(parameter_names, None).parameters]
    return "\n".join(lines) + "\n"


def pipeline(name: str, parameter_names: list[str]) -> Callable[[Callable], Any]:
    """Make a DAG body `def body(p: Values) -> Outputs` a KFP pipeline whose parameters come from the table."""

    def make(body: Callable) -> Any:
        sig = signature(parameter_names, inspect.signature(body).return_annotation)

        def dag(*args: Any, **kwargs: Any) -> Any:
            return body(Values(dict(sig.bind(*args, **kwargs).arguments)))

        dag.__name__ = dag.__qualname__ = body.__name__
        dag.__module__ = body.__module__
        dag.__signature__ = sig
        dag.__doc__ = docstring(body.__doc__ or "", parameter_names)
        return dsl.pipeline(name=name, pipeline_config=settings.pipeline_config())(dag)

    return make


def markdown() -> str:
    """docs/parameters.md: the table by stage, with the pipelines that take each parameter."""
    from kfp_finetune.pipelines import PIPELINES

    taken = {n: [k for k, p in PIPELINES.items() if n in (p.component_spec.inputs or {})] for n in PARAMETERS}
    out = [
        "# Pipeline parameters",
        "",
        "Generated from `pipelines/parameters.py` (`python -m kfp_finetune.pipelines.parameters > "
        "docs/parameters.md`); a test keeps it current.",
    ]
    for group in (*GROUPS, "access"):
        rows = [p for p in TABLE if p.group == group and taken[p.name]]
        if not rows:
            continue
        out += [
            "",
            f"## {group}",
            "",
            "| parameter | type | default | pipelines | what it does |",
            "|---|---|---|---|---|",
        ]
        for p in rows:
            default = "required" if p.default is REQUIRED else f"`{p.default!r}`"
            kind = getattr(p.type, "__name__", str(p.type))
            out.append(
                f"| `{p.name}` | {kind} | {default} | {', '.join(taken[p.name])} | {p.doc.replace('|', '/')} |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
