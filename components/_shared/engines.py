"""The fine-tuning engines, and the one place that maps an engine's name to its wing.

Each engine's knowledge lives in its own folder under `_shared/` (its wing) and is reached from the steps above
through the wing's face module, which has the names in FACE. A step reads the engine a fine-tune recorded
(`TunedModel.engine`) and asks `face(name)` — it never compares engine names itself
(tests/components/test_engine_wings.py enforces both rules).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from kfp_finetune.components._shared.errors import ConfigError

DEFAULT_ENGINE = "torchtune"
WINGS = {"torchtune": "kfp_finetune.components._shared.torchtune.face"}
FACE = ("NAME", "PACKAGES", "read_resolved_config", "last_adapter_state", "merged_model_dir", "evaluation")


def face(engine: str) -> ModuleType:
    """The face of `engine` ("" is the default engine: fine-tunes recorded before engines were named)."""
    name = engine or DEFAULT_ENGINE
    if name not in WINGS:
        raise ConfigError(
            f"the fine-tuned model names the engine {name!r}, which this version does not know (known: "
            f"{', '.join(WINGS)}): evaluate and export it with the kfp-finetune version that trained it"
        )
    return importlib.import_module(WINGS[name])
