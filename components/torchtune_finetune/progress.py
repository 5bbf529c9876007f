"""Training progress from the metric logger's step lines: one computation, shown wherever people look.

    the trainer (metrics.TeeMetricLogger) ── Step lines ──> metrics file, pod log
        └─ Kubeflow Trainer's progress API, where the installed Trainer offers it (status.trainerStatus)
    the launcher (pod_logs.RankZeroLog) ── reads the same lines ──> step log, TrainJob annotations
    the local backend (local.run_local) ── reads the same lines ──> step log

`ProgressClock` turns each step's metrics into a `Progress` (percent, step, ETA from the step rate since the first
step this process saw, last loss, tokens/s); `Progress` renders it for each place.

The Trainer's progress API (KEP-2779; TrainJob CRD v2.3 `status.trainerStatus`, alpha, feature gate
TrainJobStatus): with the gate on, the Trainer injects `KUBEFLOW_TRAINER_STATUS_URL`, `..._CA_CERT` and `..._TOKEN`
(a projected service-account token file) into the node pods, and rank 0 POSTs `{"trainerStatus": {...}}` there
with the token as a bearer token. Without them, the launcher's annotations are the TrainJob's progress.
"""

from __future__ import annotations

import json
import os
import ssl
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib import request

from kfp_finetune.components._shared.metrics_file import StepMetrics

#: TrainJob annotations the launcher keeps current (`kubectl get trainjob -o custom-columns=...`: docs).
ANNOTATION_PROGRESS = "kfp-finetune.io/progress"
ANNOTATION_PERCENT = "kfp-finetune.io/progress-percent"
STATUS_URL = "KUBEFLOW_TRAINER_STATUS_URL"
STATUS_CA_CERT = "KUBEFLOW_TRAINER_STATUS_CA_CERT"
STATUS_TOKEN = "KUBEFLOW_TRAINER_STATUS_TOKEN"
#: The CRD's limits on `trainerStatus.metrics[].value`, and how often a status is sent (the endpoint rate-limits).
_METRIC_VALUE_MAX = 64
REPORT_EVERY_SECONDS = 30.0


@dataclass(frozen=True)
class Progress:
    step: int
    total_steps: int | None
    eta_seconds: float | None
    loss: float | None
    lr: float | None
    tokens_per_second: float | None

    @property
    def percent(self) -> int | None:
        if not self.total_steps:
            return None
        return max(0, min(100, int(100 * self.step / self.total_steps)))

    def line(self) -> str:
        """The step log's progress line."""
        parts = [f"step {self.step}" + (f"/{self.total_steps}" if self.total_steps else "")]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if (
            self.lr is not None
        ):  # torchtune logs it after the scheduler's step: the rate the next step trains with
            parts.append(f"next step's lr {self.lr:.3g}")
        if self.tokens_per_second is not None:
            parts.append(f"{self.tokens_per_second:.1f} tokens/s")
        if self.eta_seconds is not None and self.eta_seconds >= 0:
            parts.append(f"ETA {_duration(self.eta_seconds)}")
        return "progress: " + " | ".join(parts)

    def annotations(self) -> dict[str, str]:
        """The TrainJob's annotations: a percent to sort and filter by, and the line people read."""
        text = self.line().removeprefix("progress: ")
        if self.percent is not None:
            text = f"{self.percent}% | {text}"
        found = {ANNOTATION_PROGRESS: text}
        if self.percent is not None:
            found[ANNOTATION_PERCENT] = str(self.percent)
        return found

    def trainer_status(self, now: datetime | None = None) -> dict:
        """`status.trainerStatus` as the TrainJob CRD (v2.3) defines it."""
        metrics = {"step": self.step, "totalSteps": self.total_steps, "loss": self.loss, "lr": self.lr,
                   "tokensPerSecond": self.tokens_per_second}  # fmt: skip
        status: dict = {
            "metrics": [
                {"name": name, "value": _metric_value(value)}
                for name, value in metrics.items()
                if value is not None
            ],
            "lastUpdatedTime": (now or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if self.percent is not None:
            status["progressPercentage"] = self.percent
        if self.eta_seconds is not None and self.eta_seconds >= 0:
            status["estimatedRemainingSeconds"] = min(int(self.eta_seconds), 2**31 - 1)
        return status


def _metric_value(value: float | int) -> str:
    text = str(value) if isinstance(value, int) else f"{value:.6g}"
    return text[:_METRIC_VALUE_MAX]


def _duration(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


class ProgressClock:
    """Progress from successive step metrics: the ETA from the step rate since the first step this clock saw
    (after a resume, the steps trained since the resume)."""

    def __init__(self, total_steps: int | None = None, clock=time.monotonic) -> None:
        self.total_steps = total_steps
        self._clock = clock
        self._first: tuple[float, int] | None = None

    def update(self, metrics: StepMetrics) -> Progress:
        now = self._clock()
        if self._first is None:
            self._first = (now, metrics.step)
        started, first_step = self._first
        eta = None
        if self.total_steps and metrics.step > first_step:
            eta = (now - started) / (metrics.step - first_step) * max(0, self.total_steps - metrics.step)
        return Progress(
            metrics.step,
            self.total_steps,
            eta,
            metrics.loss,
            metrics.values.get("lr"),
            metrics.tokens_per_second,
        )


class TrainerStatusReporter:
    """Sends progress to the Trainer's progress API when the TrainJob's pods were given its endpoint (see the
    module docstring); at most every REPORT_EVERY_SECONDS, and the last step always. Never stops training: a
    failure is printed once and reporting goes on quietly."""

    def __init__(self, environ: dict[str, str] | None = None, clock=time.monotonic) -> None:
        environ = os.environ if environ is None else environ
        self.url = environ.get(STATUS_URL)
        self._ca_cert = environ.get(STATUS_CA_CERT)
        self._token_file = environ.get(STATUS_TOKEN)
        self._clock = clock
        self._last_sent: float | None = None
        self._failed = False

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def report(self, progress: Progress, *, final: bool = False) -> bool:
        """Send `progress` if due; whether it was sent."""
        now = self._clock()
        if not self.enabled or (
            not final and self._last_sent is not None and now - self._last_sent < REPORT_EVERY_SECONDS
        ):
            return False
        self._last_sent = now
        body = json.dumps({"trainerStatus": progress.trainer_status()}).encode()
        headers = {"Content-Type": "application/json"}
        try:
            if self._token_file:  # re-read each time: the kubelet rotates projected tokens
                with open(self._token_file) as handle:
                    headers["Authorization"] = f"Bearer {handle.read().strip()}"
            context = ssl.create_default_context(cafile=self._ca_cert) if self._ca_cert else None
            with request.urlopen(
                request.Request(self.url, data=body, headers=headers, method="POST"),
                timeout=5,
                context=context,
            ):
                pass
        except Exception as error:  # noqa: BLE001 - progress must never stop training
            if not self._failed:
                self._failed = True
                print(
                    f"kfp-finetune: progress not sent to the Trainer ({type(error).__name__}: {error}); training goes on",
                    flush=True,
                )
            return False
        return True
