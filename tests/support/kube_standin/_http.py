"""HTTP/1.1 transport of the stand-in: JSON answers, chunked watch and log streams, as kube-apiserver writes them."""

from __future__ import annotations

import http.server
import json
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from ._common import ApiError
from ._types import RecordedRequest

if TYPE_CHECKING:
    from ._apiserver import ApiServer


class Handler(http.server.BaseHTTPRequestHandler):
    """HTTP/1.1 transport: JSON answers with Content-Length, watch and log streams chunked, as kube-apiserver."""

    protocol_version = "HTTP/1.1"  # keep-alive connections, as the client's urllib3 pool expects
    server_api: ApiServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the request log is kept in memory
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        api = self.server_api
        split = urlsplit(self.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        headers: Mapping[str, str] = {}
        try:
            status, payload, stream = api.dispatch(
                method, split.path, query, body, self.headers.get("Authorization", "")
            )
        except ApiError as error:
            status, payload, stream, headers = error.code, error.status, None, error.headers
        except Exception as error:  # a stand-in bug must surface as a 500, not as a hung client
            status, payload, stream = 500, ApiError(500, f"kube-standin: {error!r}").status, None
        with api.store.cond:
            api.requests.append(RecordedRequest(method, split.path, query, body, status))
            api.store.cond.notify_all()  # for KubeStandin.wait_for_request
        if stream is None:
            self._send_json(status, payload, headers)
            return
        try:
            stream(self)
        except (BrokenPipeError, ConnectionResetError):  # the client went away mid-stream
            self.close_connection = True

    def _send_json(self, status: int, payload: Any, headers: Mapping[str, str]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        if data:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def cut_connection(self) -> None:
        """Close mid-stream without the final chunk: the client sees a broken connection."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)
