"""What can go wrong running a TrainJob: one exception per outcome the step reports (all `TrainJobError`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kfp_finetune.components._shared.errors import ConfigError

if TYPE_CHECKING:
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import TrainJobResult
    from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged


class TrainJobError(RuntimeError):
    """The TrainJob could not be run to completion."""


class TrainJobFailed(TrainJobError):
    """The TrainJob ended Failed; the message carries the reason, pod terminations and the last log lines."""

    def __init__(self, message: str, result: TrainJobResult):
        super().__init__(message)
        self.result = result


class TrainJobDiverged(TrainJobFailed):
    """The rank-0 log showed a NaN or infinite loss: we stopped following and failed (one-line message).

    Attributes:
        step: The first step with a non-finite loss.
        loss: That loss.
    """

    def __init__(self, diverged: LossDiverged, result: TrainJobResult):
        super().__init__(str(diverged), result)
        self.step, self.loss = diverged.step, diverged.loss


class TrainJobTimeout(TrainJobError):
    """The TrainJob did not finish in time; the message says whether the API confirmed its deletion."""


class TrainJobCancelled(TrainJobError):
    """We were asked to stop (SIGTERM/SIGINT) and deleted the TrainJob; the message says whether the API
    confirmed it."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class TrainJobConflict(TrainJobError):
    """A TrainJob of that name exists and does not belong to this KFP run/task."""


def api_message(error: Any) -> str:
    """The `message` of a Kubernetes Status body, else the HTTP reason."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


class TrainJobForbidden(TrainJobError, ConfigError):
    """The step's ServiceAccount lacks a permission the launcher needs; found before anything was created."""
