"""The fine-tuning DAGs: `prepare_inputs` (dataset + model), `tune_and_evaluate` (finetune + evaluate), and
`finetune_pipeline`, built from them, which exports the model only when evaluation says it is better.

Their parameters come from the one table in parameters.py (names, types, defaults, UI text, the component
arguments each feeds), grouped by stage through their prefixes (data_, model_, tune_, eval_, export_). Every step writes
to the run's workspace, so caching is off (a cached step would point into another run's workspace). Every step
that writes there gets KFP's id of its task instance (`task_id=TASK_ID`), which names what it writes: nested
uses of these DAGs in one run, and sweep trials, never share a folder or a TrainJob.
"""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

from typing import NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import HTML, Dataset, Metrics, Model

from kfp_finetune.components._shared.engines import trainer_images
from kfp_finetune.components._shared.model_registry import TOKEN_ENV as MODEL_REGISTRY_TOKEN
from kfp_finetune.components._shared.tracking import CREDENTIAL_KEYS
from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.evaluate.component import evaluate
from kfp_finetune.components.export.component import export
from kfp_finetune.components.gpu_counts.component import gpu_counts
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.preflight.component import preflight
from kfp_finetune.components.quality_gate.component import quality_gate
from kfp_finetune.components.register_model.component import register_model
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune
from kfp_finetune.pipelines import parameters, settings

HF_TOKEN_KEYS = {"HF_TOKEN": "HF_TOKEN"}
# Credentials and endpoints: every pipeline that fetches or publishes takes them.
ACCESS = ("s3_endpoint_url", "hf_token_secret", "s3_secret", "oci_secret")
# Experiment tracking: the fine-tune and evaluate steps log to MLflow (_shared/tracking.py).
TRACKING = ("mlflow_tracking_uri", "mlflow_experiment", "mlflow_secret")
# The Kubeflow Model Registry a model that passed the gate is registered in (components/register_model/).
REGISTRY = ("registry_address", "registry_model_name", "registry_version", "registry_secret")
REGISTRY_TOKEN_KEYS = {MODEL_REGISTRY_TOKEN: MODEL_REGISTRY_TOKEN}
MLFLOW_KEYS = {key: key for key in CREDENTIAL_KEYS}
# tune_ settings the table also feeds to dataset-initialize (max_seq_len, train_on_input, new_system_prompt): its
# packs are made with the length and masking training uses.
DATA_TUNE_SETTINGS = tuple(
    p.name
    for p in parameters.TABLE
    if p.group == "tune" and any(f.startswith("dataset_initialize.") for f in p.feeds)
)
OCI_CONFIG_DIR = "/var/run/secrets/kfp-finetune/oci"
S3_KEYS = {"AWS_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY"}
# Resolved by KFP once per task execution: unique per nested use and ParallelFor iteration (see _shared/names.py).
TASK_ID = dsl.PIPELINE_TASK_ID_PLACEHOLDER


def with_credentials(task: dsl.PipelineTask, hf_token_secret, s3_secret, oci_secret) -> dsl.PipelineTask:
    """HF, S3 and OCI registry credentials from Kubernetes Secrets (their names are pipeline parameters; all
    optional). The registry's is a docker config (a kubernetes.io/dockerconfigjson Secret), mounted as a folder
    that DOCKER_CONFIG names, as docker and oras read it (_shared/storage/oci.py)."""
    kubernetes.use_secret_as_env(
        task, secret_name=hf_token_secret, secret_key_to_env=HF_TOKEN_KEYS, optional=True
    )
    kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_KEYS, optional=True)
    kubernetes.use_secret_as_volume(task, secret_name=oci_secret, mount_path=OCI_CONFIG_DIR, optional=True)
    return task.set_env_variable("DOCKER_CONFIG", OCI_CONFIG_DIR)


def with_tracking_credentials(task: dsl.PipelineTask, mlflow_secret) -> dsl.PipelineTask:
    """MLflow credentials from a Kubernetes Secret (its name is a pipeline parameter; optional), as the variables
    the MLflow client reads."""
    kubernetes.use_secret_as_env(
        task, secret_name=mlflow_secret, secret_key_to_env=MLFLOW_KEYS, optional=True
    )
    return task


def with_model_cache(task: dsl.PipelineTask) -> dsl.PipelineTask:
    """Mount the model cache PVC (settings.MODEL_CACHE_PVC, when set) on a step that reads or fills the cache. The
    fine-tune step forwards its volumes to the TrainJob's node pods, which read a base model used in place there and
    keep torch.compile's kernels beside it (`<cache>/compile/`), so the next run of a schedule starts warm."""
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


