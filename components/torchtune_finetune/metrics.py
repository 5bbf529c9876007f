"""torchtune's metric lines during and after a run — one format for the local process, TrainJob pod logs and the
metrics file (the line format and its parser: _shared/metrics_file.py, which evaluate reads too).

torchtune's DiskLogger writes `Step N | loss:2.31 lr:0.0003 tokens_per_second_per_gpu:812.5 ` per logged step
(plus `peak_memory_*` on CUDA). `TeeMetricLogger` writes the same lines to the file *and* stdout, so a TrainJob's
pod log carries them too and the launcher can show progress without reading the workspace.

A NaN or infinite loss means the run diverged: every step after it is wasted and its weights are garbage. Both
backends stop the run at the first such line (`divergence`), and no summary ever reports a non-finite loss.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import RESUMED, StepMetrics, read_resume_points
from kfp_finetune.components.torchtune_finetune.progress import ProgressClock, TrainerStatusReporter
from kfp_finetune.components.torchtune_finetune.throughput import STEP_SECONDS

log = get_logger(__name__)

_KUBELET_TIMESTAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ?")


# What usually makes a run diverge, as the pipeline parameters that fix it.
DIVERGENCE_CAUSES = (
    "usual causes: a learning rate too high for the method (lower tune_learning_rate), fp16 without loss "
    "scaling (train in bf16: tune_dtype bf16), no gradient clipping (set tune_overrides "
    '{"clip_grad_norm": 1.0})'
)


class LossDiverged(RuntimeError):
    """The training loss became NaN or infinite; the run was stopped there (one-line message with the fixes).

    Attributes:
        step: The first step that logged a non-finite loss.
        loss: That loss (nan, inf or -inf).
    """

    def __init__(self, step: int, loss: float, where: str = ""):
        super().__init__(
            f"loss diverged at step {step} (loss={loss}){' in ' + where if where else ''}: training stopped; "
            + DIVERGENCE_CAUSES
        )
        self.step, self.loss = step, loss


def divergence(metrics: StepMetrics) -> LossDiverged | None:
    """The divergence when the step logged a NaN or infinite loss, else None."""
    if metrics.loss is not None and not math.isfinite(metrics.loss):
        return LossDiverged(metrics.step, metrics.loss)
    return None


def first_divergence(steps: Iterable[StepMetrics]) -> LossDiverged | None:
    """The divergence at the first step with a non-finite loss, or None when every logged loss is finite."""
    return next((diverged for s in steps if (diverged := divergence(s)) is not None), None)


def summarize(steps: list[StepMetrics]) -> dict[str, float]:
    """Final/min loss, mean tokens/s and peak memory over a run's steps (only what was logged)."""
    losses = [s.loss for s in steps if s.loss is not None and math.isfinite(s.loss)]
    speeds = [s.tokens_per_second for s in steps if s.tokens_per_second is not None]
    summary: dict[str, float] = {"logged_steps": float(len(steps))}
    if losses:
        summary.update(final_loss=losses[-1], min_loss=min(losses), first_loss=losses[0])
    if speeds:
        summary["tokens_per_second"] = sum(speeds) / len(speeds)
    peaks = [v for s in steps for k, v in s.values.items() if k.startswith("peak_memory")]
    if peaks:
        summary["peak_memory_gib"] = max(peaks)
    return summary


