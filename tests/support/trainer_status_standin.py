"""A stand-in for Kubeflow Trainer's progress endpoint (KEP-2779, docs/proposals/2779-trainjob-progress in
kubeflow/trainer; the TrainJob CRD v2.3's `status.trainerStatus` schema): on 127.0.0.1 over HTTP.

    POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status
    Authorization: Bearer <the pod's projected token>      {"trainerStatus": {...}}

Not kinder than the real one: another method or path is 404/405, a missing or wrong token 401, a body that is not
the schema (unknown fields, wrong types, values out of range, metric values over 64 characters, no
lastUpdatedTime) 400. What it accepted is kept in `statuses`.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
_FIELDS = {"progressPercentage", "estimatedRemainingSeconds", "metrics", "lastUpdatedTime"}


def problems(body: object) -> list[str]:
    """Why `body` is not a status update the endpoint takes (empty: it is)."""
    if (
        not isinstance(body, dict)
        or set(body) != {"trainerStatus"}
        or not isinstance(body["trainerStatus"], dict)
    ):
        return ['the body must be {"trainerStatus": {...}}']
    status = body["trainerStatus"]
    found = [f"unknown field {name}" for name in set(status) - _FIELDS]
    if not isinstance(status.get("lastUpdatedTime"), str) or not _TIME.match(status["lastUpdatedTime"]):
        found.append("lastUpdatedTime is required when trainerStatus is present (RFC 3339)")
    percent = status.get("progressPercentage")
    if percent is not None and (type(percent) is not int or not 0 <= percent <= 100):
        found.append(f"progressPercentage must be an integer 0-100, got {percent!r}")
    remaining = status.get("estimatedRemainingSeconds")
    if remaining is not None and (type(remaining) is not int or not 0 <= remaining < 2**31):
        found.append(f"estimatedRemainingSeconds must be an int32 >= 0, got {remaining!r}")
    metrics = status.get("metrics", [])
    if not isinstance(metrics, list) or len(metrics) > 256:
        return [*found, "metrics must be a list of at most 256"]
    for metric in metrics:
        if not isinstance(metric, dict) or set(metric) != {"name", "value"}:
            found.append(f"a metric has exactly name and value: {metric!r}")
            continue
        for key in ("name", "value"):
            if not isinstance(metric[key], str) or not 1 <= len(metric[key]) <= 64:
                found.append(f"metric {key} must be a string of 1-64 characters: {metric[key]!r}")
    return found


class TrainerStatusStandin:
    def __init__(
        self, namespace: str = "team-a", name: str = "job-a", token: str = "projected-token"
    ) -> None:
        self.path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
        self.token = token
        self.statuses: list[dict] = []
        self.rejected: list[tuple[int, str]] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, code: int, text: str = "") -> None:
                if code >= 400:
                    standin.rejected.append((code, text))
                payload = json.dumps({"message": text}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                self._answer(405, "method not allowed")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != standin.path:
                    return self._answer(404, f"no such endpoint {self.path}")
                if self.headers.get("Authorization") != f"Bearer {standin.token}":
                    return self._answer(401, "the token is missing or not this TrainJob's pod's")
                try:
                    parsed = json.loads(body)
                except ValueError:
                    return self._answer(400, "not JSON")
                found = problems(parsed)
                if found:
                    return self._answer(400, "; ".join(found))
                standin.statuses.append(parsed["trainerStatus"])
                self._answer(200)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}{self.path}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> TrainerStatusStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
