"""Warm starts: torch.compile's caches on the workspace, and the time from process start to the first step.

Inductor and Triton write their compiled kernels to the image's home folder by default (images/trainer), which
every new pod starts without: each node pod compiled from scratch. For a run in the workspace layout
(`<workspace>/runs/<name>`) the training process points both caches at

    <workspace>/.cache/compile/<torch version>-<GPU model>/{inductor,triton}

so a retried or resumed pod, a later run on the same workspace volume, and every node of a multi-node job reading
the shared volume reuse what was compiled. The folder is keyed by torch version and GPU model: kernels of another
torch or another GPU are never looked at (Inductor and Triton key their entries too; the split keeps the folder
that a stack upgrade leaves behind easy to remove). Both write their entries atomically (temp file, rename), so
ranks and nodes may fill one folder together.

`startup.json` in the run folder records the seconds from the training process's start (the node pod's command:
the entrypoint's checks exec `tune run` in the same process) to the end of the first optimizer step, and whether
the compile cache was warm; the fine-tune step reports it (`seconds_to_first_step`).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kfp_finetune.components._shared.workspace import compile_cache_root

STARTUP_FILE = "startup.json"
CACHE_VARIABLES = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}


@dataclass(frozen=True)
class Startup:
    seconds_to_first_step: float
    #: "warm", "cold" or "off" (a run folder outside the workspace layout: the image's caches are used)
    compile_cache: str

    def line(self) -> str:
        cache = "" if self.compile_cache == "off" else f" (compile cache {self.compile_cache})"
        return f"process start to the end of step 1: {self.seconds_to_first_step:.0f}s{cache}"


def cache_key(torch_version: str, device_name: str) -> str:
    """A folder name for a torch version and GPU model, e.g. `torch-2.9.1+cu128-nvidia-h100-80gb-hbm3`."""
    device = re.sub(r"[^a-z0-9.+]+", "-", device_name.lower()).strip("-") or "cpu"
    return f"torch-{torch_version}-{device}"


def use_compile_cache(run_dir: str | os.PathLike, torch_version: str, device_name: str) -> str:
    """Points Inductor's and Triton's caches at the workspace's folder for this torch and GPU (before anything
    compiles). Returns "warm" when that folder already held compiled kernels, "cold" when not, "off" outside the
    workspace layout (the image's own cache folders stay in use)."""
    root = compile_cache_root(run_dir)
    if root is None:
        return "off"
    folder = root / cache_key(torch_version, device_name)
    warm = any(p.is_file() for p in folder.rglob("*")) if folder.is_dir() else False
    for name, variable in CACHE_VARIABLES.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(folder / name)
    return "warm" if warm else "cold"


def process_started_at() -> float:
    """This process's start (seconds since the epoch), from /proc: the node pod's command, before any import."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def record_startup(run_dir: str | os.PathLike, started_at: float, compile_cache: str) -> Startup:
    startup = Startup(round(time.time() - started_at, 1), compile_cache)
    path = Path(run_dir) / STARTUP_FILE
    tmp = path.with_name(f".{STARTUP_FILE}.tmp")
    tmp.write_text(json.dumps(asdict(startup)))
    tmp.replace(path)
    return startup


def read_startup(run_dir: str | os.PathLike) -> Startup | None:
    try:
        return Startup(**json.loads((Path(run_dir) / STARTUP_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None