def publish(
    display_name: str, model_image, hf_token_secret, s3_secret, oci_secret, **export_arguments
) -> dsl.PipelineTask:
    """The export step as every pipeline runs it: on the image that trained the model (whose packages merge and
    convert its weights as training saved them), time-limited, with credentials from Secrets.

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
    task.set_container_image(model_image)
    task.set_memory_request(settings.EXPORT_MEMORY)  # a merged export of an adapter run merges on CPU
    with_model_cache(task)
    return with_credentials(task, hf_token_secret, s3_secret, oci_secret)


def register(p: parameters.Values, exported, metrics, inputs, report=None) -> dsl.PipelineTask:
    """The register-model step after an export: the exported model, its metrics (and report), base model and
    dataset."""
    task = register_model(
        exported=exported.outputs["exported"],
        metrics=metrics,
        base_model=inputs.outputs["model"],
        train_data=inputs.outputs["train"],
        **({"eval_report": report} if report is not None else {}),
        run_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        **p.feeding("register_model"),
    )
    step(task, "Register in the Model Registry", 600)
    return with_registry_credentials(task, p.registry_secret)


def with_registry_credentials(task: dsl.PipelineTask, registry_secret) -> dsl.PipelineTask:
    """The Model Registry's token from a Kubernetes Secret (its name is a pipeline parameter; optional)."""
    kubernetes.use_secret_as_env(
        task, secret_name=registry_secret, secret_key_to_env=REGISTRY_TOKEN_KEYS, optional=True
    )
    return task


def check_first(
    hf_token_secret, s3_secret, mlflow_secret, oci_secret, registry_secret, **preflight_arguments
) -> dsl.PipelineTask:
    """The pre-flight step, the first of a pipeline: the steps that download `.after()` it. It gets the Secrets and
    volumes the export gets, so it sees the destination as the export will."""
    task = preflight(hf_token_secret=hf_token_secret, s3_secret=s3_secret, **preflight_arguments)
    step(task, "Pre-flight checks", 600)
    with_model_cache(task)
    with_tracking_credentials(task, mlflow_secret)
    with_registry_credentials(task, registry_secret)
    return with_credentials(task, hf_token_secret, s3_secret, oci_secret)


class PreparedInputs(NamedTuple):
    model: Model
    train: Dataset
    eval: Dataset


@parameters.pipeline(
    "prepare-inputs", parameters.names(groups=("model", "data"), extra=(*ACCESS, *DATA_TUNE_SETTINGS))
)
def prepare_inputs(p: parameters.Values) -> PreparedInputs:
    """Bring the base model and, side by side, the dataset (tokenized and packed with the model's tokenizer) into
    the run workspace, verified."""
    model_task = model_initialize(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, task_id=TASK_ID, **p.feeding("model_initialize")
    )
    with_model_cache(model_task)
    # Beside the model, not after it: it tokenizes and packs the train split once with the base model's tokenizer,
    # fetching only the model's config and tokenizer files (base_model_uri). The fine-tune step checks the packs'
    # tokenizer fingerprint against the base model's and tokenizes itself, logged, should they differ.
    data_task = dataset_initialize(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER, task_id=TASK_ID, **p.feeding("dataset_initialize")
    )
    # Its processes follow its CPU limit (settings.DATASET_CPUS).
    data_task.set_cpu_request(settings.DATASET_CPUS).set_cpu_limit(settings.DATASET_CPUS)
    data_task.set_memory_request(settings.DATASET_MEMORY)
    for task, name in ((model_task, "Initialize model"), (data_task, "Initialize dataset")):
        # No KFP-level retry (see `publish`): transient errors are retried in-process, bad input fails at once.
        step(task, name, settings.INITIALIZE_TIMEOUT_SECONDS)
        with_credentials(task, p.hf_token_secret, p.s3_secret, p.oci_secret)
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
    model_image: str  # the image that loads the model as training did (torchtune-finetune's model_image)


