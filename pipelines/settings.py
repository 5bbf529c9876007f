"""What must be fixed when a pipeline is compiled: the run workspace's size and storage. Images are set in
`kfp_finetune.components._shared.images` (env KFP_FINETUNE_COMPONENT_IMAGE / KFP_FINETUNE_TRAINER_IMAGE).

    KFP_FINETUNE_WORKSPACE_SIZE          PVC size of the per-run workspace (default 100Gi)
    KFP_FINETUNE_WORKSPACE_STORAGE_CLASS storage class (default: the cluster's default storage class)
    KFP_FINETUNE_WORKSPACE_ACCESS_MODE   ReadWriteOnce (default) or ReadWriteMany (needed for multi-node TrainJobs)
    KFP_FINETUNE_SWEEP_PARALLELISM       sweep trials trained at once (default 2)
    KFP_FINETUNE_MODEL_CACHE_PVC         a PVC that outlives runs, mounted at /kfp-finetune/model-cache on the
                                         model-initialize, fine-tune, evaluate and export steps and made the
                                         default of `model_cache_path` (default: none, no model cache); the base
                                         model is fetched there once per content. The fine-tune step forwards it
                                         to the TrainJob's node pods, which also keep torch.compile's kernels on
                                         it (`<model_cache_path>/compile/<torch>-<gpu>/`), so the next run of a
                                         schedule starts warm (the workspace PVC is one per run). Give it
                                         ReadWriteMany unless every step runs on one node.
    KFP_FINETUNE_DATASET_CPUS            CPUs of the dataset-initialize step, request and limit (default 4)
    KFP_FINETUNE_DATASET_MEMORY          memory request of the dataset-initialize step (default 8Gi; no limit)
    KFP_FINETUNE_EXPORT_MEMORY           memory request of the export step (default 20Gi; no limit): a merged
                                         export of an adapter run merges on CPU, holding the model once in its
                                         training dtype (2 bytes a parameter in bf16: 20Gi covers 8B)

The compiled workspace is complete on its own (access mode + size), so a stock KFP >= 2.15 API server without an
admin default (`Workspace.VolumeClaimTemplateSpec` in its config.json) accepts the run. The KFP backend builds the
PVC in backend/src/v2/compiler/argocompiler/argo.go (`GetWorkspacePVC`): the admin default, patched by our
`pvcSpecPatch` (only `accessModes` and `storageClassName` are allowed there: other fields are refused), with the
size from `WorkspaceConfig.size` as `resources.requests.storage`. A PVC without accessModes is refused.
"""

import os

from kfp import dsl

WORKSPACE_SIZE = os.environ.get("KFP_FINETUNE_WORKSPACE_SIZE", "100Gi")
STORAGE_CLASS = os.environ.get("KFP_FINETUNE_WORKSPACE_STORAGE_CLASS", "")
# ReadWriteOnce by default: every storage class offers it, and the fine-tune step pins a single-node TrainJob to
# its own node, so the step and the node pod share the volume. ReadWriteMany (multi-node TrainJobs, which are
# refused before launch on a ReadWriteOnce workspace) needs an RWX class that many clusters lack: a claim for it
# would stay Pending there, so it is the override, not the default.
ACCESS_MODE = os.environ.get("KFP_FINETUNE_WORKSPACE_ACCESS_MODE", "") or "ReadWriteOnce"

# The persistent model cache (model-initialize's cache_path) and torch.compile's kernels beside it
# (torchtune_finetune/warm_start.py): a PVC the cluster admin creates once.
MODEL_CACHE_PVC = os.environ.get("KFP_FINETUNE_MODEL_CACHE_PVC", "")
MODEL_CACHE_MOUNT_PATH = "/kfp-finetune/model-cache"
# The default of the pipelines' `model_cache_path` parameter: the mount when the PVC is set, else no cache.
MODEL_CACHE_PATH = MODEL_CACHE_MOUNT_PATH if MODEL_CACHE_PVC else ""

# dataset-initialize parses and tokenizes in as many processes as its pod's CPU limit allows (_shared/cpus.py):
# tokenizing is CPU-bound, so its CPUs are its speed (benchmarks/results-tokenize-procs). The limit equals the
# request, so the step counts the CPUs it was given and leaves the node's others to training. The memory request
# covers 4 processes beside the step itself (cpus.PROCESS_MEMORY, cpus.PARENT_MEMORY); there is no memory limit:
# the step holds every row's tokens, and a limit sized for a small dataset would OOM-kill a large one that fits the
# node. Constants, not pipeline parameters: KFP's driver reads a parameterised resource field only as text (see
# _shared/gpus.py) and a numeric UI field would silently give no limit.
DATASET_CPUS = os.environ.get("KFP_FINETUNE_DATASET_CPUS", "") or "4"
DATASET_MEMORY = os.environ.get("KFP_FINETUNE_DATASET_MEMORY", "") or "8Gi"

# An adapter run saves only its adapter; a merged export merges it into the base on CPU (_shared/torchtune/merge.py),
# holding the model once in its training dtype, plus the HF files being written. The model's size is not known
# when the pipeline is compiled: the default covers 8B in bf16; no limit, so a larger model that fits the node runs.
EXPORT_MEMORY = os.environ.get("KFP_FINETUNE_EXPORT_MEMORY", "") or "20Gi"

# Backstops so no step can hang a scheduled run forever (the TrainJob has its own timeout parameter).
INITIALIZE_TIMEOUT_SECONDS = 6 * 3600
TRAIN_STEP_TIMEOUT_SECONDS = 7 * 24 * 3600
EVALUATE_TIMEOUT_SECONDS = 12 * 3600
EXPORT_TIMEOUT_SECONDS = 6 * 3600
# The fine-tune's KFP retry: 3 more attempts, 1, 2 and 4 minutes apart. It trains again only after preemption,
# eviction or node loss, from the newest checkpoint; any other failure fails the retry at once
# (components/torchtune_finetune/attempts.py, whose window outlasts this back-off).
TRAIN_RETRIES = 3
TRAIN_RETRY_BACKOFF = ("60s", 2.0, "4m")


def pipeline_config() -> dsl.PipelineConfig:
    """The run workspace: size, access mode and (when set) storage class, complete without an admin default."""
    patch: dict = {"accessModes": [ACCESS_MODE]}
    if STORAGE_CLASS:
        patch["storageClassName"] = STORAGE_CLASS
    return dsl.PipelineConfig(
        workspace=dsl.WorkspaceConfig(
            size=WORKSPACE_SIZE, kubernetes=dsl.KubernetesWorkspaceConfig(pvcSpecPatch=patch)
        )
    )


# How many sweep trials train at once (dsl.ParallelFor needs it at compile time).
SWEEP_PARALLELISM = int(os.environ.get("KFP_FINETUNE_SWEEP_PARALLELISM", "2"))
