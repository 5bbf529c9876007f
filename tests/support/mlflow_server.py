"""A real MLflow tracking server (the `mlflow` package's own `mlflow server`) on 127.0.0.1, with a SQLite backend
store and artifacts served by the server itself, for the tracking tests. Started once per module; ready when its
/health endpoint answers (polled, not slept on)."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.servers import free_port, running

STARTUP_SECONDS = 180  # a cold start creates and migrates the SQLite store


@contextmanager
def mlflow_server(folder: Path) -> Iterator[str]:
    """The server's http:// address while the block runs."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts"),
    ]  # fmt: skip
    address = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        with urllib.request.urlopen(f"{address}/health", timeout=2) as answer:
            return answer.status == 200

    with running(command, folder / "server.log", answers, "mlflow server", STARTUP_SECONDS):
        yield address
