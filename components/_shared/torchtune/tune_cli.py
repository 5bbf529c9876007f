"""torchtune's own entry points, run in this process: the `tune` command and a recipe file loaded as a module.

Importing either imports torch and torchtune: only the training process and evaluate's lm-eval path call them.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from kfp_finetune.components._shared.torchtune import installed


def run_tune(argv: list[str]) -> int:
    """`tune run ...` as torchtune's `tune` command runs it, in this process. torchtune reads sys.argv itself (it
    tells torchrun flags from the recipe's arguments by its length), so it is set as the `tune` script would see it."""
    from torchtune._cli.tune import main as tune_main

    sys.argv = list(argv)
    tune_main()
    return 0


def recipe_module(name: str) -> ModuleType:
    """torchtune's recipe `name` (e.g. eleuther_eval), loaded from its file as `tune run` does: the `recipes`
    folder refuses to be imported as a package."""
    spec = importlib.util.spec_from_file_location(f"kfp_finetune_{name}", installed.recipe_file(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
