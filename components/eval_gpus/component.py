"""The eval-gpus KFP component: the evaluate step's GPU count, from the fine-tune's (gpus.py)."""

from kfp import dsl

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def eval_gpus(eval_gpus: int = -1, tune_gpus_per_node: int = 1) -> int:
    """Decide how many GPUs the evaluate step requests: evaluation runs on a GPU when training used GPUs.

    A pipeline sets the evaluate task's accelerator limit to this task's output. It exists because KFP takes a
    task's accelerator limit from one pipeline parameter or task output, not from an expression of several.

    Args:
        eval_gpus: GPUs for the evaluate step; -1: one when tune_gpus_per_node > 0, else none.
        tune_gpus_per_node: GPUs per node of the fine-tune (0: trained on CPU).

    Returns:
        The number of GPUs (nvidia.com/gpu) the evaluate step requests.
    """
    from kfp_finetune.components.eval_gpus.gpus import gpus_for_evaluate

    gpus = gpus_for_evaluate(eval_gpus, tune_gpus_per_node)
    print(
        f"evaluate gets {gpus} GPU(s) (eval_gpus={eval_gpus}, tune_gpus_per_node={tune_gpus_per_node})",
        flush=True,
    )
    return gpus
