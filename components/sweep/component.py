"""The sweep-grid and select-best KFP components (signatures + docstrings; the implementation is sweep.py)."""

from kfp import dsl
from kfp.dsl import Input, Metrics, Model, Output, OutputPath

from kfp_finetune.components._shared.images import COMPONENT_IMAGE


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def sweep_grid(learning_rates: list, lora_ranks: list) -> list:
    """List the sweep's trials: every learning rate with every LoRA rank, each with a unique name.

    Args:
        learning_rates: Peak learning rates to try; -1 keeps the base config's.
        lora_ranks: LoRA ranks to try; -1 keeps the base config's.

    Returns:
        Trials as {"trial_name", "learning_rate", "lora_rank"} for `dsl.ParallelFor` (not "name": a loop
        item's `.name` is the loop channel's own attribute).
    """
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.sweep.sweep import trial_grid

    with usage_errors(ValueError):
        return trial_grid(learning_rates, lora_ranks)


@dsl.component(base_image=COMPONENT_IMAGE, install_kfp_package=False)
def select_best(
    models: Input[list[Model]],
    eval_metrics: Input[list[Metrics]],
    best_model: Output[Model],
    best_metrics: Output[Metrics],
    model_image: OutputPath(str),
    metric: str = "eval_loss",
) -> bool:
    """Pick the sweep's best trial by an evaluate metric and pass its model and metrics on.

    Args:
        models: The trials' fine-tuned models (collected from the loop).
        eval_metrics: The trials' evaluate metrics, in the same order.
        metric: Evaluate metric to rank by (eval_loss, perplexity, exact_match, token_f1, rouge_l, ...): lowest
            wins for losses and perplexity, highest otherwise.

    Returns:
        best_model: The best trial's model artifact (same workspace paths and metadata).
        best_metrics: The best trial's evaluate metrics.
        model_image: The image that trained the best trial, which loads it as training did: run its export there
            (`export(...).set_container_image(best.outputs["model_image"])`, as sweep-pipeline does).
        Output: Whether the best trial passed its quality gate (branch the export on it).
    """
    parameters = dict(locals())
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components.sweep.sweep import select_best as select

    with usage_errors(ValueError):
        return select(**parameters)
