"""How the GPU reference suite runs one side of one job, and keeps what it measured.

A run is `tune run` on a resolved YAML, in its own process group, stopped (SIGKILL to the group) as soon as it has
logged its measured steps: torchtune's epoch-end checkpoint (≈ 16 GB merged for an 8B model) is never written, and
the run folder is deleted afterwards, so a 64 GiB disk holds the whole suite. A run that passes its time limit is
stopped the same way and recorded as timed out with the steps it logged. Results go to results.json after every
run; a second invocation skips the runs already recorded (--fresh starts over), so an interrupted suite goes on
where it stopped. GPU facts come from a child process (nvidia-smi): the suite's own process never holds a CUDA
context on GPU 0 while the runs train (it imports torch to tokenize, but calls nothing of torch.cuda; the random
weights are written by a child process). `schedule` runs one-GPU runs side by side, one per GPU
(CUDA_VISIBLE_DEVICES), each followed by a thread of this process; results are recorded one at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import bench_env, median

TUNE = [sys.executable, "-m", "torchtune._cli.tune"]  # no console script on a bare machine's --target install
LOG_TAIL_LINES = 25


def gpus_present() -> tuple[int, float, str]:
    """(GPUs, memory of the first in GiB, its name) from nvidia-smi in a child process; (0, 80.0, "") without."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return 0, 80.0, ""
    rows = [line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line]
    if not rows:
        return 0, 80.0, ""
    name, mib = rows[0]
    return len(rows), float(mib) / 1024, name.strip()


class ResultsStore:
    """results.json: one entry per job and side, written (atomically) after every run; runs that end together
    (parallel one-GPU runs, each followed by a thread of this process) record one at a time."""

    def __init__(self, path: Path, fresh: bool = False):
        self.path = path
        self._lock = threading.Lock()
        self.data: dict = {"runs": {}}
        if path.is_file() and not fresh:
            self.data = json.loads(path.read_text())
            self.data.setdefault("runs", {})

    def done(self, job: str, side: str) -> dict | None:
        """The recorded result of a run that finished (ok or a failure that would repeat), else None."""
        result = self.data["runs"].get(job, {}).get(side)
        return result if result and result.get("status") != "not run" else None

    def record(self, job: str, side: str, result: dict) -> None:
        with self._lock:
            self.data["runs"].setdefault(job, {})[side] = result
            self._write()

    def save(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)


def tune_run(
    resolved, gpus: int, steps: int | None, timeout: float, log_path: Path, env: dict | None = None
) -> dict:
    """`tune run` on `resolved` (torchrun flags for several GPUs): run_until_steps."""
    torchrun = ["--nproc_per_node", str(gpus)] if resolved.distributed else []
    command = [*TUNE, "run", *torchrun, resolved.recipe, "--config", str(resolved.yaml_path)]
    return run_until_steps(command, resolved.run_dir, steps, timeout, log_path, env)


def run_until_steps(
    command: list[str], cwd: Path, steps: int | None, timeout: float, log_path: Path, env: dict | None = None
) -> dict:
    """Runs `command` (the benchmark environment plus `env`) until it has logged `steps` steps (then its process group is killed; None: until it exits),
    exits, or passes `timeout` s. Returns status ("ok", "timeout", "exit N" or "ended early": it ended before
    `steps` steps) and the seconds from process start to the first and to the last logged step."""
    from kfp_finetune.components._shared.metrics_file import parse_metric_line

    started = time.monotonic()
    seen: list[float] = []  # seconds from start to each step's first logged line
    steps_seen: set[int] = set()
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    status = None
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env={**bench_env(), **(env or {})},
            start_new_session=True,
        )  # fmt: skip
        # The reader blocks on the pipe: a run that hangs without output is killed at its deadline by a timer.
        watchdog = _Watchdog(process.pid, started + timeout)
        for line in process.stdout:
            log.write(line)
            tail.append(line.rstrip())
            metric = parse_metric_line(line)
            if metric is not None and metric.step not in steps_seen:
                steps_seen.add(metric.step)
                seen.append(time.monotonic() - started)
            if steps is not None and len(seen) >= steps:
                status = "ok"
                break
        watchdog.cancel()
        _kill_group(process.pid)
        process.wait()
    if status is None:
        ended = (
            ("ended early" if steps else "ok") if process.returncode == 0 else f"exit {process.returncode}"
        )
        status = "timeout" if watchdog.fired else ended
    return {
        "status": status,
        "first_step_seconds": seen[0] if seen else None,
        "last_step_seconds": seen[-1] if seen else None,
        "log_tail": None if status == "ok" else list(tail),
    }


