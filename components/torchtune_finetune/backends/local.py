"""The local backend: run the training command as a child process of the step, behind the checks a TrainJob's
pods make first (entrypoint.py; a refusal becomes the step's ConfigError). Stream its output into the step log,
parse torchtune's metric lines, stop it cleanly on SIGTERM/SIGINT, and fail with the exit code and the last lines
when it fails. A NaN or infinite loss stops it at once (metrics.LossDiverged): the rest of the run would be wasted.
"""

from __future__ import annotations

import ast
import collections
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kfp_finetune.components._shared.cancel import StopSignals, signal_name
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import StepMetrics, parse_metric_line
from kfp_finetune.components.torchtune_finetune.backends import LaunchPlan, ResumePoint, TrainingOutcome
from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged, divergence
from kfp_finetune.components.torchtune_finetune.progress import ProgressClock
from kfp_finetune.components.torchtune_finetune.warm_start import COMPILE_CACHE_ENV

log = get_logger(__name__)

# torchtune's tqdm bar ("1|5|Loss: 2.3:  50%|█████ | 5/10 [...]"), redrawn with \r on stderr: replaced by our
# progress lines. A metric line printed to stdout can land right after a bar on the same line.
_PROGRESS_BAR = re.compile(r"^\d+\|\d+\|Loss: ")
_METRIC_START = re.compile(r"Step \d+ \| ")
STOP_GRACE_SECONDS = 30.0


class TrainingFailed(RuntimeError):
    """The training process exited non-zero; the message carries the exit code and the last output lines."""

    def __init__(self, message: str, returncode: int | None, tail: list[str]):
        super().__init__(message)
        self.returncode = returncode
        self.tail = tail


@dataclass
class TrainingResult:
    command: list[str]
    returncode: int
    wall_seconds: float
    steps: list[StepMetrics] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)


class LocalBackend:
    """Trains on the step's own machine: `tune run` as a child process (torchrun standalone for several GPUs).

    Args:
        devices: Processes (GPUs) to train with; 1 without GPUs.
        nodes: Must be 1.
        gpus: GPUs the step's task asks for; they must be visible here.
        persistent_compile_root: `<model cache>/compile` on the persistent model cache (warm_start.py; "": the
            run workspace's): where torch.compile's caches go.
    """

    name = "local"

    def __init__(
        self, *, devices: int = 1, nodes: int = 1, gpus: int = 0, persistent_compile_root: str = ""
    ) -> None:
        if gpus and not _cuda_available():
            # KFP applies the task's accelerator settings to the TrainJob (RESOURCES passthrough), not to this pod.
            raise ConfigError(
                f"tune_backend=local trains in this step's own pod, which has no GPU: the task's {gpus} GPU(s) per node "
                "are forwarded to TrainJobs only. Use tune_backend=trainjob, or set tune_gpus_per_node=0 to train on CPU"
            )
        if nodes > 1:
            raise ConfigError(
                "tune_backend=local trains on this machine: tune_num_nodes must be 1 (use tune_backend=trainjob)"
            )
        self.devices = devices if gpus else 1
        self.nodes = nodes
        self.persistent_compile_root = persistent_compile_root

    def gpus_available(self) -> bool:
        return _cuda_available()

    def prepare(self, run_dir: Path, *, resume_point: ResumePoint | None = None) -> None:
        point = resume_point(run_dir) if resume_point else None
        if point is not None:
            log.info(
                "an earlier attempt of this task left a checkpoint at %s: training resumes from it", point
            )
        elif run_dir.exists():
            log.info("removing %s left by an earlier attempt of this task: training starts over", run_dir)
            shutil.rmtree(run_dir)

    def run(self, plan: LaunchPlan, *, total_steps: int | None) -> TrainingOutcome:
        from kfp_finetune.components.torchtune_finetune import entrypoint

        # Several local GPUs: torchrun in standalone mode starts one process per device; the checks read the
        # world size from the PET_* variables a TrainJob's pods have.
        torchrun = ["--nproc_per_node", str(self.devices)] if plan.distributed else []
        env = {"PET_NPROC_PER_NODE": str(self.devices)} if plan.distributed else {}
        # The model cache is on this machine as it is for this step: the training process reads the choice.
        if self.persistent_compile_root:
            env[COMPILE_CACHE_ENV] = self.persistent_compile_root
        # The child checks the run with torch as a TrainJob's pods do, records the GPU's name for MFU, then trains
        # in the same process: this step imports no torch.
        command = entrypoint.local_command(plan.command(torchrun), plan.engine)
        try:
            run_local(command, env=env, total_steps=total_steps, cwd=plan.run_dir)
        except TrainingFailed as failed:
            problem = (
                entrypoint.refusal(failed.tail) if failed.returncode == entrypoint.CONFIG_REFUSED else None
            )
            if problem:
                raise ConfigError(problem) from None
            raise
        return TrainingOutcome()