@parameters.pipeline(
    "tune-and-evaluate",
    parameters.names(
        groups=("tune", "eval"), extra=("base_model", "train_data", "eval_data", "export_format", *TRACKING)
    ),
)
def tune_and_evaluate(p: parameters.Values) -> TunedAndEvaluated:
    """Fine-tune with torchtune (a Kubeflow Trainer TrainJob by default) and compare the result with the base."""
    # KFP's driver reads an accelerator limit only from a text parameter or output, and from one, not an
    # expression: this step turns tune_gpus_per_node and eval_gpus into both steps' limits (_shared/gpus.py).
    gpus = step(gpu_counts(**p.feeding("gpu_counts")), "GPU counts", 300)
    tune = torchtune_finetune(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        train_data=p.train_data,
        eval_data=p.eval_data,
        base_model=p.base_model,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_id=TASK_ID,
        engine_images=trainer_images(),  # this compile's images: the step names its engine's as model_image
        **p.feeding("torchtune_finetune"),
    )
    step(tune, "Fine-tune (torchtune)", settings.TRAIN_STEP_TIMEOUT_SECONDS)
    backoff, factor, longest = settings.TRAIN_RETRY_BACKOFF
    tune.set_retry(
        settings.TRAIN_RETRIES, backoff_duration=backoff, backoff_factor=factor, backoff_max_duration=longest
    )
    with_model_cache(tune)
    with_tracking_credentials(tune, p.mlflow_secret)
    # Reaches the TrainJob's node pods through the task config, not this launcher pod.
    tune.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpus.outputs["tune_gpus"])
    tune.after(gpus)  # KFP does not count an output used in a resource field as a dependency

    check = evaluate(
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        model=tune.outputs["model"],
        base_model=p.base_model,
        eval_data=p.eval_data,
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_id=TASK_ID,
        **p.feeding("evaluate"),
    )
    step(check, "Evaluate: base vs tuned", settings.EVALUATE_TIMEOUT_SECONDS)
    # The engine that trained the model is chosen at run time: evaluate runs on its image, which builds the eval
    # rows and loads the model as training did (the transformers engine's needs its TRL and transformers 5).
    check.set_container_image(tune.outputs["model_image"])
    with_model_cache(check)
    with_tracking_credentials(check, p.mlflow_secret)
    # A model trained on GPUs is evaluated on one, in its training dtype (evaluate's placement.py).
    check.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpus.outputs["eval_gpus"])
    check.after(gpus)
    return TunedAndEvaluated(
        model=tune.outputs["model"],
        train_metrics=tune.outputs["metrics"],
        train_report=tune.outputs["report"],
        eval_metrics=check.outputs["metrics"],
        eval_report=check.outputs["report"],
        eval_samples=check.outputs["samples"],
        passed=check.outputs["passed"],
        model_image=tune.outputs["model_image"],
    )


class FinetuneOutputs(NamedTuple):
    model: Model
    train_metrics: Metrics
    train_report: HTML
    eval_metrics: Metrics
    eval_report: HTML
    eval_samples: Dataset
    passed: bool
    model_image: str  # the image that loads the model as training did (torchtune-finetune's model_image)


@parameters.pipeline(
    "finetune-pipeline",
    parameters.names(
        groups=("model", "data", "tune", "eval", "export"),
        extra=(*ACCESS, *TRACKING, *REGISTRY),
        without=("tune_run_name",),
    ),
)
def finetune_pipeline(p: parameters.Values) -> FinetuneOutputs:
    """Fine-tune an LLM with torchtune and publish it only if it beats the base model.

    A pre-flight step first checks in seconds every tune_, eval_ and export_ setting, the model's family and the
    complete torchtune run (resolved from its config and tokenizer files, without the weights), that the
    destination is writable, the Secrets' credentials are there, gated hub repos are readable and the training
    runtime exists; then dataset and model initialize in parallel into the run's workspace; torchtune-finetune trains (a Kubeflow Trainer TrainJob by default); evaluate compares base and tuned on the held-out split; export runs only when
    the quality gate passes, and then, where registry_address is set, register-model records the exported model
    with its lineage in the Kubeflow Model Registry.
    """
    checked = check_first(
        mlflow_secret=p.mlflow_secret, oci_secret=p.oci_secret, registry_secret=p.registry_secret,
        **p.feeding("preflight"),
    )  # fmt: skip
    inputs = prepare_inputs(**p.arguments_for(prepare_inputs)).set_display_name("Prepare inputs")
    inputs.after(checked)
    tuned = tune_and_evaluate(
        **p.arguments_for(
            tune_and_evaluate,
            base_model=inputs.outputs["model"],
            train_data=inputs.outputs["train"],
            eval_data=inputs.outputs["eval"],
        )
    ).set_display_name("Tune and evaluate")
    gate = step(
        quality_gate(passed=tuned.outputs["passed"], **p.feeding("quality_gate")), "Quality gate", 600
    )
    with dsl.If(gate.output == True, name="quality-gate-passed"):  # noqa: E712 (a KFP condition)
        exported = publish(
            "Export model",
            tuned.outputs["model_image"],
            p.hf_token_secret,
            p.s3_secret,
            p.oci_secret,
            model=tuned.outputs["model"],
            metrics=tuned.outputs["eval_metrics"],
            **p.feeding("export"),
        )
        with dsl.If(p.registry_address != "", name="model-registry-set"):
            register(p, exported, tuned.outputs["eval_metrics"], inputs, tuned.outputs["eval_report"])
    return FinetuneOutputs(
        model=tuned.outputs["model"],
        train_metrics=tuned.outputs["train_metrics"],
        train_report=tuned.outputs["train_report"],
        eval_metrics=tuned.outputs["eval_metrics"],
        eval_report=tuned.outputs["eval_report"],
        eval_samples=tuned.outputs["eval_samples"],
        passed=gate.output,
        model_image=tuned.outputs["model_image"],
    )
