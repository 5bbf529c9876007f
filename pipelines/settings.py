"""What must be fixed when a pipeline is compiled: the run workspace's size and storage. Images are set in
`kfp_finetune.components._shared.images` (env KFP_FINETUNE_COMPONENT_IMAGE / KFP_FINETUNE_TRAINER_IMAGE).

    KFP_FINETUNE_WORKSPACE_SIZE          PVC size of the per-run workspace (default 100Gi)
    KFP_FINETUNE_WORKSPACE_STORAGE_CLASS storage class (default: the KFP/cluster default)
    KFP_FINETUNE_WORKSPACE_ACCESS_MODE   e.g. ReadWriteMany, needed when TrainJob node pods run on other nodes
                                         than the fine-tune step's pod (default: the KFP/cluster default)
    KFP_FINETUNE_SWEEP_PARALLELISM       sweep trials trained at once (default 2)
"""

import os

from kfp import dsl

WORKSPACE_SIZE = os.environ.get("KFP_FINETUNE_WORKSPACE_SIZE", "100Gi")
STORAGE_CLASS = os.environ.get("KFP_FINETUNE_WORKSPACE_STORAGE_CLASS", "")
ACCESS_MODE = os.environ.get("KFP_FINETUNE_WORKSPACE_ACCESS_MODE", "")

# Backstops so no step can hang a scheduled run forever (the TrainJob has its own timeout parameter).
INITIALIZE_TIMEOUT_SECONDS = 6 * 3600
TRAIN_STEP_TIMEOUT_SECONDS = 7 * 24 * 3600
EVALUATE_TIMEOUT_SECONDS = 12 * 3600
EXPORT_TIMEOUT_SECONDS = 6 * 3600


def pipeline_config() -> dsl.PipelineConfig:
    patch = {}
    if STORAGE_CLASS:
        patch["storageClassName"] = STORAGE_CLASS
    if ACCESS_MODE:
        patch["accessModes"] = [ACCESS_MODE]
    kubernetes = dsl.KubernetesWorkspaceConfig(pvcSpecPatch=patch) if patch else None
    return dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size=WORKSPACE_SIZE, kubernetes=kubernetes))


# How many sweep trials train at once (dsl.ParallelFor needs it at compile time).
SWEEP_PARALLELISM = int(os.environ.get("KFP_FINETUNE_SWEEP_PARALLELISM", "2"))
