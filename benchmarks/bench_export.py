"""8. Export after training: wall time and hash passes of a 1 GiB synthetic safetensors model.

The model (4 safetensors shards of 256 MiB plus config/tokenizer files, made by code in `.bench/`) is put in a
LoRA-less run folder (`runs/r1/epoch_0`) and finalised as torchtune-finetune does (`finalize_checkpoint`: one
parallel hash of every final file, recorded in the model metadata). Then, each side timed separately:

- local: our `export_model` to a local folder vs `cp -r merged/ <dest>`;
- s3 (moto's S3 server, in this process, on 127.0.0.1): our `export_model` (64-connection pool, 64 MiB parts)
  vs an `aws s3 cp --recursive`-style baseline: boto3 `upload_file` per file, serially, with boto3's default
  client and TransferConfig (8 MiB parts, 10 concurrent requests, 10 pooled connections);
- "before" (S3 and local): the same export with the previous behaviour put back by settings: no recorded
  hashes in the metadata (export hashes every file again) and, for S3, botocore's / s3transfer's defaults
  (10 connections, 8 MiB parts, 10 per file, 8 files at once). The older code also hashed once more in
  publish and (local) once more in the read-back; those passes are gone from the code and not re-created here.

Hash passes = bytes the one hashing helper read ÷ model bytes (finalisation counted separately). `--set
export_mib=N` changes the model size (default 1024; --quick 256).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from benchmarks.common import Settings, Timer, fresh_dir, median, spread

NAME = "export"
TITLE = "8. Export wall time and hash passes (1 GiB synthetic model)"
SHARDS = 4


def _model(root: Path, mib: int) -> int:
    """A run folder's last epoch holding a sharded safetensors model of `mib` MiB; returns its size in bytes."""
    epoch = root / "runs" / "r1" / "epoch_0"
    marker = root / f".model-{mib}-complete"
    if not marker.exists():
        fresh_dir(root)
        epoch.mkdir(parents=True)
        block = bytes(range(256)) * 4096  # 1 MiB; the content does not matter to hashing or transfer
        shard_mib = mib // SHARDS
        weight_map = {}
        for i in range(SHARDS):
            name = f"model-{i + 1:05d}-of-{SHARDS:05d}.safetensors"
            nbytes = shard_mib << 20
            header = json.dumps({f"w{i}": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}})
            header = header.encode() + b" " * (-len(header) % 8)
            with open(epoch / name, "wb") as f:
                f.write(len(header).to_bytes(8, "little") + header)
                for _ in range(shard_mib):
                    f.write(block)
            weight_map[f"w{i}"] = name
        index = {"metadata": {"total_size": SHARDS * (shard_mib << 20)}, "weight_map": weight_map}
        (epoch / "model.safetensors.index.json").write_text(json.dumps(index))
        (epoch / "config.json").write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16"}))
        (epoch / "tokenizer.json").write_text(
            json.dumps({"model": {"vocab": {str(i): i for i in range(5000)}}})
        )
        marker.touch()
    return sum(p.stat().st_size for p in epoch.iterdir())


def _export(workspace: Path, metadata: dict, destination: str, **kwargs) -> tuple[float, int]:
    from kfp_finetune.components._shared.storage import checksums
    from kfp_finetune.components.export.export import export_model

    checksums.hashed.clear()
    with Timer() as t:
        export_model(workspace=workspace, model_metadata=metadata, destination=destination, **kwargs)
    return t.seconds, sum(checksums.hashed.values())


def _old_s3_settings(monkeypatch: dict) -> None:
    from kfp_finetune.components._shared.storage import s3

    for name, value in monkeypatch.items():
        setattr(s3, name, value)


def _baseline_s3(src: Path, endpoint: str, bucket: str, prefix: str) -> float:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)  # botocore's defaults: 10 connections
    with Timer() as t:
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            client.upload_file(
                str(path), bucket, f"{prefix}/{path.relative_to(src)}"
            )  # default TransferConfig
    return t.seconds


