"""`sweep_pipeline`: fine-tune one configuration per (learning rate, LoRA rank), evaluate each, export the best.

Trials share one prepared workspace (dataset and model are fetched once) and run `tune_and_evaluate` in a
bounded `dsl.ParallelFor`; each trial's name keeps its run folder and TrainJob apart from the others.
"""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Model

from kfp_finetune.components.sweep.component import select_best, sweep_grid
from kfp_finetune.pipelines import parameters, settings
from kfp_finetune.pipelines.finetune import (
    ACCESS,
    REGISTRY,
    TRACKING,
    check_first,
    prepare_inputs,
    publish,
    register,
    step,
    tune_and_evaluate,
)


class SweepOutputs(NamedTuple):
    best_model: Model
    best_eval_metrics: Metrics
    passed: bool


@parameters.pipeline(
    "sweep-pipeline",
    parameters.names(
        groups=("sweep", "model", "data", "tune", "eval", "export"),
        extra=(*ACCESS, *TRACKING, *REGISTRY),
        without=("tune_learning_rate", "tune_lora_rank", "tune_run_name"),
    ),
)
def sweep_pipeline(p: parameters.Values) -> SweepOutputs:
    """Sweep learning rate x LoRA rank with torchtune, evaluate every trial, export only the best (and register it
    in the Kubeflow Model Registry where registry_address is set)."""
    checked = check_first(
        mlflow_secret=p.mlflow_secret, oci_secret=p.oci_secret, registry_secret=p.registry_secret,
        **p.feeding("preflight"),
    )  # fmt: skip
    inputs = prepare_inputs(**p.arguments_for(prepare_inputs)).set_display_name("Prepare inputs")
    inputs.after(checked)
    grid = step(sweep_grid(**p.feeding("sweep_grid")), "Sweep grid", 600)
    with dsl.ParallelFor(grid.output, parallelism=settings.SWEEP_PARALLELISM, name="trials") as trial:
        tuned = tune_and_evaluate(
            **p.arguments_for(
                tune_and_evaluate,
                base_model=inputs.outputs["model"],
                train_data=inputs.outputs["train"],
                eval_data=inputs.outputs["eval"],
                tune_learning_rate=trial.learning_rate,
                tune_lora_rank=trial.lora_rank,
                tune_run_name=trial.trial_name,
            )
        ).set_display_name("Trial: tune and evaluate")
    best = select_best(
        models=dsl.Collected(tuned.outputs["model"]),
        eval_metrics=dsl.Collected(tuned.outputs["eval_metrics"]),
        **p.feeding("select_best"),
    )
    step(best, "Select the best trial", 600)
    with dsl.If(best.outputs["Output"] == True, name="best-trial-passed"):  # noqa: E712 (a KFP condition)
        exported = publish(
            "Export the best model",
            best.outputs["model_image"],
            p.hf_token_secret,
            p.s3_secret,
            p.oci_secret,
            model=best.outputs["best_model"],
            metrics=best.outputs["best_metrics"],
            **p.feeding("export"),
        )
        with dsl.If(p.registry_address != "", name="model-registry-set"):
            register(p, exported, best.outputs["best_metrics"], inputs)
    return SweepOutputs(
        best_model=best.outputs["best_model"],
        best_eval_metrics=best.outputs["best_metrics"],
        passed=best.outputs["Output"],
    )
