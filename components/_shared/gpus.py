"""The GPU counts of the fine-tune and evaluate steps, as the KFP driver needs them in a task's resource fields
(the gpu-counts step), and as pre-flight checks them against the devices asked for.

Two rules of the KFP backend shape this step:
- a task's accelerator limit comes from one pipeline parameter or task output, never an expression, so "-1: one
  GPU for evaluation when the fine-tune had GPUs" is computed here, in a step of its own;
- the driver reads a parameterised resource field with `structpb.Value.GetStringValue()`
  (kubeflow/pipelines backend/src/v2/driver/resolve.go `resolvePodSpecInputRuntimeParameter`, used by
  driver.go `initPodSpecPatch` for the accelerator count): an integer parameter reads as "" and the step gets no
  GPU limit at all, silently. KFP's own examples feed these fields strings
  (test_data/sdk_compiled_pipelines/valid/pipeline_with_string_machine_fields_*.py), so the counts leave this
  step as text.
"""

from kfp_finetune.components._shared.errors import SettingError


def gpu_counts(tune_gpus_per_node: int, eval_gpus: int) -> tuple[str, str]:
    """(fine-tune GPUs per node, evaluate GPUs) as decimal strings; eval_gpus -1: 1 when the fine-tune used GPUs
    (evaluate uses one device), else 0."""
    if tune_gpus_per_node < 0:
        raise SettingError(
            "tune_gpus_per_node", f"must be 0 (CPU training) or more (got {tune_gpus_per_node})"
        )
    if eval_gpus < -1:
        raise SettingError(
            "eval_gpus", f"must be -1 (one GPU when the fine-tune used GPUs) or 0 or more (got {eval_gpus})"
        )
    evaluate = eval_gpus if eval_gpus >= 0 else (1 if tune_gpus_per_node > 0 else 0)
    return str(tune_gpus_per_node), str(evaluate)
