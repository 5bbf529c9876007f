"""The one progress reporter of every transfer: files and bytes done / total and throughput, logged every
`interval` seconds while it runs and once at the end."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)


def human(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num_bytes) < 1024:
            return f"{num_bytes:.1f} {unit}" if unit != "B" else f"{int(num_bytes)} B"
        num_bytes /= 1024
    return f"{num_bytes:.1f} TiB"


class Progress:
    """Reports a transfer. Downloads pass `measure_dir`: bytes are measured on disk there (partial files
    included), so it works for every client; with `count_on_disk` (clients without a per-file callback) files
    done are the finished files on disk: not `*.incomplete` and not under a `.cache` folder. Uploads pass no
    folder: `file_done(size)` counts files and bytes.
    """

    def __init__(
        self,
        *,
        what: str,
        total_files: int,
        total_bytes: int,
        measure_dir: Path | None = None,
        count_on_disk: bool = False,
        interval: float | None = None,
    ):
        self.what, self.measure_dir, self.count_on_disk = what, measure_dir, count_on_disk
        self.total_files, self.total_bytes = total_files, total_bytes
        self.interval = interval or float(os.environ.get("KFP_FINETUNE_PROGRESS_INTERVAL", "10"))
        self.files_done = self.bytes_done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def file_done(self, size: int = 0) -> None:
        with self._lock:
            self.files_done += 1
            self.bytes_done += size

    def _bytes_on_disk(self, root: Path) -> int:
        total = 0
        for folder, _, names in os.walk(root):
            for name in names:
                with contextlib.suppress(OSError):  # a temp file renamed between walk and stat
                    total += os.lstat(os.path.join(folder, name)).st_size
        return total

    def _files_on_disk(self, root: Path) -> int:
        count = 0
        for _folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d != ".cache"]  # the hub client's partial downloads
            count += sum(1 for name in names if not name.endswith(".incomplete"))
        return count

    def report(self, final: bool = False) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        if final:
            done, files = self.total_bytes, self.total_files
        else:
            measured = self._bytes_on_disk(self.measure_dir) if self.measure_dir else self.bytes_done
            done = min(measured, self.total_bytes)
            counted = self.count_on_disk and self.measure_dir
            files = self._files_on_disk(self.measure_dir) if counted else self.files_done
        log.info(
            "%s: %s%d/%d files, %s / %s, %s/s",
            self.what, "done: " if final else "", files, self.total_files,
            human(done), human(self.total_bytes), human(done / elapsed),
        )  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def __enter__(self) -> Progress:
        log.info("%s: %d files, %s", self.what, self.total_files, human(self.total_bytes))
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            self.report(final=True)
