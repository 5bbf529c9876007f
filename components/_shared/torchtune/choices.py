"""What the defaults chose where the user set nothing, each with its reason, and how a setting counts as the user's.

A `Choice` is one line of the step log, one row of the report and one entry of the train_config metadata. A
`warning` Choice changes nothing: it tells the user that their own settings plan a run that may not learn (and
what to change); it is logged at WARNING level and shown first in the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig


@dataclass
class Choice:
    setting: str
    value: Any
    reason: str
    warning: bool = False

    def line(self) -> str:
        if self.warning:
            return f"WARNING: {self.setting} = {self.value}: {self.reason}"
        return f"default {self.setting} = {self.value}: {self.reason}"


def user_set(cfg: TorchtuneConfig, field: str | None, key: str) -> bool:
    """True when the typed `field` is set or an override names `key` (or a node above or below it)."""
    if field is not None:
        holder = cfg.lora if field.startswith(("lora_", "apply_lora")) else cfg
        if getattr(holder, field, None) is not None:
            return True
    for raw in cfg.overrides:
        name = str(raw).lstrip("+~")
        if name == key or name.startswith(key + ".") or key.startswith(name + "."):
            return True
    return False


def record(choices: list[Choice], choice: Choice) -> None:
    """Add `choice`, replacing an earlier one for the same setting (a later rule refined it)."""
    choices[:] = [c for c in choices if c.setting != choice.setting or c.warning != choice.warning]
    choices.append(choice)