def schedule(
    units: list, slots: int, execute: Callable[[object, str], dict], record: Callable[[object, dict], None]
) -> None:
    """Runs every unit (`.gpus`: the GPUs it needs) as `execute(unit, visible_devices)` and hands each result to
    `record` as soon as it is there. Units of one GPU go `slots` at a time, in their order, each on a GPU of its
    own (`visible_devices` "0", "1", ...: its CUDA_VISIBLE_DEVICES); the others after them, one at a time, on all
    `slots` GPUs. `execute` runs in a thread of this process (the training is its subprocess); `record` is called
    one at a time."""
    free: queue.SimpleQueue[str] = queue.SimpleQueue()
    for gpu in range(slots):
        free.put(str(gpu))
    recording = threading.Lock()

    def one_gpu(unit) -> None:
        gpu = free.get()
        try:
            result = execute(unit, gpu)
        finally:
            free.put(gpu)
        with recording:
            record(unit, result)

    with ThreadPoolExecutor(max_workers=slots) as pool:
        for future in [pool.submit(one_gpu, unit) for unit in units if unit.gpus == 1]:
            future.result()
    every_gpu = ",".join(str(gpu) for gpu in range(slots))
    for unit in (unit for unit in units if unit.gpus > 1):
        record(unit, execute(unit, every_gpu))


class _Watchdog:
    """Kills a process group at a deadline from a timer thread (the reader blocks on the pipe)."""

    def __init__(self, pid: int, deadline: float):
        import threading

        self.fired = False
        self._timer = None
        if deadline != float("inf"):
            self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire, args=(pid,))
            self._timer.daemon = True
            self._timer.start()

    def _fire(self, pid: int) -> None:
        self.fired = True
        _kill_group(pid)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def measured(resolved, steps: int | None, device: dict, world_size: int, lengths=None) -> dict:
    """Trained tokens/s (torchtune's, median after two warm-up steps), processed tokens/s and MFU (throughput.py;
    attention over `lengths`' rows, else the run's own token lengths) and peak memory, from the first `steps`
    logged steps of the run's metrics file."""
    from kfp_finetune.components._shared.metrics_file import read_metrics_file
    from kfp_finetune.components.torchtune_finetune.throughput import measure

    logged = read_metrics_file(resolved.metrics_path)[:steps]
    warm = logged[2:] or logged  # compile and warm-up steps left out
    lengths = lengths or resolved.token_lengths
    speed = measure(
        resolved.config, resolved.model.hf_config, resolved.model.num_parameters, warm, device,
        world_size=world_size, token_lengths=lengths.lengths if lengths else None,
    )  # fmt: skip
    peaks = [v for s in logged for k, v in s.values.items() if k.startswith("peak_memory")]
    return {
        "trained_tokens_per_second": median([s.tokens_per_second for s in warm if s.tokens_per_second]),
        "processed_tokens_per_second": speed.processed_tokens_per_second,
        "mfu": speed.mfu, "mfu_note": speed.mfu_note, "peak_memory_gib": max(peaks, default=None),
        "steps_measured": len(warm), "device": speed.device,
    }  # fmt: skip


def run_measured(resolved, gpus: int, nodes: int, steps: int, timeout: float, log_path: Path, device: dict,
                 env: dict | None = None, lengths=None) -> dict:  # fmt: skip
    """One run, stopped after `steps` steps, measured, its run folder deleted (no checkpoint was written)."""
    run = tune_run(resolved, gpus * nodes, steps, timeout, log_path, env)
    try:
        result = (
            {**run, **measured(resolved, steps, device, gpus * nodes, lengths)}
            if run["first_step_seconds"]
            else run
        )
    finally:
        shutil.rmtree(resolved.run_dir, ignore_errors=True)
    return result


def timed_run(resolved, log_path: Path, gpus: int = 1, nodes: int = 1) -> dict:
    """A whole run (to its own end, checkpoint included) and its measurements; {"error": ...} when it failed."""
    from kfp_finetune.components.torchtune_finetune.throughput import record_device

    device = record_device(resolved.run_dir)
    run = tune_run(resolved, gpus * nodes, None, float("inf"), log_path)
    if run["status"] != "ok":
        return {"error": f"{run['status']}: see {log_path}"}
    result = measured(resolved, None, device, gpus * nodes)
    return {**result, "first_step_seconds": run["first_step_seconds"], "steps": result["steps_measured"]}
