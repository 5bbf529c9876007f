"""The register-model KFP component (signature + docstring; the implementation is register.py)."""

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Metrics, Model, Output

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def register_model(
    exported: Input[Model],
    metrics: Input[Metrics],
    base_model: Input[Model],
    train_data: Input[Dataset],
    registered: Output[Artifact],
    address: str,
    eval_report: Input[HTML] = None,
    model_name: str = "",
    version: str = "",
    author: str = "kfp-finetune",
    description: str = "",
    run_name: str = "",
    run_id: str = "",
):
    """Register the exported model in the Kubeflow Model Registry, with where it came from and how good it is.

    Runs after export, behind the quality gate: it registers the model (found or created by name), one version
    per run, and the version's model artifact — its URI pinned to the exported bytes (an OCI ModelCar by its
    manifest digest, a hub repo by its commit; S3 and paths as exported) and its format (safetensors for a
    merged model, peft for an adapter). The version's custom properties carry the lineage: the KFP run id and
    name, the base model and its revision and files digest, the dataset and its sha256 (of its shards'
    checksums) and row count, the method and export format, the export's checksums.sha256 digest, every
    evaluation metric with its confidence interval, the gate's verdict and the evaluation report's URI. What was
    written is read back and compared. A rerun of the step finds its own version and writes nothing; a version
    of that name holding another model is refused. A model whose metrics say the gate failed is never
    registered. Credentials: a bearer token in MODEL_REGISTRY_TOKEN (from a Kubernetes Secret), else the pod's
    service-account token, as a registry behind kube-rbac-proxy takes it.

    Args:
        exported: The export step's `exported` output.
        metrics: evaluate's `metrics` output (the scores, their intervals, `passed`).
        base_model: model-initialize's `model` output (the base model's source, revision and files).
        train_data: dataset-initialize's `train` output (the dataset's source and shards).
        address: The Model Registry's REST address, http(s)://host[:port], e.g.
            https://model-registry-service.kubeflow.svc:8443.
        eval_report: evaluate's `report` output; its URI is recorded.
        model_name: The registered model's name; empty: the export destination's last part.
        version: The version's name; empty: the KFP run's name.
        author: The author recorded on the version.
        description: The version's description; empty: names the run.
        run_name: The pipeline run's name; pass `dsl.PIPELINE_JOB_NAME_PLACEHOLDER`.
        run_id: The pipeline run's id; pass `dsl.PIPELINE_JOB_ID_PLACEHOLDER`.

    Returns:
        registered: `uri` is the version's REST address; metadata gives `state` (registered or already
            registered), `model_name`, `version`, `registered_model_id`, `model_version_id`, `model_artifact_id`,
            `artifact_uri` and `properties` (the version's custom properties as the registry holds them).
    """
    parameters = dict(locals())  # taken first: exactly this component's parameters
    from kfp_finetune.components._shared.errors import ContractError, SettingError, usage_errors
    from kfp_finetune.components._shared.model_registry import RegistryError
    from kfp_finetune.components._shared.storage import refuse_credentials
    from kfp_finetune.components.register_model.register import run_component

    with usage_errors(SettingError, RegistryError, ContractError):
        refuse_credentials(registry_address=address)
        run_component(**parameters)
