"""A real MLflow tracking server (the `mlflow` package's own `mlflow server`) on 127.0.0.1, with a SQLite backend
store and artifacts served by the server itself, for the tracking tests. Started once per module; ready when its
/health endpoint answers (polled, not slept on)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STARTUP_SECONDS = 180  # a cold start creates and migrates the SQLite store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """The server's http:// address while the block runs."""
    port = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
            "--artifacts-destination", str(folder / "artifacts"),
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    address = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(folder / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{address}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("mlflow server did not answer /health") from None
                time.sleep(0.5)
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
