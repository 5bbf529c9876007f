"""A real MLflow tracking server (the `mlflow` package's own `mlflow server`) on 127.0.0.1, with a SQLite backend
store and artifacts served by the server itself, for the tracking tests; with `auth`, MLflow's own basic-auth app
(`--app-name basic-auth`, mlflow[auth]: every request needs the admin's user and password). Ready when its
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
def mlflow_server(folder: Path, auth: tuple[str, str] | None = None) -> Iterator[str]:
    """The server's http:// address while the block runs; `auth`: (admin user, password) it requires."""
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination", str(folder / "artifacts"),
    ]  # fmt: skip
    address = f"http://127.0.0.1:{port}"
    env = {}
    if auth:
        # mlflow/server/auth/basic_auth.ini's settings, its user database in `folder` (not the working directory).
        config = folder / "basic_auth.ini"
        config.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{folder / 'basic_auth.db'}\n"
            f"admin_username = {auth[0]}\nadmin_password = {auth[1]}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
        env = {"MLFLOW_AUTH_CONFIG_PATH": str(config), "MLFLOW_FLASK_SERVER_SECRET_KEY": "tests-csrf-secret"}
        command += ["--app-name", "basic-auth"]

    def answers() -> bool:
        with urllib.request.urlopen(f"{address}/health", timeout=2) as answer:
            return answer.status == 200

    with running(command, folder / "server.log", answers, "mlflow server", STARTUP_SECONDS, env):
        yield address
