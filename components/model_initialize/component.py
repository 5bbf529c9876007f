"""The model-initialize KFP component (signature + docstring; the implementation is initialize.py)."""

from kfp import dsl
from kfp.dsl import Model, Output

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def model_initialize(
    source_uri: str,
    workspace_path: str,
    model: Output[Model],
    name: str = "",
    allow_patterns: list = [],  # noqa: B006 (KFP needs a literal default)
    base_model_id: str = "",
    s3_endpoint_url: str = "",
    max_workers: int = 8,
    cache_path: str = "",
    cache_keep_days: int = 30,
    task_id: str = "",
):
    """Bring a base model into the run workspace, verified, for fine-tuning.

    Copies the files training needs (safetensors weights, config and tokenizer files; PyTorch .bin only when the
    source has no safetensors) to `<workspace>/models/<name>-<task>/` (`<task>`: 8 characters of a hash of
    `task_id`), verifies them (config.json parses, all weight shards present and complete, the model family's
    tokenizer present, sizes and sha256 where the source states them) and writes `original_repo_id.json` for
    torchtune. The copy is renamed into place only when complete; a rerun with unchanged source content skips the
    transfer. A local folder's symlinks are followed only inside it: one pointing outside (a `LICENSE.txt` linked
    to `/etc/passwd`, a folder elsewhere) fails the step naming it, before anything is copied. Credentials come
    only from the environment: HF_TOKEN for the Hugging Face Hub, AWS_ACCESS_KEY_ID /
    AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (and AWS_ENDPOINT_URL) for S3, a docker config at $DOCKER_CONFIG
    for a registry — set them from Kubernetes Secrets.

    Args:
        source_uri: Where the model is: `hf://<org>/<repo>[/<sub/path>][@<revision>]`, `s3://<bucket>/<prefix>`,
            `oci://<registry>/<repository>[:<tag>|@sha256:<digest>]` (a KServe ModelCar: the files under /models),
            `file:///<path>` or an absolute path (e.g. a mounted PVC).
        workspace_path: The run workspace; pass `dsl.WORKSPACE_PATH_PLACEHOLDER`.
        name: Readable part of the folder name under `models/`; default: the repo or folder name of the source.
        allow_patterns: Glob patterns of files to copy; default: `*.safetensors`, `*.json`, `*.txt`, `*.model`,
            `*.tiktoken`, `*.jinja`.
        base_model_id: Model id recorded as the base model of trained adapters; default: the hf:// repo id,
            else the source URI.
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; default: AWS_ENDPOINT_URL from the environment, else AWS.
        max_workers: Number of files transferred in parallel.
        cache_path: A directory on a mounted volume that outlives runs (e.g. a PVC): the model is fetched there
            once per content and hard-linked into the workspace, or used in place when the volume is another
            filesystem; default: no cache.
        cache_keep_days: Cache entries no run has used for this many days (an old version of a changed model, a
            killed fetch) are removed when a run uses the cache; -1: never. Keep it above the longest run: a run
            using an entry in place reads it until it ends.
        task_id: KFP's id of this task; pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (keeps two models whose sources end
            in the same name apart); empty: not under KFP.

    Returns:
        model: A manifest.json; its metadata gives `workspace_path` (relative to the workspace), `source_uri`,
            `repo_id`, `revision`, `commit_sha`, `model_type`, `weight_format`, `files` (path, size, sha256),
            `num_files`, `total_bytes` and `reused_existing_copy`; with `cache_path`, `cache` gives `hit`, `entry`,
            `bytes_fetched`, `bytes_copied`, `workspace_copy` and `evicted` (the entries removed), and
            `workspace_path` is absolute when the model is used in place from the cache.
    """
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components._shared.storage import StorageError, refuse_credentials
    from kfp_finetune.components.model_initialize.initialize import ModelVerificationError, initialize_model

    # ValueError: an invalid source URI, or one with credentials in it.
    with usage_errors(StorageError, ModelVerificationError, ValueError):
        refuse_credentials(model_uri=source_uri, s3_endpoint_url=s3_endpoint_url)
        initialize_model(
            source_uri=source_uri,
            workspace_path=workspace_path,
            name=name,
            allow_patterns=allow_patterns,
            base_model_id=base_model_id,
            s3_endpoint_url=s3_endpoint_url,
            max_workers=max_workers,
            cache_path=cache_path,
            cache_keep_days=cache_keep_days,
            output_model=model,
            task_id=task_id,
        )
