"""The gpu-counts KFP component: the fine-tune and evaluate steps' GPU counts as resource fields need them (_shared/gpus.py)."""

from typing import NamedTuple

from kfp import dsl

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def gpu_counts(tune_gpus_per_node: int = 1, eval_gpus: int = -1) -> NamedTuple(
    "Outputs", [("tune_gpus", str), ("eval_gpus", str)]
):
    """Decide how many GPUs the fine-tune nodes and the evaluate step request, as the accelerator limits read them.

    A pipeline sets each task's accelerator limit to one of these outputs. KFP's driver reads a parameterised
    accelerator limit only from a string parameter or output (an integer leaves the step without GPUs) and takes
    it from one parameter or output, never an expression, hence this step.

    Args:
        tune_gpus_per_node: GPUs per TrainJob node of the fine-tune (0: CPU training).
        eval_gpus: GPUs for the evaluate step; -1: one when tune_gpus_per_node > 0, else none.

    Returns:
        tune_gpus: The fine-tune task's accelerator limit (nvidia.com/gpu per TrainJob node), as text.
        eval_gpus: The evaluate task's accelerator limit (nvidia.com/gpu), as text.
    """
    from collections import namedtuple

    from kfp_finetune.components._shared.errors import SettingError, usage_errors
    from kfp_finetune.components._shared.gpus import gpu_counts as counts

    with usage_errors(SettingError):
        tune, evaluate = counts(tune_gpus_per_node, eval_gpus)
    print(f"fine-tune nodes get {tune} GPU(s) each; evaluate gets {evaluate}", flush=True)
    return namedtuple("Outputs", ["tune_gpus", "eval_gpus"])(tune, evaluate)
