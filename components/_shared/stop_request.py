"""A node pod's stop, asked of its training before the SIGTERM: the node container's preStop hook (runtimes/).

Why: torchrun forwards SIGTERM to its workers and SIGKILLs them 30 s later (torch.distributed.elastic's shutdown
timeout: fixed before torch 2.12, and the trainer images' torch is 2.9), whatever the pod's grace period, and a large
model's checkpoint does not fit in 30 s. The kubelet runs a container's preStop hook first and sends SIGTERM only
once it returned, the whole within the pod's terminationGracePeriodSeconds (kubelet kuberuntime_container.go,
killContainer). So the hook asks the training to stop: each training process sees the request between two steps,
saves its checkpoint and exits, and the hook returns once every training process of the container has exited. The
grace period, not torchrun's 30 s, bounds the checkpoint; the SIGTERM that follows finds nothing left to save.

The request and the wait go through two files in a folder of the container's temp folder (the hook runs in the
container, with its environment), named for the pod (its hostname) and the user, should /tmp be shared with other
pods or outlive the container: `requested`, which the hook writes with the time, and `training.lock`, which every
training process holds with a shared flock from the start of training until it exits, so the hook's exclusive flock is
granted exactly when the last one has gone (a killed process's lock goes with it). A request from before the
training process began belongs to an earlier container and is ignored.

A training process that sees the request says so (`acknowledged`), and so does one that has finished training and
writes its outputs (`finishing`). When none has within ACK_SECONDS — a rank stuck in a collective whose peer is gone
(another node's crash failed the Job), a step or an epoch-end save longer than that — the hook stops waiting and
leaves the container to SIGTERM, rather than hold its GPUs for the whole grace period.

    python -m kfp_finetune.components._shared.stop_request      # the preStop hook

Where the folder cannot be written (a read-only root filesystem) training goes on without it and SIGTERM alone stops
it, as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)

#: The hook's command in the runtimes' node container (a test checks each runtime names it).
HOOK_COMMAND = ("python", "-m", "kfp_finetune.components._shared.stop_request")
FOLDER = "kfp-finetune-stop"
REQUESTED = "requested"
ACKNOWLEDGED = "acknowledged"
LOCK = "training.lock"
#: How long the hook waits for a training process to see its request (one step boundary, at most).
ACK_SECONDS = 120.0


def folder() -> Path:
    """The container's stop folder: in its temp folder, named for the pod and the user."""
    return Path(tempfile.gettempdir()) / f"{FOLDER}-{socket.gethostname()}-{os.getuid()}"


class TrainingProcess:
    """This process's side: `hold()` once training begins (a hook then waits for it to exit), and `requested()`,
    asked between two steps."""

    def __init__(self) -> None:
        self._lock_fd: int | None = None
        self._failed = False
        self._since = time.time()  # an older request is an earlier container's

    def hold(self) -> None:
        """Hold the shared lock until this process exits (once; a folder that cannot be written: never)."""
        if self._lock_fd is not None or self._failed:
            return
        try:
            folder().mkdir(parents=True, exist_ok=True)
            fd = os.open(folder() / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as error:
            self._failed = True
            log.warning(
                "no stop requests from the pod's preStop hook (%s): only SIGTERM stops this run", error
            )
            return
        self._lock_fd = fd  # never closed: the lock goes when the process does, whichever way it ends
        _remove_older(ACKNOWLEDGED, self._since)

    def requested(self) -> bool:
        """True once the container's preStop hook asked the training to stop, since this process began (and the
        hook is told this process acts on it)."""
        asked = _time_in(REQUESTED)
        if asked is None or asked < self._since:
            return False
        self.acknowledge()
        return True

    def acknowledge(self) -> None:
        """Tell a waiting hook that this process is saving and will exit by itself."""
        if self._lock_fd is not None:
            _write(ACKNOWLEDGED, f"{time.time():.6f}")

    def finishing(self) -> None:
        """Tell a hook, now or later, that this process has finished training and exits once its outputs are
        written: whenever a request comes, it is acknowledged."""
        if self._lock_fd is not None:
            _write(ACKNOWLEDGED, "inf")


def _write(name: str, value: str) -> None:
    """`value` into the stop folder's file `name`, renamed into place whole."""
    folder().mkdir(parents=True, exist_ok=True)
    partial = folder() / f".{name}.{os.getpid()}"
    partial.write_text(value + "\n")
    partial.replace(folder() / name)


def _remove_older(name: str, since: float) -> None:
    """Remove the stop folder's file `name` if it was written before `since`: an earlier container's (a /tmp that
    outlived it), whose "finishing" would keep a hook waiting on this container's training for the whole grace
    period. Every training process of this container began (`since`) before any of them could acknowledge: the
    first step's collectives wait for all of them, so none removes another's."""
    with contextlib.suppress(OSError):
        if (folder() / name).stat().st_mtime < since:
            (folder() / name).unlink()


def _time_in(name: str) -> float | None:
    try:
        return float((folder() / name).read_text())
    except (OSError, ValueError):  # none, or a folder that cannot be read
        return None


def request() -> None:
    """The hook's first half: ask the container's training to stop."""
    _write(REQUESTED, f"{time.time():.6f}")


def wait_for_training(ack_seconds: float = ACK_SECONDS) -> tuple[float, bool]:
    """The hook's second half: wait until every training process of the container exited (the kubelet ends the
    wait at the grace period), or for `ack_seconds` when none acknowledged the request. The seconds waited, and
    whether they exited."""
    started = time.monotonic()
    asked = _time_in(REQUESTED) or 0.0
    fd = os.open(folder() / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - started, True
            except BlockingIOError:
                pass
            waited = time.monotonic() - started
            if waited >= ack_seconds and (_time_in(ACKNOWLEDGED) or 0.0) < asked:
                return waited, False
            time.sleep(0.2)
    finally:
        os.close(fd)


def main() -> int:
    request()
    print("kfp-finetune: the pod is stopping: asked the training to save a checkpoint and exit", flush=True)
    waited, exited = wait_for_training()
    if exited:
        print(f"kfp-finetune: the training processes exited after {waited:.1f}s", flush=True)
    else:
        print(
            f"kfp-finetune: no training process acknowledged in {waited:.0f}s: leaving it to SIGTERM",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
