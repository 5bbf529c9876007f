"""What the real servers the tests start share: a free port on 127.0.0.1, and waiting until one answers (polled,
never slept on), failing with its log when it exits or never answers."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(
    command: list[str], log: Path, answers: Callable[[], bool], name: str, seconds: float,
    env: dict[str, str] | None = None,
) -> Iterator[None]:  # fmt: skip
    """The server `command` starts (with `env` added to the environment), its output in `log`, from when it
    answers until the block ends."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            _wait_until_ready(process, answers, log, name, seconds)
            yield
        finally:
            process.terminate()
            process.wait(timeout=30)


def _wait_until_ready(
    process: subprocess.Popen, answers: Callable[[], bool], log: Path, name: str, seconds: float
) -> None:
    """Poll `answers` (True once the server serves; an OSError while it starts) until it is True."""
    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if answers():
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{name} did not answer in {seconds:.0f} s: {log.read_text(errors='replace')[-2000:]}"
            )
        time.sleep(0.2)
