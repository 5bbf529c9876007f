"""Test sources for the initializer tests: a fake HF-layout model (no torch: numpy weights), the environment
and child process for talking to the hub stand-in, and moto's S3 server.

`huggingface_hub` and `datasets` read HF_ENDPOINT / HF_HUB_OFFLINE once, at import. The test session is
offline and may already have imported them, so code that must talk to the hub stand-in runs in a fresh Python
process with the stand-in's environment (`hub_env` + `run_python`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import ssl
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

ROOT = Path(__file__).resolve().parents[2]


def write_fake_model(
    out_dir: Path, family: str = "llama", *, shards: int = 1, extra_bin: bool = True, seed: int = 0
) -> Path:
    """A small HF-layout model folder: config.json, safetensors (optionally sharded + index), tokenizer files,
    and (extra_bin) PyTorch/TF weights that model-initialize must skip."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {
        f"model.layers.{i}.mlp.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(4)
    }
    model_type = {"llama": "llama", "qwen": "qwen2"}[family]
    (out_dir / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    (out_dir / "generation_config.json").write_text("{}")
    if shards == 1:
        save_file(tensors, str(out_dir / "model.safetensors"))
    else:
        names = sorted(tensors)
        weight_map = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: tensors[k] for k in names[i::shards]}
            save_file(part, str(out_dir / shard))
            weight_map.update(dict.fromkeys(part, shard))
        (out_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    if family == "llama":
        (out_dir / "original").mkdir(exist_ok=True)
        (out_dir / "original" / "tokenizer.model").write_text("IQ== 0\nIg== 1\n")
        (out_dir / "original" / "consolidated.00.pth").write_bytes(b"\0" * 2048)
        (out_dir / "tokenizer.json").write_text(json.dumps({"added_tokens": []}))
    else:
        (out_dir / "vocab.json").write_text(json.dumps({"a": 0, "b": 1}))
        (out_dir / "merges.txt").write_text("#version: 0.2\na b\n")
    if extra_bin:
        (out_dir / "pytorch_model.bin").write_bytes(b"\1" * 4096)
        (out_dir / "tf_model.h5").write_bytes(b"\2" * 1024)
    (out_dir / "README.md").write_text("# tiny\n")
    return out_dir


def hub_env(endpoint: str, tmp_path: Path, token: str | None = None) -> dict[str, str]:
    """Environment for a process that talks to the hub stand-in: online, isolated caches, fast retries. Xet is
    left to our code to switch off, as in production (storage/hf.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "AWS_"))}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HUB_OFFLINE="0",
        HF_DATASETS_OFFLINE="0",
        HF_HOME=str(tmp_path / "hf_home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        KFP_FINETUNE_RETRY_DELAY="0.1",
        KFP_FINETUNE_PROGRESS_INTERVAL="0.2",
        PYTHONPATH=str(ROOT),
    )
    if token:
        env["HF_TOKEN"] = token
    return env


def run_python(
    code: str, env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run `code` (with `args` in sys.argv[1:]) in a fresh interpreter; the last stdout line is expected to be
    JSON (see `result`)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"child failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1; yields its endpoint URL. Callers set AWS_* credentials themselves."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def use_s3_credentials(monkeypatch) -> None:
    """Dummy credentials and no ambient endpoint/profile, so only what a test passes is used."""
    for key in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "S3_ENDPOINT_URL",
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


@contextlib.contextmanager
def https_server(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A local HTTPS server serving `folder` with a self-signed certificate, trusted through SSL_CERT_FILE as a
    custom CA bundle would be; yields its `url` and the request paths it received (`requests`, query included)."""
    if not shutil.which("openssl"):
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    requests: list[str] = []

    class Recording(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Recording, directory=str(folder)))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield SimpleNamespace(url=f"https://127.0.0.1:{server.server_address[1]}", requests=requests)
    finally:
        server.shutdown()


def upload_multipart(client, folder: Path, bucket: str, prefix: str) -> None:
    """Upload every file of `folder` under `prefix` as a multipart upload (one part: any size may be the last),
    as tools do above their threshold: the ETag is `<md5 of the part MD5s>-1`, no MD5 of the content, and no
    checksum is sent, so the store states none."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(folder).as_posix()}"
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        part = client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=1, Body=path.read_bytes()
        )
        client.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
        )


def damage_in_place(path: Path) -> None:
    """Flip bytes in the middle, keep the size, set the mtime back: what bit rot or a careless in-place edit
    through a hard link leaves (root writes through mode 0444)."""
    stat = path.stat()
    with open(path, "r+b") as f:
        f.seek(stat.st_size // 2)
        byte = f.read(1)
        f.seek(stat.st_size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
