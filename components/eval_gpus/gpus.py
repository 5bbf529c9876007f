"""How many GPUs the evaluate step gets (issue 18: evaluation on a GPU by default when training used GPUs).

KFP sets a task's accelerator limit from one pipeline parameter or task output, with no expression: the rule
"-1: one GPU when the fine-tune had GPUs, else none" is computed here, in a step of its own, and the evaluate
task's limit is this step's output."""


def gpus_for_evaluate(eval_gpus: int, tune_gpus_per_node: int) -> int:
    """`eval_gpus` when set (>= 0); -1: 1 when the fine-tune used GPUs (evaluate uses one device), else 0."""
    if eval_gpus >= 0:
        return eval_gpus
    if eval_gpus != -1:
        raise ValueError(
            f"eval_gpus must be -1 (one GPU when the fine-tune used GPUs) or 0 or more (got {eval_gpus})"
        )
    return 1 if tune_gpus_per_node > 0 else 0
