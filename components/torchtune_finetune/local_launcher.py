"""Run `tune run ...` as a child process: stream its output into the step log, parse torchtune's metric lines,
stop it cleanly on SIGTERM/SIGINT, and fail with the exit code and the last lines when it fails.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.torchtune_finetune.metrics import StepMetrics, parse_metric_line, progress_line

log = get_logger(__name__)

# torchtune's tqdm bar ("1|5|Loss: 2.3:  50%|█████ | 5/10 [...]"), redrawn with \r on stderr: replaced by our
# progress lines. A metric line printed to stdout can land right after a bar on the same line.
_PROGRESS_BAR = re.compile(r"^\d+\|\d+\|Loss: ")
_METRIC_START = re.compile(r"Step \d+ \| ")
STOP_GRACE_SECONDS = 30.0


class TrainingFailed(RuntimeError):
    """The training process exited non-zero; the message carries the exit code and the last output lines."""

    def __init__(self, message: str, returncode: int | None, tail: list[str]):
        super().__init__(message)
        self.returncode = returncode
        self.tail = tail


@dataclass
class TrainingResult:
    command: list[str]
    returncode: int
    wall_seconds: float
    steps: list[StepMetrics] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


def resolve_executable(command: list[str]) -> list[str]:
    """Run `tune` from this interpreter's environment (a venv need not be on PATH)."""
    if command and command[0] == "tune":
        beside = Path(sys.executable).parent / "tune"
        found = str(beside) if beside.exists() else shutil.which("tune")
        if not found:
            raise FileNotFoundError("the `tune` command of torchtune is not installed: pip install torchtune")
        return [found, *command[1:]]
    return command


def run_local(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    total_steps: int | None = None,
    tail_lines: int = 50,
    echo: Callable[[str], None] | None = None,
) -> TrainingResult:
    """Run the training command to completion; raise TrainingFailed unless it exits 0."""
    echo = echo or (lambda line: print(line, flush=True))
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    log.info("running: %s", " ".join(command))
    process = subprocess.Popen(
        resolve_executable(command),
        cwd=cwd,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a stop reaches torchrun's workers too
    )
    stop = _StopForwarder(process)
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    steps: list[StepMetrics] = []
    with stop:
        for line in _lines(process.stdout):
            if _PROGRESS_BAR.match(line):
                metric_start = _METRIC_START.search(line)
                if not metric_start:
                    continue
                line = line[metric_start.start() :]
            tail.append(line)
            metrics = parse_metric_line(line)
            if metrics:  # shown as a progress line; the raw line is kept in the run's metrics file
                steps.append(metrics)
                echo(progress_line(metrics, total_steps, _eta(started, metrics.step, total_steps)))
            else:
                echo(line)
        returncode = process.wait()
    wall = time.monotonic() - started
    if stop.signal_received is not None:
        raise TrainingFailed(
            f"training stopped by signal {signal.Signals(stop.signal_received).name} after {wall:.0f}s",
            returncode,
            list(tail),
        )
    if returncode != 0:
        last = "\n".join(tail)
        raise TrainingFailed(
            f"training failed with exit code {returncode} after {wall:.0f}s; last {len(tail)} lines:\n{last}",
            returncode,
            list(tail),
        )
    return TrainingResult(command, returncode, wall, steps, list(tail))


def _lines(stream) -> collections.abc.Iterator[str]:
    """Decoded lines, splitting on \\n and on the \\r that progress bars redraw with."""
    buffer = b""
    while chunk := stream.read1(65536):
        buffer += chunk
        *complete, buffer = re.split(rb"\r\n|\r|\n", buffer)
        for raw in complete:
            if raw.strip():
                yield raw.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


def _eta(started: float, step: int, total_steps: int | None) -> float | None:
    if not total_steps or step <= 0:
        return None
    return (time.monotonic() - started) / step * max(total_steps - step, 0)


class _StopForwarder:
    """While active, SIGTERM/SIGINT stop the child's process group (TERM, then KILL after a grace period)."""

    def __init__(self, process: subprocess.Popen, grace: float = STOP_GRACE_SECONDS):
        self.process, self.grace = process, grace
        self.signal_received: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _StopForwarder:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        if self.process.poll() is None:
            self._terminate()

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal_received = signum
        log.warning("received %s: stopping training", signal.Signals(signum).name)
        threading.Thread(target=self._terminate, daemon=True).start()

    def _terminate(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
