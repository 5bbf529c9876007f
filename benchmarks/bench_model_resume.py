"""8. Model initialize: bytes re-fetched after a kill at ~50 %, and a second scheduled run with the model cache.

Source: a synthetic model made here (config, tokenizer, `shards` safetensors shards of random bytes, ~256 MiB by
default) served by the hub stand-in (tests/support/hub_standin.py: huggingface_hub over HTTP, LFS files through
the CDN redirect). `initialize_model` runs in child processes, as a KFP step does.

- Resume: a child fetching hf://bench/model is SIGKILLed once its stable partial folder (`models/.m.partial`)
  holds half of the model's bytes; a second child runs the same step again. Bytes re-fetched = the sizes of the
  files the hub served to the second child. The old behaviour (a random temp folder, removed by the next
  attempt) re-fetched every file: the total.
- Cache: two runs in two fresh workspaces sharing one `cache_path` vs two runs without a cache. Bytes fetched =
  served by the hub to the second run; bytes copied = what the second run wrote into its workspace that is not a
  hard link to the cache entry.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, Settings, fresh_dir

NAME = "model_resume"
TITLE = "8. Model initialize: re-fetch after a kill at 50 %, second run with the model cache"

CHILD = """
import json, sys
from kfp_finetune.components.model_initialize.initialize import initialize_model
r = initialize_model(sys.argv[1], sys.argv[2], name="m", cache_path=sys.argv[3], max_workers=int(sys.argv[4]))
print(json.dumps({"cache": r.metadata.get("cache"), "path": str(r.path)}))
"""


def make_model(out: Path, shards: int, shard_mib: int) -> Path:
    import numpy as np
    from safetensors.numpy import save_file

    sys.path.insert(0, str(ROOT))
    from tests.support.sources import write_fake_model

    write_fake_model(out, extra_bin=False)
    (out / "model.safetensors").unlink()
    rng = np.random.default_rng(0)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        name = f"model.layers.{i}.mlp.weight"
        save_file({name: rng.integers(0, 256, shard_mib * 2**20, dtype=np.uint8)}, str(out / shard))
        weight_map[name] = shard
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return out


def _size(folder: Path) -> int:
    """Bytes in `folder` now (files the fetch moves or removes during the walk are skipped)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _served(hub, since: int, sizes: dict[str, int]) -> int:
    """Bytes of the model's files the hub served (GET 200 of /resolve/ or the LFS CDN) after request `since`."""
    served = 0
    for method, path, status in hub.requests[since:]:
        if method != "GET" or status != 200 or not ("/resolve/" in path or path.startswith("/cdn-lfs/")):
            continue
        served += next((size for rel, size in sizes.items() if path.split("?")[0].endswith("/" + rel)), 0)
    return served


def run(s: Settings, echo=print) -> dict:
    sys.path.insert(0, str(ROOT))
    from tests.support.hub_standin import HubStandin
    from tests.support.sources import hub_env

    shards = int(s.extra.get("resume_shards", 16))
    shard_mib = int(s.extra.get("resume_shard_mib", 8 if s.quick else 16))
    workers = int(s.extra.get("resume_workers", 4))
    base = fresh_dir(s.workdir / NAME)
    model = make_model(base / "src", shards, shard_mib)
    sizes = {p.relative_to(model).as_posix(): p.stat().st_size for p in model.rglob("*") if p.is_file()}
    for skipped in ("README.md", "original/consolidated.00.pth"):  # served, but not among the files fetched
        sizes.pop(skipped)
    total = sum(sizes.values())
    echo(f"  synthetic model: {len(sizes)} files, {total / 2**20:.0f} MiB; {workers} parallel transfers")

    with HubStandin() as hub:
        hub.add_repo("bench/model", model)
        env = hub_env(hub.endpoint, base)
        uri = "hf://bench/model"

        def child(workspace: Path, cache: str = "") -> subprocess.Popen:
            return subprocess.Popen(
                [sys.executable, "-c", CHILD, uri, str(workspace), cache, str(workers)],
                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip

        def finish(proc: subprocess.Popen) -> dict:
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"initialize_model failed:\n{err[-3000:]}")
            return json.loads(out.strip().splitlines()[-1])

        # --- resume after a kill at ~50 % -------------------------------------------------------------------
        workspace = base / "ws-resume"
        partial = workspace / "models" / ".m.partial"
        proc = child(workspace)
        held = 0
        while proc.poll() is None:  # a benchmark, not a test: polling is how it sees the half-way point
            held = _size(partial) if partial.is_dir() else 0
            if held >= total / 2:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.005)
        if proc.returncode != -signal.SIGKILL:
            raise RuntimeError("the first attempt ended before it held half the bytes: use larger shards")
        kept = sum(
            p.stat().st_size
            for p in partial.rglob("*")
            if p.is_file() and not p.relative_to(partial).as_posix().startswith(".kfp-")
        )
        since = len(hub.requests)
        start = time.perf_counter()
        finish(child(workspace))
        resume_seconds = time.perf_counter() - start
        refetched = _served(hub, since, sizes)
        echo(
            f"  killed at {100 * held / total:.0f} % held ({kept / 2**20:.0f} MiB in finished files); "
            f"the retry fetched {refetched / 2**20:.0f} MiB of {total / 2**20:.0f} MiB"
        )

        # --- a second scheduled run, with and without the cache ---------------------------------------------
        second = {}
        for label, cache in (("with_cache", str(base / "cache")), ("without_cache", "")):
            finish(child(base / f"ws-{label}-1", cache))
            since = len(hub.requests)
            ws2 = base / f"ws-{label}-2"
            facts = finish(child(ws2, cache))
            fetched = _served(hub, since, sizes)
            entry = ws2 / "models" / "m"
            copied = sum(
                p.stat().st_size for p in entry.rglob("*") if p.is_file() and p.stat().st_nlink == 1
            ) if entry.is_dir() else 0  # fmt: skip
            second[label] = {"bytes_fetched": fetched, "bytes_copied": copied, "cache": facts["cache"]}
            echo(f"  second run {label}: fetched {fetched} B, copied {copied} B")

    with_cache = second["with_cache"]
    return {
        "name": NAME,
        "title": TITLE,
        "target": (
            "the retry re-fetches only what the killed attempt had not finished (was: the total); a second run "
            "with the cache fetches and copies 0 B"
        ),
        "met": refetched <= total - kept and with_cache["bytes_fetched"] == with_cache["bytes_copied"] == 0,
        "headline": (
            f"after a kill at {100 * held / total:.0f} %: {100 * refetched / total:.0f} % re-fetched (was 100 %); "
            f"second run: {with_cache['bytes_fetched']} B fetched, {with_cache['bytes_copied']} B copied with the "
            f"cache vs {second['without_cache']['bytes_fetched'] / 2**20:.0f} MiB fetched and copied without"
        ),
        "results": {
            "total_bytes": total,
            "resume": {
                "held_at_kill_bytes": held,
                "kept_finished_files_bytes": kept,
                "refetched_bytes": refetched,
                "refetched_fraction": round(refetched / total, 4),
                "old_behaviour_refetched_bytes": total,
                "retry_seconds": round(resume_seconds, 2),
            },
            "second_run_with_cache": {k: v for k, v in with_cache.items() if k != "cache"},
            "second_run_without_cache": {k: v for k, v in second["without_cache"].items() if k != "cache"},
            "with_cache_metadata": with_cache["cache"],
        },
        "settings": {
            "source": f"hub stand-in, {len(sizes)} files, {total / 2**20:.0f} MiB",
            "shards": shards,
            "max_workers": workers,
        },
    }
