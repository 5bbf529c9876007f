"""What a TrainJob node pod runs for the transformers engine (the fine-tune step's entrypoint.py calls these
through the face): plan.SftRun's command, `python -m <train module> <settings>` on one device or `torchrun [flags]
-m <train module> <settings>` on several.

- `check_node_command(argv)`: the settings file read and checked, the base model served by the transformers
  installed in this image (it may differ from the launcher's), and TRL's and transformers' own argument checks
  (settings.trl_config) — what the launcher, which has no torch, leaves to the pod. Returns the run folder and
  what was checked; ConfigError when the run must not train.
- `run_node_command(argv)`: the training in this process (one device) or torchrun's agent here, which starts one
  worker per device (several).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.transformers.plan import MODULE as TRAIN_MODULE
from kfp_finetune.components._shared.transformers.plan import by_parameter

USAGE = f"python -m {TRAIN_MODULE} <settings.json> | torchrun [flags] -m {TRAIN_MODULE} <settings.json>"


def settings_path(argv: list[str]) -> Path:
    """The settings file of a command plan.SftRun wrote; SystemExit with the usage for any other command."""
    single = argv[:1] == ["python"] and argv[1:3] == ["-m", TRAIN_MODULE] and len(argv) == 4
    several = argv[:1] == ["torchrun"] and len(argv) >= 4 and argv[-3:-1] == ["-m", TRAIN_MODULE]
    if not (single or several):
        raise SystemExit(f"usage: {USAGE}")
    return Path(argv[-1])


def world_size() -> int:
    """The processes the TrainJob starts over all nodes, from the PET_* environment Trainer sets (1 without it)."""
    per_node = os.environ.get("PET_NPROC_PER_NODE", "1")
    per_node = int(per_node) if per_node.isdigit() else 1  # "auto"/"gpu" leave it to torchrun
    return int(os.environ.get("PET_NNODES") or 1) * per_node


def check_node_command(argv: list[str], *, local: bool = False) -> tuple[Path, list[str]]:
    """(run folder, lines saying what was checked); ConfigError naming the problem when the run cannot train.
    Imports torch and TRL; reads no weights. A local run (`local`, the local backend's child) is checked the same:
    this engine has no check that only node pods make."""
    from kfp_finetune.components._shared import engines
    from kfp_finetune.components._shared.transformers.face import serves
    from kfp_finetune.components._shared.transformers.settings import SftSettings

    path = settings_path(argv)
    if importlib.util.find_spec("trl") is None:
        raise ConfigError(
            "this image has no TRL, which the transformers engine trains with: set tune_runtime=auto (the "
            "`transformers` runtime) or name a runtime whose image is kfp-finetune-trainer-transformers"
        )
    settings = SftSettings.from_json(path)
    served, reason = serves(Path(settings.model_dir), engines.model_config(settings.model_dir), settings.task)
    if not served:
        raise ConfigError(f"this image cannot train the model in {settings.model_dir}: {reason}")
    try:
        settings.trl_config(world_size())
    except SettingError as error:
        raise by_parameter(error) from None
    return path.parent, [f"settings {path.name} checked (TRL and transformers argument checks; {reason})"]


def run_node_command(argv: list[str]) -> int:
    """Train as the command says, in this process (torch is imported once per pod, not again by a child)."""
    path = settings_path(argv)
    if argv[0] == "torchrun":
        from torch.distributed.run import main as torchrun

        torchrun(argv[1:])
        return 0
    from kfp_finetune.components._shared.transformers.train import main as train

    return train([str(path)])
