"""An HTTP proxy in front of a real server (moto's S3 server) that records every request and can answer the next
ones with a server error, as S3 does under load: 503 SlowDown with an S3 XML error body
(https://docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html). Tests count what a client really sent.

It can also damage what a client reads, as a faulty disk, NIC or middlebox does: `corrupt(key)` flips bytes of the
body of the next GET of an object (same length, headers untouched), `truncate(key)` answers it with the first half
only and a matching Content-Length (a stream that ends early yet looks complete), `drop(key)` sends the headers
and half the body of the next GET, then closes the connection (a connection lost mid-transfer), and
`corrupt_etag(key)` changes the ETag a HEAD of the object reports (a read-back that finds other bytes than were
written).

`barrier(count, method, query)` measures how many requests a client really has in flight at once, without
timing: every matching request is held until `count` are held together (then all go on and later ones pass),
and `peak` is the most that were held at once. A client that never sends `count` at once releases them after
`timeout` seconds and leaves `peak < count` for the test to see.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>"
)


class FaultProxy:
    """`with FaultProxy(upstream_url) as proxy:` point the client at `proxy.url`; `proxy.requests` lists
    (method, path, status) in order; `fail_next(n)` answers the next n requests (of `method`, when given) 503
    SlowDown."""

    def __init__(self, upstream: str) -> None:
        parsed = urllib.parse.urlparse(upstream)
        self._upstream = (parsed.hostname, parsed.port)
        self.requests: list[tuple[str, str, int]] = []
        self._failures = 0
        self._failing_method: str | None = None
        self._damage: dict[tuple[str, str], int] = {}  # (mode, key) -> how many more responses to damage
        self._lock = threading.Lock()
        self._barrier: dict | None = None
        self._held = threading.Condition()
        self.peak = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, count: int, method: str | None = None) -> None:
        with self._lock:
            self._failures, self._failing_method = count, method

    def corrupt(self, key: str, times: int = 1) -> None:
        """The next `times` GETs of object `key` (bucket/key) get a body of the same length with flipped bytes."""
        self._arm("corrupt", key, times)

    def truncate(self, key: str, times: int = 1) -> None:
        """The next `times` GETs of `key` get the first half of the body, with a Content-Length that matches it."""
        self._arm("truncate", key, times)

    def drop(self, key: str, times: int = 1) -> None:
        """The next `times` GETs of `key` send the whole Content-Length, half the body, then close the connection."""
        self._arm("drop", key, times)

    def corrupt_etag(self, key: str, times: int = 1) -> None:
        """The next `times` HEADs of `key` report an ETag of the same length with other digits."""
        self._arm("etag", key, times)

    def barrier(self, count: int, method: str, query: str = "", timeout: float = 30.0) -> None:
        """Hold `method` requests for an object (and whose query has `query`, e.g. "partNumber=") until `count`
        are held at once; `peak` reports the most held together."""
        with self._held:
            self._barrier = {
                "count": count,
                "method": method,
                "query": query,
                "timeout": timeout,
                "open": False,
            }
            self._barrier["held"] = self.peak = 0

    def _hold(self, method: str, path: str) -> None:
        parsed = urllib.parse.urlparse(path)
        with self._held:
            gate = self._barrier
            if (
                gate is None
                or gate["open"]
                or method != gate["method"]
                or gate["query"] not in parsed.query
                or parsed.path.strip("/").count("/") < 1  # the bucket itself (a listing), not an object
            ):
                return
            gate["held"] += 1
            self.peak = max(self.peak, gate["held"])
            if gate["held"] >= gate["count"]:
                gate["open"] = True
                self._held.notify_all()
            elif not self._held.wait_for(lambda: gate["open"], timeout=gate["timeout"]):
                gate["open"] = True  # never reached: let everything through, `peak` tells the test
                self._held.notify_all()
            gate["held"] -= 1

    def _arm(self, mode: str, key: str, times: int) -> None:
        with self._lock:
            self._damage[(mode, "/" + key.lstrip("/"))] = times

    def _take_damage(self, mode: str, path: str) -> bool:
        key = (mode, urllib.parse.unquote(urllib.parse.urlparse(path).path))
        with self._lock:
            if self._damage.get(key):
                self._damage[key] -= 1
                return True
            return False

    def _take_failure(self, method: str) -> bool:
        with self._lock:
            if self._failures and self._failing_method in (None, method):
                self._failures -= 1
                return True
            return False

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def __enter__(self) -> FaultProxy:
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            proxy._hold(self.command, self.path)
            if proxy._take_failure(self.command):
                self._reply(503, {"Content-Type": "application/xml"}, _SLOW_DOWN)
                return
            upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            upstream.close()
            if (
                response.status in (200, 206)
                and self.command == "GET"
                and proxy._take_damage("drop", self.path)
            ):
                self._reply(response.status, kept, data[: len(data) // 2])
                self.close_connection = True
                return
            if response.status in (200, 206):
                kept, data = _damaged(proxy, self.command, self.path, kept, data)
            self._reply(response.status, kept, data)

        def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
            proxy._record(self.command, self.path, status)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if not any(key.lower() == "content-length" for key in headers):
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    return Handler


def flip(data: bytes) -> bytes:
    """Same length, different bytes: every 97th byte inverted (at least the middle one)."""
    damaged = bytearray(data)
    for i in {*range(0, len(data), 97), len(data) // 2} if data else ():
        damaged[i] ^= 0xFF
    return bytes(damaged)


def _damaged(proxy: FaultProxy, method: str, path: str, headers: dict, data: bytes) -> tuple[dict, bytes]:
    if method == "GET" and proxy._take_damage("corrupt", path):
        return headers, flip(data)
    if method == "GET" and proxy._take_damage("truncate", path):
        data = data[: len(data) // 2]
        headers = {k: v for k, v in headers.items() if k.lower() != "content-length"}
        return {**headers, "Content-Length": str(len(data))}, data
    if method == "HEAD" and proxy._take_damage("etag", path):
        return {k: (_other_hex(v) if k.lower() == "etag" else v) for k, v in headers.items()}, data
    return headers, data


def _other_hex(etag: str) -> str:
    return "".join("0123456789abcdef"[(int(c, 16) + 1) % 16] if c in "0123456789abcdef" else c for c in etag)
