"""SIGTERM/SIGINT while a step waits on its training: the run was cancelled or the pod is being evicted.

`StopSignals` is a small context manager: while active, both signals call `on_signal(signum)` instead of ending
the process; on exit (or `restore()`) the previous handlers come back, so a second signal after we reacted ends us
the default way. Signal handlers can only be installed from the main thread; elsewhere it does nothing.
`raise_interrupted` is the `on_signal` that turns the signal into an `Interrupted` exception in the main thread.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """Raised by `raise_interrupted` in the main thread (BaseException: nothing on the way may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def raise_interrupted(signum: int) -> None:
    raise Interrupted(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """While active, SIGTERM/SIGINT call `on_signal(signum)` (main thread only; `enabled=False`: never).

    Attributes:
        received: The last signal received, None while none came.
    """

    def __init__(self, on_signal: Callable[[int], None], *, enabled: bool = True) -> None:
        self._on_signal = on_signal
        self._enabled = enabled
        self._previous: dict[int, Any] = {}
        self.received: int | None = None

    def __enter__(self) -> StopSignals:
        if self._enabled and threading.current_thread() is threading.main_thread():
            self._previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.restore()

    def restore(self) -> None:
        """Put the previous handlers back (once; later calls do nothing)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.received = signum
        self._on_signal(signum)
