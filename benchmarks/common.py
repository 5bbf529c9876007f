"""Shared pieces of the benchmarks: timing, statistics, machine facts, fixtures (models and data), runs."""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


@dataclass
class Settings:
    """Knobs shared by every benchmark; each benchmark documents what it does with them."""

    workdir: Path
    repeats: int = 3
    quick: bool = False
    # Measurement-specific sizes (the whole suite runs in ~10-15 minutes on 2 quiet cores).
    dataset_rows: int = 1_000_000
    train_steps: int = 12
    big_dim: int = 512
    big_layers: int = 8
    big_heads: int = 8
    big_kv_heads: int = 4
    seq_len: int = 256
    batch_size: int = 4
    extra: dict[str, Any] = field(default_factory=dict)

    def scaled(self) -> Settings:
        """--quick: the same measurements at sizes that finish in a few minutes (numbers are noisier)."""
        if not self.quick:
            return self
        return Settings(
            workdir=self.workdir, repeats=max(1, min(self.repeats, 2)), quick=True, dataset_rows=100_000,
            train_steps=6, big_dim=256, big_layers=4, big_heads=4, big_kv_heads=2, seq_len=128, batch_size=4,
            extra=self.extra,
        )  # fmt: skip


# --- statistics ----------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and the runs themselves (rounded for the report)."""
    values = [float(v) for v in values]
    return {
        "median": round(median(values), 4),
        "min": round(min(values), 4) if values else float("nan"),
        "max": round(max(values), 4) if values else float("nan"),
        "runs": [round(v, 4) for v in values],
    }


def steady(values: Sequence[float], skip: int = 1) -> list[float]:
    """Per-step values without the first `skip` (warm-up: allocator, first backward, lazy init)."""
    values = list(values)
    return values[skip:] if len(values) > skip else values


class Timer:
    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


# --- machine and versions ------------------------------------------------------------------------------------


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def wait_for_quiet(max_load: float, timeout: float, poll: float = 15.0, echo: Callable = print) -> float:
    """Wait until the 1-minute load average is below `max_load` (or `timeout` passes); returns the load."""
    deadline = time.monotonic() + timeout
    load = load_average()[0]
    while load >= max_load and time.monotonic() < deadline:
        echo(f"load average {load:.2f} >= {max_load}: waiting")
        time.sleep(poll)
        load = load_average()[0]
    return load


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions() -> dict[str, str]:
    from importlib import metadata

    found = {"python": platform.python_version()}
    for name in (
        "torch", "torchtune", "torchao", "torchdata", "kfp", "datasets", "pyarrow", "transformers", "peft",
        "trl", "accelerate", "kfp-finetune",
    ):  # fmt: skip
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def machine() -> dict[str, Any]:
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "platform": platform.platform(),
    }


