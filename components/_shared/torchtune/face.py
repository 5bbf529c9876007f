"""The torchtune engine's face: what the steps above the wings (evaluate, export) may ask of a run it trained.
`_shared/engines.py` finds it by the engine name the fine-tune recorded; every engine's face has these names.

- `serves(model_dir, hf_config, task)`: (True, why) when the engine can fine-tune the model for the task
  (engines.GENERATION or CLASSIFICATION), else (False, why not);
- `read_resolved_config(run_dir)`: the settings the run trained with ({} for a folder this library did not train);
- `hyperparameters(resolved)`: what a model card shows of them, as (label, value) pairs;
- `TRAINED_WITH`: the engine as a model card names it;
- `last_adapter_state(run_dir)`: the run's last adapter in the engine's own names, None when there is none;
- `merged_model_dir(run_dir, base_dir)`: the HF folder of the base with the run's adapter merged in, built once;
- `evaluation()`: the module that loads the tuned model and scores eval rows as training tokenized them;
- `DATA_PACKS`: whether the engine trains on the packs dataset-initialize writes (True: torchtune's recipes read
  them through our packed-dataset builder, so no rank tokenizes);
- `RUNTIME`: the ClusterTrainingRuntime (runtimes/) whose image trains this engine's TrainJobs, when the step's
  runtime is left to the engine;
- `TRAINER_IMAGE`: the image with the engine's packages (its runtimes' image): evaluate loads the engine's models
  there, as training did (the fine-tune step's `model_image` output);
- `check_node_command(argv)` / `run_node_command(argv)`: in a TrainJob's node pod (the fine-tune step's
  entrypoint.py), the checks that need torch of the engine's training command, then that command in the pod's
  process (node.py).

No torch here: `evaluation()` imports it when called.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from kfp_finetune.components._shared.engines import GENERATION
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.images import TRAINER_IMAGE
from kfp_finetune.components._shared.torchtune.merge import merged_model_dir
from kfp_finetune.components._shared.torchtune.node import check_node_command, run_node_command
from kfp_finetune.components._shared.torchtune.run_layout import (
    hyperparameters,
    last_adapter_state,
    read_resolved_config,
)

NAME = "torchtune"
#: The installed packages only this wing imports (tests/components/test_engine_wings.py).
PACKAGES = ("torchtune", "torchao")
DATA_PACKS = True
RUNTIME = "torchtune"
TRAINED_WITH = "torchtune"

__all__ = [
    "DATA_PACKS",
    "NAME",
    "PACKAGES",
    "RUNTIME",
    "TRAINED_WITH",
    "TRAINER_IMAGE",
    "check_node_command",
    "evaluation",
    "hyperparameters",
    "last_adapter_state",
    "merged_model_dir",
    "read_resolved_config",
    "resume_point",
    "run_node_command",
    "serves",
]


def serves(model_dir: Path, hf_config: dict, task: str = GENERATION) -> tuple[bool, str]:
    """Whether torchtune 0.6.1 (with this project's builders) has the model's family, from config.json and the
    tokenizer files alone; it trains text generation only (its recipes have no sequence-classification loss)."""
    if task != GENERATION:
        return (
            False,
            f"torchtune's recipes train text generation only, not {task} (the transformers engine does)",
        )
    from kfp_finetune.components._shared.torchtune.model_inspection import detect_family

    try:
        family = detect_family(Path(model_dir), hf_config)
    except ConfigError as err:
        return False, str(err)
    return True, f"torchtune serves the {family} family"


def resume_point(run_dir: Path) -> str | None:
    """The newest complete checkpoint an earlier attempt of the run saved, described; None when there is none."""
    from kfp_finetune.components._shared.torchtune.resume import latest

    point = latest(run_dir)
    return point.describe() if point is not None else None


def evaluation() -> ModuleType:
    from kfp_finetune.components._shared.torchtune import evaluation as module

    return module
