"""A token server for the real registry's Bearer-token auth, speaking the Docker token protocol on 127.0.0.1
(distribution docs/spec/auth/token.md; the role Docker Hub's auth.docker.io, GHCR and Harbor play).

`GET /token?service=<service>&scope=repository:<name>:<actions>` with the user's Basic credentials answers
`{"token", "access_token", "expires_in", "issued_at"}`: a JWT signed RS256 by a key whose self-signed certificate
is the registry's `rootcertbundle` and rides in the token's `x5c` header, with the claims the registry verifies
(distribution registry/auth/token/token.go: iss, aud, exp and nbf within 60 s, `access`). As a real token server
does, it grants only the scopes asked for (a pull token cannot push: the registry answers 401
insufficient_scope), refuses wrong credentials with 401, and an anonymous request gets a token with no access.
"""

from __future__ import annotations

import base64
import datetime
import http.server
import json
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ISSUER = "kfp-finetune-tests-token-issuer"
SERVICE = "kfp-finetune-tests-registry"
EXPIRES_SECONDS = 300


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenServer:
    url: str  # the realm
    certificate: Path  # PEM, the registry's rootcertbundle
    user: str
    password: str
    requests: list[tuple[str, list[str]]] = field(default_factory=list)  # (user or "", scopes asked for)

    def registry_auth(self) -> dict:
        """The registry config's `auth` section that sends clients here."""
        return {
            "token": {
                "realm": self.url, "service": SERVICE, "issuer": ISSUER,
                "rootcertbundle": str(self.certificate),
            }
        }  # fmt: skip


def _signing_key(folder: Path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = folder / "token-signer.pem"
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return key, certificate.public_bytes(serialization.Encoding.DER), path


def _granted(scope: str) -> dict | None:
    """A scope as the token's access entry: `repository:<name>:<actions>`, and the catalog
    (`registry:catalog:*`), which the user may list as a registry's admin may."""
    parts = scope.split(":")
    if scope == "registry:catalog:*":
        return {"type": "registry", "name": "catalog", "actions": ["*"]}
    if len(parts) < 3 or parts[0] != "repository":
        return None
    actions = [a for a in parts[-1].split(",") if a in ("pull", "push", "delete")]
    return {"type": "repository", "name": ":".join(parts[1:-1]), "actions": actions}


@contextmanager
def token_server(folder: Path, user: str, password: str) -> Iterator[TokenServer]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    folder.mkdir(parents=True, exist_ok=True)
    key, certificate_der, certificate_path = _signing_key(folder)
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def sign(subject: str, access: list[dict]) -> str:
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(certificate_der).decode()]}
        now = int(time.time())
        claims = {
            "iss": ISSUER, "sub": subject, "aud": SERVICE, "exp": now + EXPIRES_SECONDS, "nbf": now - 1,
            "iat": now, "jti": uuid.uuid4().hex, "access": access,
        }  # fmt: skip
        signed = ".".join(_b64url(json.dumps(part).encode()) for part in (header, claims))
        signature = key.sign(signed.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signed}.{_b64url(signature)}"

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parsed.query)
            given = self.headers.get("Authorization")
            scopes = [s for value in query.get("scope", []) for s in value.split(" ") if s]
            server.requests.append((user if given == expected else "", scopes))
            if parsed.path != "/token" or query.get("service") != [SERVICE]:
                return self._answer(400, {"errors": [{"code": "UNSUPPORTED", "message": "unknown service"}]})
            if given is not None and given != expected:
                return self._answer(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]})
            access = [a for a in map(_granted, scopes) if a] if given else []
            token = sign(user if given else "", access)
            issued = datetime.datetime.now(datetime.timezone.utc).isoformat()
            return self._answer(
                200,
                {"token": token, "access_token": token, "expires_in": EXPIRES_SECONDS, "issued_at": issued},
            )

        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server = TokenServer(f"http://127.0.0.1:{httpd.server_port}/token", certificate_path, user, password)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
