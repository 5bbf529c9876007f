"""Pipelines (DAGs) built from the components (served as kfp_finetune.pipelines).

`PIPELINES` maps each compiled file name (compiled/<name>.yaml) to its pipeline.
"""

from kfp_finetune.pipelines.finetune import finetune_pipeline, prepare_inputs, tune_and_evaluate
from kfp_finetune.pipelines.sweep import sweep_pipeline

PIPELINES = {
    "finetune-pipeline": finetune_pipeline,
    "prepare-inputs": prepare_inputs,
    "tune-and-evaluate": tune_and_evaluate,
    "sweep-pipeline": sweep_pipeline,
}

__all__ = ["PIPELINES", "finetune_pipeline", "prepare_inputs", "sweep_pipeline", "tune_and_evaluate"]
