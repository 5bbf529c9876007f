"""The transformers engine's face: what the steps above the wings may ask of a run it trained (see
_shared/torchtune/face.py for the names every face has).

- `serves(model_dir, hf_config, task)`: whether the installed transformers has the model's class for the task
  (a causal LM; a sequence classifier; a vision-language model) natively;
- `read_resolved_config(run_dir)`: the settings the run trained with, `trl_config.json` ({} when absent);
- `hyperparameters(resolved)`: what a model card shows of them (TRL's arguments as the trainer had them, PEFT's);
- `last_adapter_state(run_dir)`: the run's PEFT adapter folder, None for a full fine-tune;
- `merged_model_dir(run_dir, base_dir)`: the HF folder of the base with the adapter merged in, built once;
- `evaluation()`: the module that loads the tuned model and scores eval rows as TRL tokenized and masked them;
- `DATA_PACKS`: False: TRL tokenizes the rows itself (dataset-initialize writes no packs for this engine);
- `RUNTIME`: `transformers` (runtimes/transformers.yaml: the image with the pinned transformers / TRL / PEFT);
- `TRAINER_IMAGE`: that image, kfp-finetune-trainer-transformers: evaluate needs its TRL and transformers 5 to
  build the eval rows as training did and to load families transformers 4 lacks;
- `check_node_command(argv)` / `run_node_command(argv)`: a TrainJob node pod's checks of the training command
  (the settings, the model served by the image's transformers, TRL's argument checks), then the command (node.py).

Beyond the common names, this wing plans its own runs: `plan_run(settings, model_dir=, data_files=, run_dir=,
data_hints=, devices=, nodes=, num_rows=)` plans and checks a run from the fine-tune step's settings (plan.py; its
length from the row count: run_length.py), `check_settings(settings, model_dir)` makes the same checks for pre-flight, and
`preview(settings, model_dir=, data_files=, run_dir=, devices=, nodes=)` is the settings file a run would get
(`kfp-finetune resolve-config`; its length planned from the data files' rows where they are here). torchtune's
face has neither: the step plans torchtune's runs itself (resolve.py over dataset-initialize's packs).

No torch here: the merge and `evaluation()` import it when called.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from kfp_finetune.components._shared.engines import CLASSIFICATION, GENERATION, IMAGE_TEXT
from kfp_finetune.components._shared.images import TRANSFORMERS_TRAINER_IMAGE
from kfp_finetune.components._shared.transformers import installed
from kfp_finetune.components._shared.transformers.node import check_node_command, run_node_command
from kfp_finetune.components._shared.transformers.plan import check_settings, plan_run, preview
from kfp_finetune.components._shared.transformers.run_layout import (
    hyperparameters,
    last_adapter_state,
    merged_model_dir,
    read_resolved_config,
)

NAME = "transformers"
#: The installed packages only this wing imports (tests/components/test_engine_wings.py). transformers and peft
#: are not exclusive: the torchtune wing's parity checks use them too.
PACKAGES = ("trl",)
DATA_PACKS = False
RUNTIME = "transformers"
TRAINED_WITH = "TRL on transformers"
TRAINER_IMAGE = TRANSFORMERS_TRAINER_IMAGE

__all__ = [
    "DATA_PACKS",
    "NAME",
    "PACKAGES",
    "RUNTIME",
    "TRAINED_WITH",
    "TRAINER_IMAGE",
    "check_node_command",
    "check_settings",
    "evaluation",
    "hyperparameters",
    "last_adapter_state",
    "merged_model_dir",
    "plan_run",
    "preview",
    "read_resolved_config",
    "resume_point",
    "run_node_command",
    "serves",
]


_KINDS = {
    GENERATION: "causal-LM",
    CLASSIFICATION: "sequence-classification",
    IMAGE_TEXT: "vision-language (image-text-to-text)",
}


def serves(model_dir: Path, hf_config: dict, task: str = GENERATION) -> tuple[bool, str]:
    """(True, why) when the installed transformers has a class for config.json's model_type that trains `task` (a
    causal LM; a sequence classifier; a vision-language model), without remote code (auto_map: code from the model's repo, which this
    engine never runs). Imports no torch."""
    if hf_config.get("auto_map"):
        return False, "config.json names remote code (auto_map), which this engine does not run"
    found_version = installed.version()
    if found_version is None:
        return False, "transformers is not installed here"
    model_type = hf_config.get("model_type")
    found = installed.model_classes(task).get(model_type) if isinstance(model_type, str) else None
    kind = _KINDS[task]
    if found is None:
        return False, f"transformers {found_version} has no {kind} class for model_type {model_type!r}"
    return True, f"transformers {found_version} has {found} for model_type {model_type!r}"


def resume_point(run_dir: Path) -> str | None:
    """The newest complete checkpoint an earlier attempt of the run saved (train.last_checkpoint), described;
    None when there is none."""
    from kfp_finetune.components._shared.transformers.settings import TRAINER_DIR
    from kfp_finetune.components._shared.transformers.train import last_checkpoint

    found = last_checkpoint(Path(run_dir) / TRAINER_DIR)
    return f"{found.name} in {found.parent}" if found is not None else None


def evaluation() -> ModuleType:
    from kfp_finetune.components._shared.transformers import evaluation as module

    return module