class TeeMetricLogger:
    """A torchtune metric logger (`metric_logger._component_`) that writes DiskLogger's format to a file and stdout.

    Duck-typed to torchtune's MetricLoggerInterface so this module stays importable without torch. Each step line
    after the first also carries `seconds_per_step`: the wall time since the previous step line per optimizer step
    (torchtune logs no step time; throughput.py needs it for the processed token rate).
    """

    def __init__(self, log_dir: str, filename: str = "metrics.txt", **_: object):
        path = Path(log_dir)
        path.mkdir(parents=True, exist_ok=True)
        self._path = path / filename
        self._file = open(self._path, "a")  # noqa: SIM115 - kept open for the whole run, closed in close()
        self._last: tuple[int, float] | None = None  # (step, monotonic time) of the previous step line
        self._progress = ProgressClock()
        self._trainer_status = TrainerStatusReporter()

    @property
    def total_steps(self) -> int | None:
        """The run's optimizer steps, for percent and ETA (the recipe module sets it once it knows)."""
        return self._progress.total_steps

    @total_steps.setter
    def total_steps(self, value: int | None) -> None:
        self._progress.total_steps = value

    def path_to_log_file(self) -> Path:
        return self._path

    def _write(self, text: str) -> None:
        self._file.write(text + "\n")
        self._file.flush()
        print(text, file=sys.stdout, flush=True)

    def log(self, name: str, data: float, step: int) -> None:
        self._write(f"Step {step} | {name}:{data}")

    def log_dict(self, payload: Mapping[str, float], step: int) -> None:
        now = time.monotonic()
        if self._last is not None and step > self._last[0]:
            seconds = (now - self._last[1]) / (step - self._last[0])
            payload = {**payload, STEP_SECONDS: round(seconds, 6)}
        self._last = (step, now)
        self._write(f"Step {step} | " + " ".join(f"{name}:{value}" for name, value in payload.items()))
        if self._trainer_status.enabled:
            values = {name: float(value) for name, value in payload.items() if _is_number(value)}
            progress = self._progress.update(StepMetrics(step, values))
            self._trainer_status.report(progress, final=step == self.total_steps)

    def mark_resume(self, step: int, how: str) -> None:
        """Say in the file that training continues after `step` (0: starts over), and `how`; the steps after it
        logged before are dropped by metrics_file.collect_steps."""
        self._last = None  # no step time across the restart
        self._write(f"{RESUMED} {step} ({how})")

    def has_steps(self) -> bool:
        """Whether an earlier process already logged steps to the file (a restart)."""
        return self._path.stat().st_size > 0

    def log_config(self, config: object) -> None:
        """The resolved config is already written next to the outputs by the engine."""

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __del__(self) -> None:
        self.close()


def _is_number(value: object) -> bool:
    try:
        float(value)  # a float, an int or a one-element tensor
    except (TypeError, ValueError):
        return False
    return True


def kubelet_timestamp_ns(line: str) -> tuple[int | None, str]:
    """The kubelet timestamp of a `timestamps=true` pod log line (ns since the epoch) and the line without it."""
    match = _KUBELET_TIMESTAMP.match(line)
    if not match:
        return None, line
    offset = "+00:00" if match.group(3) == "Z" else match.group(3)
    seconds = int(datetime.fromisoformat(match.group(1) + offset).timestamp())
    return seconds * 1_000_000_000 + int((match.group(2) or "0").ljust(9, "0")), line[match.end() :]


def run_metrics(
    summary: dict[str, float], steps: list[StepMetrics], wall: float, resumed: list[int] | None = None
) -> dict[str, float]:
    """The step's Metrics from a run's summary: losses, steps, wall time, speed and memory where logged, and how
    often training resumed (`resumed`: the steps it resumed after, metrics_file.read_resume_points)."""
    metrics = {k: summary[k] for k in ("final_loss", "min_loss", "first_loss") if k in summary}  # finite only
    metrics.update(steps=float(len(steps)), wall_seconds=round(wall, 3))
    if resumed:
        metrics["resumes"] = float(len(resumed))
    if "tokens_per_second" in summary:
        metrics["tokens_per_second"] = summary["tokens_per_second"]
        # torchtune logs tokens/s per step; over the training wall time that bounds the trained tokens.
        metrics["trained_tokens_estimate"] = float(round(summary["tokens_per_second"] * wall))
    if "peak_memory_gib" in summary:
        metrics["peak_memory_gib"] = summary["peak_memory_gib"]
    return metrics


def read_resumes(metrics_path: Path, steps: list[StepMetrics]) -> list[int]:
    """The steps the run in the metrics file resumed after (a retry, a replaced pod; 0: it started over), logged."""
    resumed = read_resume_points(metrics_path)
    if resumed:
        log.info("training resumed after step(s) %s of %d", ", ".join(map(str, resumed)), len(steps))
    return resumed
