"""The export KFP component (signature + docstring; the implementation is export.py)."""

from kfp import dsl
from kfp.dsl import Artifact, Input, Metrics, Model, Output

from kfp_finetune.components._shared.images import TRAINER_IMAGE


# The trainer image: converting weights to another dtype needs torch. The pipelines run it on the image that
# trained the model instead (torchtune-finetune's model_image), whose packages merge the weights as they were saved.
@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def export(
    workspace_path: str,
    model: Input[Model],
    destination: str,
    exported: Output[Model],
    serving: Output[Artifact],
    metrics: Input[Metrics] = None,
    format: str = "merged",
    dtype: str = "",
    overwrite: bool = False,
    s3_endpoint_url: str = "",
    hf_private: bool = True,
    oci_base_image: str = "docker.io/library/busybox:1.37",
    run_name: str = "",
    run_id: str = "",
    task_name: str = "export",
    max_workers: int = 8,
    task_id: str = "",
):
    """Deliver the fine-tuned model where serving and registries read it: S3, the Hugging Face Hub, an OCI registry
    (a KServe ModelCar image) or a volume.

    Exports torchtune-finetune's merged Hugging Face model (safetensors, config, tokenizer; loads with
    `AutoModelForCausalLM.from_pretrained`, serves with vLLM / TGI / KServe), its PEFT adapter (whose
    adapter_config.json names the base model), or both (merged at the root, adapter in `adapter/`), optionally
    converting the weights to bf16/fp16/fp32. An adapter run saves only its adapter while training (no GPU idles
    at an epoch end): a merged export first merges it into the base model on CPU, exactly as torchtune's LoRA
    recipe merges (bit for bit), into the run folder's `merged/`, which later exports reuse; the step's memory
    must hold the model once in its training dtype (its request: KFP_FINETUNE_EXPORT_MEMORY when compiling).
    Adds a model card (README.md: base model and revision, dataset, method and hyperparameters, training and
    evaluation metrics, the pipeline run) and `checksums.sha256`.
    The upload is resumable and verified: files already at the destination with the same content are not sent
    again (a retry after an interruption sends only the rest; re-exporting the same model transfers nothing),
    and every file's size and checksum is read back afterwards. A destination holding different content is
    refused unless `overwrite`; a same-named file no export wrote (a user's own README.md or checksums.sha256)
    is never replaced. Format, dtype, destination and credentials are checked before any upload.
    An oci:// destination gets a KServe ModelCar: the export's files under /models on `oci_base_image`, one layer
    per large file (a weight file already in the repository is never uploaded again), pushed, then its manifest
    and uploaded layers pulled back and checked against checksums.sha256.
    Credentials come only from the environment: HF_TOKEN for the Hub; AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (and AWS_ENDPOINT_URL) for S3; a docker config at $DOCKER_CONFIG
    for a registry — set them from Kubernetes Secrets.

    Args:
        workspace_path: The run workspace; pass `dsl.WORKSPACE_PATH_PLACEHOLDER`.
        model: The fine-tuned model: torchtune-finetune's `model` output.
        destination: Where to export: `s3://<bucket>/<prefix>`, `hf://<org>/<repo>[/<folder>][@<branch>]`
            (created if missing), `oci://<registry>/<repository>[:<tag>]` (tag `latest` when none) or an absolute
            path, e.g. a mounted PVC; never a whole disk or bucket.
        metrics: Evaluation results (evaluate's `metrics` output); their numbers go into the model card.
        format: merged (serving-ready HF model), adapter (PEFT adapter; not for method=full) or both.
        dtype: Convert floating-point weights to bf16, fp16 or fp32; empty: keep the trained dtype.
        overwrite: Replace an earlier export at the destination: its files (listed in the checksums.sha256 it
            wrote, whose first line names that export) are replaced, or deleted when not in this one. Files no
            export wrote are never touched: one this export would write (a README.md, config.json or
            checksums.sha256 of your own) fails the step, naming it, even with overwrite. Without overwrite any
            different content fails the step and is left untouched.
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; default: AWS_ENDPOINT_URL from the environment, else AWS.
        hf_private: Create a missing hf:// repo as private (an existing repo keeps its visibility).
        oci_base_image: oci:// only: the image whose layers come first in the ModelCar (KServe runs a shell in
            it); mounted from its repository when at the same registry, else copied once.
        run_name: The pipeline run's name for the model card; pass `dsl.PIPELINE_JOB_NAME_PLACEHOLDER`.
        run_id: The pipeline run's id for the model card; pass `dsl.PIPELINE_JOB_ID_PLACEHOLDER`.
        task_name: The task's name, for the model card; readable part of the staging folder's name.
        max_workers: Number of files uploaded and hashed in parallel (paths); s3:// sends at least 32 files
            and up to 64 requests at once.
        task_id: KFP's id of this task; pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (gives each export of a model in
            a run its own staging folder); empty: not under KFP.

    Returns:
        exported: A manifest; `uri` is the destination (for s3:// only in metadata `destination`: KFP
            uploads object-store artifact URIs itself); metadata gives `destination`, `format`, `dtype`, `state` (created,
            resumed, unchanged or replaced), `files` (path, size, sha256), `num_files`, `total_bytes`,
            `uploaded_files`, `manifest_sha256` (of checksums.sha256), `base_model`, `base_model_revision`,
            `method`, `dataset_source`, `metrics`, `layout`, for hf:// `commit_sha` and for oci:// `image_digest` (the
            manifest's).
        serving: A KServe InferenceService (YAML) serving the export with KServe's Hugging Face runtime (vLLM
            for generation), `storageUri` pinned to the exported bytes, GPUs and memory from the weights' size;
            metadata `servable`, `name`, `storage_uri`, `gpus`. A path export or an adapter alone is not
            servable as it is: the file and metadata `reason` say why.
    """
    parameters = dict(locals())  # taken first: exactly this component's parameters
    from kfp_finetune.components._shared.errors import ContractError, usage_errors
    from kfp_finetune.components._shared.storage import (
        CredentialsInParameter,
        StorageError,
        refuse_credentials,
    )
    from kfp_finetune.components.export.export import ExportError, run_component

    with usage_errors(ExportError, StorageError, ContractError, CredentialsInParameter):
        refuse_credentials(
            export_destination=destination,
            s3_endpoint_url=s3_endpoint_url,
            export_oci_base_image=oci_base_image,
        )
        run_component(**parameters)