# --- fixtures ------------------------------------------------------------------------------------------------


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def tiny_model(workdir: Path, dim: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> Path:
    """A tiny-kit Llama-3.2-style model (built once per size; the kit is deterministic)."""
    from kfp_finetune.tiny.model import build_tiny_model

    out = workdir / "models" / f"llama3_2-d{dim}-l{layers}-h{heads}-kv{kv_heads}"
    if not (out / "model.safetensors").is_file():
        build_tiny_model(
            out, "llama3_2", dim=dim, seed=0, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads
        )
    return out


def count_parameters(model_dir: Path) -> int:
    """Unique parameters of the model in `model_dir` (tied embedding/output counted once)."""
    from safetensors import safe_open

    total = 0
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        for key in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            total += math.prod(f.get_slice(key).get_shape())
    return total


def tiny_task_data(workdir: Path, rows: int = 4000) -> Path:
    """The tiny kit's upper-casing task as JSON Lines (short rows, ~20 tokens each)."""
    from kfp_finetune.tiny.dataset import build_tiny_dataset

    out = workdir / "data" / f"tiny-{rows}"
    if not (out / "train.jsonl").is_file():
        build_tiny_dataset(out, seed=0, train_rows=rows, eval_rows=20)
    return out / "train.jsonl"


def long_tailed_rows(
    rows: int, seed: int = 0, median_words: float = 24.0, sigma: float = 1.0, cap: int = 600
):
    """Instruct rows whose answer lengths are log-normal (long-tailed): most short, a few very long.

    Words are random lower-case letter pairs, each one to two tokens of the tiny tokenizer.
    """
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    for _ in range(rows):
        n_in = rng.randint(4, 12)
        n_out = min(cap, max(1, int(rng.lognormvariate(math.log(median_words), sigma))))
        words = [rng.choice(letters) + rng.choice(letters) for _ in range(n_in + n_out)]
        yield {"input": "Echo: " + " ".join(words[:n_in]), "output": " ".join(words[n_in:])}


def long_tailed_data(workdir: Path, rows: int = 2000, seed: int = 0) -> Path:
    out = workdir / "data" / f"long-tailed-{rows}-s{seed}.jsonl"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with tmp.open("w") as f:
            for row in long_tailed_rows(rows, seed):
                f.write(json.dumps(row) + "\n")
        tmp.replace(out)
    return out


# --- torchtune runs ------------------------------------------------------------------------------------------


def resolve(model_dir: Path, data: Path, run_dir: Path, **settings: Any):
    """A resolved single-device CPU run (the component's engine) with fixed seed and no compile."""
    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig, from_flat
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    values = {"device": "cpu", "dtype": "fp32", "seed": 0, "compile": False, "log_every_n_steps": 1}
    values.update(settings)
    cfg: TorchtuneConfig = from_flat(values)
    return resolve_run(cfg, model_dir, data, run_dir)


def tune_run(yaml_path: Path, recipe: str, log_path: Path, cwd: Path | None = None) -> float:
    """Plain `tune run <recipe> --config <yaml>` as a user would type it; output to `log_path`; wall seconds."""
    tune = str(Path(PY).parent / "tune")
    with log_path.open("w") as log, Timer() as t:
        subprocess.run(
            [tune, "run", recipe, "--config", str(yaml_path)],
            stdout=log, stderr=subprocess.STDOUT, cwd=cwd, check=True, env=bench_env(),
        )  # fmt: skip
    return t.seconds


def bench_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("PYTHONPATH", str(ROOT))
    env.update(extra)
    return env


def step_tokens_per_second(metrics_file: Path) -> list[float]:
    """torchtune's per-step `tokens_per_second_per_gpu` (trained, i.e. unmasked, tokens) from a metrics file."""
    from kfp_finetune.components._shared.metrics_file import read_metrics_file

    return [s.tokens_per_second for s in read_metrics_file(metrics_file) if s.tokens_per_second is not None]


def copy_yaml_to(yaml_path: Path, old_run_dir: Path, new_run_dir: Path) -> Path:
    """The same resolved YAML with its output paths moved to `new_run_dir` (nothing else changes)."""
    fresh_dir(new_run_dir)
    text = yaml_path.read_text().replace(str(old_run_dir), str(new_run_dir))
    target = new_run_dir / yaml_path.name
    target.write_text(text)
    return target


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def torchtune_run(model_dir: Path, data: Path, run_dir: Path, **settings: Any) -> dict:
    """Resolve (the component's engine) and run plain `tune run` once; wall and per-step trained tokens/s."""
    fresh_dir(run_dir)
    resolved = resolve(model_dir, data, run_dir, **settings)
    wall = tune_run(resolved.yaml_path, resolved.recipe, run_dir.parent / f"{run_dir.name}.log", cwd=run_dir)
    per_step = step_tokens_per_second(resolved.metrics_path)
    return {
        "wall_seconds": wall,
        "step_tokens_per_second": per_step,
        "tokens_per_second": median(steady(per_step)),
        "config": resolved.config,
        "yaml_path": resolved.yaml_path,
        "recipe": resolved.recipe,
    }
