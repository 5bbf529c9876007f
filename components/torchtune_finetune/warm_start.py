"""Warm starts: torch.compile's caches on a volume that outlives the pod, and the time from process start to step 1.

Inductor and Triton write their compiled kernels to the image's home folder by default (images/trainer), which
every new pod starts without: each node pod compiled from scratch. The training process points both caches at

    <model cache>/compile/<torch version>-<GPU model>/{inductor,triton}     the persistent model cache volume
    <workspace>/.cache/compile/<torch version>-<GPU model>/{inductor,triton} otherwise, for a workspace run folder

The first when the base model came through model-initialize's persistent cache (`model_cache_path`) and the node
pods mount that volume: KFP's workspace is one PVC per pipeline run, so only that volume carries the kernels to the
next run of a schedule. The launching step makes the choice (it knows the base model's cache entry and the node
pods' mounts) and hands it to the training process in COMPILE_CACHE_ENV; without it the workspace is used, which
still serves a retried or resumed pod and every node of a multi-node job reading the shared volume.

The folder is keyed by torch version and GPU model: kernels of another torch or another GPU are never looked at
(Inductor and Triton key their entries too; the split keeps the folder that a stack upgrade leaves behind easy to
remove). Both write their entries atomically (temp file, rename), so ranks, nodes and concurrent runs may fill one
folder together.

`startup.json` in the run folder records the seconds from the training process's start (the node pod's command:
the entrypoint's checks, then `tune run` in the same process) to the end of the first optimizer step, whether the
compile cache was warm and where it was; the fine-tune step reports it (`seconds_to_first_step`).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from kfp_finetune.components._shared.errors import ContractError
from kfp_finetune.components._shared.workspace import (
    COMPILE_CACHE_AREA,
    MODEL_CACHE_AREA,
    compile_cache_root,
)

STARTUP_FILE = "startup.json"
CACHE_VARIABLES = {"inductor": "TORCHINDUCTOR_CACHE_DIR", "triton": "TRITON_CACHE_DIR"}
#: The compile cache root the launching step chose on the persistent volume (`<model cache>/compile`); unset: the
#: workspace's.
COMPILE_CACHE_ENV = "KFP_FINETUNE_COMPILE_CACHE"
#: Where the caches are, as startup.json and the log say it.
PERSISTENT_VOLUME = "persistent volume"
WORKSPACE = "workspace"


@dataclass(frozen=True)
class CompileCache:
    #: "warm" (the folder held compiled kernels), "cold", or "off" (a run folder outside the workspace layout and
    #: no persistent volume: the image's caches are used)
    state: str
    place: str = ""  # PERSISTENT_VOLUME, WORKSPACE, or "" when off
    folder: Path | None = None


@dataclass(frozen=True)
class Startup:
    seconds_to_first_step: float
    #: CompileCache.state
    compile_cache: str
    compile_cache_place: str = ""  # CompileCache.place

    def line(self) -> str:
        if self.compile_cache == "off":
            cache = ""
        else:
            cache = f" (compile cache {self.compile_cache}, on the {self.compile_cache_place or WORKSPACE})"
        return f"process start to the end of step 1: {self.seconds_to_first_step:.0f}s{cache}"


def cache_key(torch_version: str, device_name: str) -> str:
    """A folder name for a torch version and GPU model, e.g. `torch-2.9.1+cu128-nvidia-h100-80gb-hbm3`."""
    device = re.sub(r"[^a-z0-9.+]+", "-", device_name.lower()).strip("-") or "cpu"
    version = re.sub(r"[^A-Za-z0-9.+]+", "-", torch_version).strip("-")
    return f"torch-{version}-{device}"


def model_cache_entry(base_model_metadata: dict) -> PurePosixPath | None:
    """The persistent model cache entry the base model came through (its metadata's `cache.entry`,
    `<model cache>/models/<name>`), else None. Raises ContractError for an entry of another shape: paths are
    derived from it, so it must be where model-initialize writes (absolute, inside a `models` folder)."""
    entry = ((base_model_metadata or {}).get("cache") or {}).get("entry") or ""
    if not entry:
        return None
    path = PurePosixPath(os.path.normpath(entry))
    if not path.is_absolute() or path.parent.name != MODEL_CACHE_AREA:
        raise ContractError(
            f"base_model's metadata names a model cache entry {entry!r} that is not `<model cache>/models/<name>`: "
            "connect the `model` output of a model-initialize step"
        )
    return path


def persistent_compile_root(base_model_metadata: dict) -> str:
    """`<model cache>/compile` when the base model came through model-initialize's persistent cache, else ""."""
    entry = model_cache_entry(base_model_metadata)
    return str(entry.parent.parent / COMPILE_CACHE_AREA) if entry else ""


def _given_root() -> Path | None:
    """The persistent root the launching step chose (COMPILE_CACHE_ENV), checked: an absolute path without `..`."""
    given = os.environ.get(COMPILE_CACHE_ENV, "")
    if not given:
        return None
    if not os.path.isabs(given) or ".." in PurePosixPath(given).parts:
        raise ValueError(f"{COMPILE_CACHE_ENV} must be an absolute path without '..' (got {given!r})")
    return Path(given)


def use_compile_cache(run_dir: str | os.PathLike, torch_version: str, device_name: str) -> CompileCache:
    """Points Inductor's and Triton's caches at this torch's and GPU's folder (before anything compiles): on the
    persistent volume when the launching step chose it (COMPILE_CACHE_ENV), else in the workspace; "off" outside
    the workspace layout without a persistent volume (the image's own cache folders stay in use). Warm when that
    folder already held compiled kernels."""
    root, place = _given_root(), PERSISTENT_VOLUME
    if root is None:
        root, place = compile_cache_root(run_dir), WORKSPACE
    if root is None:
        return CompileCache("off")
    folder = root / cache_key(torch_version, device_name)
    warm = any(p.is_file() for p in folder.rglob("*")) if folder.is_dir() else False
    for name, variable in CACHE_VARIABLES.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        os.environ[variable] = str(folder / name)
    return CompileCache("warm" if warm else "cold", place, folder)


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


def record_startup(run_dir: str | os.PathLike, started_at: float, compile_cache: CompileCache) -> Startup:
    startup = Startup(round(time.time() - started_at, 1), compile_cache.state, compile_cache.place)
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
