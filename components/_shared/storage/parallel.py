"""The one parallel runner of every transfer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def run_parallel(action: Callable[[T], None], items: Iterable[T], max_workers: int) -> None:
    """Run `action` on every item in up to `max_workers` threads; re-raises the first failure."""
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        for future in [pool.submit(action, item) for item in items]:
            future.result()
