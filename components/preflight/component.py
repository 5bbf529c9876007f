"""The preflight KFP component (signature + docstring; the implementation is preflight.py)."""

from kfp import dsl

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def preflight(
    export_destination: str = "",
    model_uri: str = "",
    data_uri: str = "",
    s3_endpoint_url: str = "",
    hf_token_secret: str = "hf-token",
    s3_secret: str = "s3-credentials",
    tune_backend: str = "trainjob",
    tune_runtime: str = "torchtune",
    tune_runtime_kind: str = "ClusterTrainingRuntime",
):
    """Check in seconds, before anything is downloaded or trained, what would otherwise fail a run hours later.

    The first step of the pipelines, on the small CPU image. It checks that the credentials the Kubernetes Secrets
    give are in the step's environment (HF_TOKEN for an hf:// destination, AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY for s3:// unless another credential source is configured); that the export destination
    is writable with them (s3://: a small probe object is written under the prefix and deleted; hf://: the hub
    says the token may write to the repo's namespace; a path: a file can be created in the folder, or in its
    nearest existing parent); that gated or private hf:// model and dataset repos are readable with the token;
    and, for tune_backend trainjob, that the TrainingRuntime or ClusterTrainingRuntime exists. Every problem
    found fails the step with one `error:` line listing them all, each naming the parameter and the fix. The
    step needs the same Secrets (and volumes) as the steps it checks for.

    Args:
        export_destination: Where the model will be exported (s3://, hf:// or a path); empty: not checked.
        model_uri: The base model; an hf:// repo is checked for access with the token; empty: not checked.
        data_uri: The dataset; an hf:// repo is checked for access with the token; empty: not checked.
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; empty: AWS_ENDPOINT_URL from the environment, else AWS.
        hf_token_secret: Name of the Secret that gives HF_TOKEN (named in the fix when HF_TOKEN is missing).
        s3_secret: Name of the Secret that gives AWS_* (named in the fix when S3 credentials are missing).
        tune_backend: trainjob (the runtime is checked on the cluster) or local (no cluster needed).
        tune_runtime: The (Cluster)TrainingRuntime the fine-tune's TrainJob will name.
        tune_runtime_kind: ClusterTrainingRuntime or TrainingRuntime (namespaced, in the step's namespace).
    """
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight

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
        )
