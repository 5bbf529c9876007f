"""The metrics file torchtune's DiskLogger writes (`logs/metrics.txt` in a fine-tune's run folder), parsed.

One line per logged step: `Step N | loss:2.31 lr:0.0003 tokens_per_second_per_gpu:812.5 ` (plus `peak_memory_*`
on CUDA). torchtune-finetune reads it (and the same lines from its process and from TrainJob pod logs); evaluate
reads the file a tuned model's metadata names (`metrics_file`) to draw the training curve in its report.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_STEP_LINE = re.compile(r"Step (\d+) \| (.*)$")
#: Written by the metric logger when a run resumes from the checkpoint after step N: the steps after N logged
#: before it were trained again, and their lines after it are the ones that count.
RESUMED = "Resumed after step"
_RESUMED_LINE = re.compile(re.escape(RESUMED) + r" (\d+)\b")
_PAIR = re.compile(r"([A-Za-z_][\w/.-]*):(\S+)")


@dataclass
class StepMetrics:
    step: int
    values: dict[str, float] = field(default_factory=dict)

    @property
    def loss(self) -> float | None:
        return self.values.get("loss")

    @property
    def tokens_per_second(self) -> float | None:
        return self.values.get("tokens_per_second_per_gpu")


def parse_metric_line(line: str) -> StepMetrics | None:
    """The metrics of one `Step N | k:v ...` line (anywhere in the line), or None for any other line."""
    match = _STEP_LINE.search(line.strip())
    if not match:
        return None
    values = {}
    for name, raw in _PAIR.findall(match.group(2)):
        try:
            values[name] = float(raw)
        except ValueError:
            continue
    return StepMetrics(int(match.group(1)), values) if values else None


def resumed_after(line: str) -> int | None:
    """N for a `Resumed after step N ...` line, else None."""
    match = _RESUMED_LINE.search(line)
    return int(match.group(1)) if match else None


def resume_points(lines: Iterable[str]) -> list[int]:
    """The steps a run resumed after, in order."""
    return [step for line in lines for step in [resumed_after(line)] if step is not None]


def collect_steps(lines: Iterable[str]) -> list[StepMetrics]:
    """Step metrics from lines, one entry per step (values logged separately for a step are merged). After a
    `Resumed after step N` line, the steps after N logged before it are dropped: they were trained again."""
    by_step: dict[int, StepMetrics] = {}
    for line in lines:
        resumed = resumed_after(line)
        if resumed is not None:
            by_step = {step: metrics for step, metrics in by_step.items() if step <= resumed}
            continue
        parsed = parse_metric_line(line)
        if parsed:
            by_step.setdefault(parsed.step, StepMetrics(parsed.step)).values.update(parsed.values)
    return [by_step[step] for step in sorted(by_step)]


def read_metrics_file(path: str | Path) -> list[StepMetrics]:
    return collect_steps(Path(path).read_text().splitlines())


def read_resume_points(path: str | Path) -> list[int]:
    """The steps the run in this file resumed after (0: it started over), in order."""
    return resume_points(Path(path).read_text().splitlines())