def _clear(endpoint: str, bucket: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            client.delete_object(Bucket=bucket, Key=obj["Key"])


def run(s: Settings, echo=print) -> dict:
    import logging
    import os

    import boto3

    from kfp_finetune.components._shared.storage import checksums, s3
    from kfp_finetune.components.torchtune_finetune.outputs import finalize_checkpoint
    from tests.support.sources import moto_s3

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's server: one line per request
    mib = int(s.extra.get("export_mib", 256 if s.quick else 1024))
    base = s.workdir / NAME
    workspace = base / "ws"
    size = _model(workspace, mib)
    run_dir = workspace / "runs" / "r1"
    shutil.rmtree(run_dir / "merged", ignore_errors=True)
    checksums.hashed.clear()
    with Timer() as fin:
        checkpoint = finalize_checkpoint(run_dir, method="full", base_model="org/synthetic")
    finalize_passes = sum(checksums.hashed.values()) / size
    metadata = {"merged_path": "runs/r1/merged", "run_dir": "runs/r1", "base_model": "org/synthetic",
                "method": "full", "files": json.loads(json.dumps(checkpoint.files))}  # fmt: skip
    before_metadata = {k: v for k, v in metadata.items() if k != "files"}
    echo(f"  model {size / 2**20:.0f} MiB; finalize {fin.seconds:.2f}s, {finalize_passes:.2f} hash passes")

    times: dict[str, list[float]] = {}
    passes: dict[str, float] = {}
    old = {"POOL_CONNECTIONS": 10, "PART_SIZE": 8 << 20, "FILE_WORKERS": 1}
    new = {name: getattr(s3, name) for name in old}
    env = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    try:
        with moto_s3() as endpoint:
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
            for i in range(s.repeats):
                order = ["ours", "cp", "before"] if i % 2 == 0 else ["before", "cp", "ours"]
                for side in order:
                    dest = fresh_dir(base / "dest") / "model"
                    if side == "cp":
                        with Timer() as t:
                            subprocess.run(["cp", "-r", str(run_dir / "merged"), str(dest)], check=True)
                        seconds, hashed = t.seconds, 0
                    else:
                        meta = metadata if side == "ours" else before_metadata
                        seconds, hashed = _export(workspace, meta, str(dest))
                    times.setdefault(f"local_{side}_seconds", []).append(seconds)
                    passes[f"local_{side}_hash_passes"] = round(hashed / size, 3)
                    echo(f"  local {side}: {seconds:.2f}s, {hashed / size:.2f} hash passes")
                for side in order:
                    _clear(endpoint, "bench")
                    if side == "cp":
                        seconds, hashed = _baseline_s3(run_dir / "merged", endpoint, "bench", "m"), 0
                    else:
                        _old_s3_settings(new if side == "ours" else old)
                        meta = metadata if side == "ours" else before_metadata
                        try:
                            seconds, hashed = _export(
                                workspace, meta, "s3://bench/m", s3_endpoint_url=endpoint
                            )
                        finally:
                            _old_s3_settings(new)
                    name = {"cp": "aws_s3_cp_style"}.get(side, side)
                    times.setdefault(f"s3_{name}_seconds", []).append(seconds)
                    passes[f"s3_{name}_hash_passes"] = round(hashed / size, 3)
                    echo(f"  s3 {name}: {seconds:.2f}s, {hashed / size:.2f} hash passes")
    finally:
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(base / "dest", ignore_errors=True)
    m = {k: median(v) for k, v in times.items()}
    after = passes["s3_ours_hash_passes"] + finalize_passes
    return {
        "name": NAME,
        "title": TITLE,
        "target": "each byte hashed once after training; S3 export not slower than the aws-s3-cp-style baseline",
        "met": after <= 1.01 and m["s3_ours_seconds"] <= m["s3_aws_s3_cp_style_seconds"],
        "headline": (
            f"hash passes after training {after:.2f} (finalize {finalize_passes:.2f} + export "
            f"{passes['s3_ours_hash_passes']:.2f}); S3 {m['s3_ours_seconds']:.1f}s vs aws-s3-cp-style "
            f"{m['s3_aws_s3_cp_style_seconds']:.1f}s vs before {m['s3_before_seconds']:.1f}s; local "
            f"{m['local_ours_seconds']:.2f}s vs cp -r {m['local_cp_seconds']:.2f}s vs before "
            f"{m['local_before_seconds']:.2f}s"
        ),
        "results": {
            "model_mib": round(size / 2**20, 1),
            "finalize_seconds": round(fin.seconds, 3),
            "finalize_hash_passes": round(finalize_passes, 3),
            **passes,
            **{k: spread(v) for k, v in sorted(times.items())},
        },
        "settings": {
            "shards": SHARDS,
            "repeats": s.repeats,
            "s3": "moto server in-process, 127.0.0.1",
            "old_s3_settings": old,
            "new_s3_settings": new,
        },  # fmt: skip
    }
