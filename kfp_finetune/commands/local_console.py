"""What a local run (`run-local`, `demo`) shows: task starts and ends, what dataset-initialize says about the data
(columns dropped, rows cut, row counts), every step's warnings, a training progress line now and then, and the
end of a failed task's log. Everything, kfp.local's executor JSON and library warnings included, goes to a
log file.

kfp.local writes its own log lines and each step's streamed output through `sys.stdout` (its logger's handler is
bound to `sys.stdout` when each message is logged: kfp/local/logging_utils.py `local_logger_context`), so
replacing `sys.stdout` and `sys.stderr` for the run is enough; no kfp internals are touched.
"""

from __future__ import annotations

import collections
import contextlib
import io
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# kfp.local's own lines (kfp/local/task_dispatcher.py, pipeline_orchestrator.py), after the ANSI colours are gone.
_TASK_STARTED = re.compile(r" - INFO - Executing task '([^']+)'")
_TASK_FINISHED = re.compile(r" - (?:INFO|ERROR) - Task '([^']+)' finished with status (\w+)")
# A step's own log line (components/_shared/logs.py `_FORMAT`, indented by kfp.local's stream): level, message.
_STEP_LOG = re.compile(r"^\s*\d\d:\d\d:\d\d (INFO|WARNING|ERROR|CRITICAL) kfp_finetune\.[\w.]+: (.*)$")
# Steps whose every log line is shown: what dataset-initialize did to the data (dropped columns, rows cut to
# max_seq_len, row counts) changes what is trained on.
SHOWN_STEPS = ("dataset-initialize",)
# The fine-tune step's progress lines (components/torchtune_finetune/metrics.py `progress_line`).
_PROGRESS = re.compile(r"progress: step (\d+)(?:/(\d+))?")
# A progress line is shown at most this often, and only after 5 % more of the run: at most ~20 per training.
PROGRESS_EVERY_SECONDS = 5.0
_PROGRESS_MIN_FRACTION = 0.05
# Lines of a failed task's log shown on the terminal (the log file has all of it).
FAILURE_TAIL_LINES = 25


class QuietConsole(io.TextIOBase):
    """A text stream that writes every line to `log` and the lines worth seeing to `terminal`."""

    def __init__(self, terminal: TextIO, log: TextIO, verbose: bool = False):
        self.terminal, self.log, self.verbose = terminal, log, verbose
        self._pending = ""
        self._lock = threading.Lock()
        self._task_tail: collections.deque[str] = collections.deque(maxlen=FAILURE_TAIL_LINES)
        self._task_started: dict[str, float] = {}
        self._task = ""  # the task running now (kfp.local runs one at a time)
        self._last_progress = (float("-inf"), -1)  # (time, step) of the last progress line shown

    @property
    def encoding(self) -> str:
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            for line in lines:
                self._line(_ANSI.sub("", line))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self.log.flush()
            self.terminal.flush()

    def close_pending(self) -> None:
        """Hand on a last line that had no newline."""
        if self._pending:
            self.write("\n")

    def _line(self, line: str) -> None:
        self.log.write(line + "\n")
        if self.verbose:
            self._show(line)
            return
        if started := _TASK_STARTED.search(line):
            self._task_tail.clear()
            self._task_started[started[1]] = time.monotonic()
            self._last_progress = (float("-inf"), -1)
            self._task = started[1]
            self._show(f"  {started[1]}: started")
        elif finished := _TASK_FINISHED.search(line):
            name, status = finished[1], finished[2]
            seconds = time.monotonic() - self._task_started.pop(name, time.monotonic())
            self._task = ""
            if status == "SUCCESS":
                self._show(f"  {name}: done in {seconds:.0f}s")
            else:
                self._show(f"  {name}: {status}; the end of its log:")
                for tail in self._task_tail:
                    self._show(f"    | {tail}")
        elif progress := _PROGRESS.search(line):
            self._task_tail.append(line.strip())
            if self._progress_due(int(progress[1]), int(progress[2] or 0)):
                self._show(f"    {line.strip()}")
        elif said := _STEP_LOG.match(line):
            self._task_tail.append(line.strip())
            level, message = said[1], said[2]
            if level != "INFO":
                self._show(f"    {level.lower()}: {message}")
            elif self._task in SHOWN_STEPS:
                self._show(f"    {message}")
        elif line.strip():
            self._task_tail.append(line.strip())

    def _progress_due(self, step: int, total: int) -> bool:
        now = time.monotonic()
        last_time, last_step = self._last_progress
        first_or_last = last_step < 0 or step == total
        far_enough = total == 0 or step - last_step >= max(1, total * _PROGRESS_MIN_FRACTION)
        if first_or_last or (now - last_time >= PROGRESS_EVERY_SECONDS and far_enough):
            self._last_progress = (now, step)
            return True
        return False

    def _show(self, line: str) -> None:
        self.terminal.write(line + "\n")
        self.terminal.flush()


@contextlib.contextmanager
def quiet_console(
    log_path: str | Path, verbose: bool = False, append: bool = False
) -> Iterator[QuietConsole]:
    """Route `sys.stdout` and `sys.stderr` through a QuietConsole writing to `log_path` (replaced unless `append`)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    terminal = sys.stdout
    with open(log_path, "a" if append else "w", encoding="utf-8") as log:
        console = QuietConsole(terminal, log, verbose=verbose)
        try:
            with contextlib.redirect_stdout(console), contextlib.redirect_stderr(console):
                yield console
        finally:
            console.close_pending()
            console.flush()
