"""How a TrainJob ended, read from its status conditions (Trainer v2.3: Suspended, Complete, Failed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kfp_finetune.components._shared.metrics_file import StepMetrics


@dataclasses.dataclass
class TrainJobResult:
    """How a TrainJob ended.

    Attributes:
        name: TrainJob name.
        namespace: Its namespace.
        status: Final state: "Complete" or "Failed".
        created: False when we attached to a TrainJob that already existed (retry).
        deleted: Whether the launcher deleted the TrainJob at the end.
        log_lines: Rank-0 log lines shown, in order.
        steps: torchtune step metrics parsed from those lines.
        wall_time: Seconds from launch to the end.
        reason: The terminal condition's reason.
        message: The terminal condition's message.
    """

    name: str
    namespace: str
    status: str
    created: bool
    deleted: bool = False
    log_lines: list[str] = dataclasses.field(default_factory=list)
    steps: list[StepMetrics] = dataclasses.field(default_factory=list)
    wall_time: float = 0.0
    reason: str = ""
    message: str = ""


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict | None:
    """The TrainJob's condition of that type when it is True, else None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def terminal_state(obj: Mapping[str, Any] | None) -> str | None:
    """ "Complete" or "Failed" once the TrainJob has finished, else None."""
    for type_ in ("Failed", "Complete"):
        if condition(obj, type_):
            return type_
    return None