def _cuda_available() -> bool:
    spec = importlib.util.find_spec("torch")
    if spec is None:
        raise ConfigError(
            "tune_backend=local trains in this step's own pod, whose image has no torch (the fine-tune step runs on "
            "the component image and launches TrainJobs): use tune_backend=trainjob"
        )
    build = _torch_build(Path(spec.origin).parent / "version.py")
    if "cuda" in build and build["cuda"] is None and build.get("hip") is None:
        return False  # a CPU build has no GPU to find: this step need not import torch to say so
    import torch

    return torch.cuda.is_available()


def _torch_build(path: Path) -> dict[str, object]:
    """The literals torch's version.py sets (`cuda`, `hip`: the GPU toolkits it was built for), read without
    importing torch; {} when the file cannot be read so."""
    values: dict[str, object] = {}
    try:
        body = ast.parse(path.read_text()).body
    except (OSError, SyntaxError):
        return values
    for node in body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            with contextlib.suppress(ValueError, TypeError, SyntaxError, RecursionError):
                if isinstance(target, ast.Name):
                    values[target.id] = ast.literal_eval(node.value)
    return values


def resolve_executable(command: list[str]) -> list[str]:
    """Run `tune`, `python` and `torchrun` from this interpreter's environment (a venv need not be on PATH)."""
    if command[:1] == ["python"]:
        return [sys.executable, *command[1:]]
    if command[:1] == ["torchrun"]:
        return [sys.executable, "-m", "torch.distributed.run", *command[1:]]
    if command and command[0] == "tune":
        beside = Path(sys.executable).parent / "tune"
        found = str(beside) if beside.exists() else shutil.which("tune")
        if not found:
            raise FileNotFoundError("the `tune` command of torchtune is not installed: pip install torchtune")
        return [found, *command[1:]]
    return command


def run_local(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    total_steps: int | None = None,
    tail_lines: int = 50,
    echo: Callable[[str], None] | None = None,
) -> TrainingResult:
    """Run the training command to completion; raise TrainingFailed unless it exits 0, and LossDiverged (after
    stopping it) at its first NaN or infinite loss."""
    from kfp_finetune.components.torchtune_finetune.entrypoint import STEP_PID_ENV

    echo = echo or (lambda line: print(line, flush=True))
    # The node entrypoint's --local child stops when this process is gone, even killed outright (stop_with_step).
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", STEP_PID_ENV: str(os.getpid())}
    started = time.monotonic()
    log.info("running: %s", " ".join(command))
    process = subprocess.Popen(
        resolve_executable(command),
        cwd=cwd,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so a stop reaches torchrun's workers too
    )
    stop = _ChildStopper(process)
    progress = ProgressClock(total_steps)
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    steps: list[StepMetrics] = []
    diverged: LossDiverged | None = None
    try:
        with StopSignals(stop.on_signal) as signals:
            for line in _lines(process.stdout):
                if _PROGRESS_BAR.match(line):
                    metric_start = _METRIC_START.search(line)
                    if not metric_start:
                        continue
                    line = line[metric_start.start() :]
                tail.append(line)
                metrics = parse_metric_line(line)
                if metrics:  # shown as a progress line; the raw line is kept in the run's metrics file
                    steps.append(metrics)
                    echo(progress.update(metrics).line())
                    diverged = divergence(metrics)
                    if diverged:
                        log.error("loss %s at step %d: stopping training", metrics.loss, metrics.step)
                        break
                else:
                    echo(line)
            returncode = None if diverged else process.wait()
    finally:
        if process.poll() is None:
            stop.terminate()
    wall = time.monotonic() - started
    if diverged:
        raise diverged
    if signals.received is not None:
        raise TrainingFailed(
            f"training stopped by signal {signal_name(signals.received)} after {wall:.0f}s",
            returncode,
            list(tail),
        )
    if returncode != 0:
        last = "\n".join(tail)
        raise TrainingFailed(
            f"training failed with exit code {returncode} after {wall:.0f}s; last {len(tail)} lines:\n{last}",
            returncode,
            list(tail),
        )
    return TrainingResult(command, returncode, wall, steps, list(tail))


def _lines(stream) -> collections.abc.Iterator[str]:
    """Decoded lines, splitting on \\n and on the \\r that progress bars redraw with."""
    buffer = b""
    while chunk := stream.read1(65536):
        buffer += chunk
        *complete, buffer = re.split(rb"\r\n|\r|\n", buffer)
        for raw in complete:
            if raw.strip():
                yield raw.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


class _ChildStopper:
    """Stops the child's process group: TERM, then KILL after a grace period."""

    def __init__(self, process: subprocess.Popen, grace: float = STOP_GRACE_SECONDS):
        self.process, self.grace = process, grace

    def on_signal(self, signum: int) -> None:
        log.warning("received %s: stopping training", signal_name(signum))
        threading.Thread(target=self.terminate, daemon=True).start()

    def terminate(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=self.grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
