"""The step's lease on its TrainJob: a file in the run folder that the launching step renews and the node pods
watch, so that a TrainJob whose step was SIGKILLed (OOM, eviction, node loss) stops instead of training unobserved.

Why a file: the launcher and the node pods already share the run workspace (the backend refuses a TrainJob that
does not mount it), so this needs no extra RBAC, no controller and no API call from the node pods, and it works
whatever killed the step, even when its pod object stays (an OOM-killed container keeps a Failed pod until the
workflow is garbage-collected, so an ownerReference alone would not stop the training).

- The launcher writes `launcher.lease` (holder, sequence, duration) before it creates or attaches, bumps the
  sequence every `duration / 10` seconds, and marks it released when it returns (however it returns: a TrainJob it
  keeps on purpose, `tune_cleanup_policy=never`, is left alone).
- Each node pod's entrypoint starts a watchdog process beside `tune run` when it finds an unreleased lease: when the sequence
  has not changed for `duration` seconds by its own clock (no clock skew between machines), it says so in the node
  log and stops the trainer (SIGTERM, SIGKILL after a grace period). The pod fails, the runtime's podFailurePolicy
  fails the TrainJob, and its nodes are free.
- A KFP retry of the step (or a re-run of the same task) attaches to the TrainJob and renews the same lease, so a
  retry that comes within `duration` takes over the training instead of restarting it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

LEASE_FILE = "launcher.lease"
#: Long enough for a KFP retry's pod to be scheduled and re-attach, short against a day of GPU time.
DEFAULT_LEASE_SECONDS = 600.0
STOP_GRACE_SECONDS = 30.0  # after SIGTERM, before SIGKILL (torchrun forwards SIGTERM to its workers)
PREFIX = "kfp-finetune: "


@dataclasses.dataclass(frozen=True)
class Lease:
    """What the lease file holds.

    Attributes:
        holder: The step's pod (or host) name.
        sequence: Bumped at each renewal.
        duration: Seconds without a renewal after which the node pods stop training.
        released: The step ended and let go: nobody stops the TrainJob for a missing renewal.
    """

    holder: str
    sequence: int
    duration: float
    released: bool = False


def read_lease(path: Path) -> Lease | None:
    """The lease in `path`, or None when there is none (or it cannot be read now)."""
    try:
        return Lease(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_lease(path: Path, lease: Lease) -> None:
    """Replace the lease file in one step (a reader never sees half a file)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(dataclasses.asdict(lease)))
    os.replace(partial, path)


class LeaseRenewer:
    """Holds the lease from a thread until `release()` (see the module docstring).

    Args:
        path: The lease file (`<run folder>/launcher.lease`).
        holder: Who holds it (the step's pod name).
        duration: Seconds the node pods wait for a renewal.
        log: Where a failed renewal is said (once until one succeeds).
    """

    def __init__(self, path: Path, holder: str, duration: float, log: Any) -> None:
        self.path, self.holder, self.duration, self.log = path, holder, duration, log
        self._sequence = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        """Write the lease now (before the TrainJob exists), then renew it from a thread."""
        self._renew()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.path.parent.name}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and mark the lease released."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._renew(released=True)

    def _run(self) -> None:
        while not self._stop.wait(self.duration / 10):
            self._renew()

    def _renew(self, released: bool = False) -> None:
        self._sequence += 1
        try:
            write_lease(self.path, Lease(self.holder, self._sequence, self.duration, released))
        except OSError as error:
            if not self._failing:
                self.log.warning("cannot renew the TrainJob lease %s (%s); retrying", self.path, error)
            self._failing = True
            return
        self._failing = False


def guard_with_lease(run_dir: Path, *, poll: float | None = None) -> None:
    """In a node pod, before it runs `tune run` in this process: start a watchdog process that stops this process
    when the step's lease on the TrainJob lapses. Does nothing without an unreleased lease (a local run, an older
    launcher).

    The watchdog is a fresh interpreter (not a fork: torch's threads may hold locks) in the same process group, so
    whatever ends the pod's processes ends it too."""
    path = run_dir / LEASE_FILE
    lease = read_lease(path)
    if lease is None or lease.released:
        return
    poll = poll or min(10.0, lease.duration / 20)
    subprocess.Popen(
        [sys.executable, "-m", __name__, str(path), str(os.getpid()), str(poll)],
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )


def watch_lease(
    path: Path, trainer: int, *, poll: float, clock: Callable[[], float] = time.monotonic
) -> None:
    """The watchdog's loop: return when the trainer is gone or the lease released; stop the trainer when the lease
    went `duration` seconds without a renewal."""
    seen = read_lease(path)
    changed_at = clock()
    while os.getppid() == trainer:
        time.sleep(poll)
        lease = read_lease(path)
        if (
            lease is None
        ):  # being replaced, or the workspace is briefly unreadable: judge by the last one seen
            lease = seen
        if lease is None or lease.released:
            return
        if seen is None or (lease.holder, lease.sequence) != (seen.holder, seen.sequence):
            seen, changed_at = lease, clock()
        elif clock() - changed_at > lease.duration:
            print(
                f"{PREFIX}the pipeline step that launched this TrainJob ({lease.holder}) stopped renewing its lease "
                f"{path} {clock() - changed_at:.0f}s ago (the step was killed, evicted or lost its node, and no "
                "retry took over): stopping the training so that it does not run unobserved",
                file=sys.stderr,
                flush=True,
            )
            stop(trainer)
            return


def main(argv: list[str]) -> int:
    """The watchdog process: `python -m ...lease <lease file> <trainer pid> <poll seconds>`."""
    path, trainer, poll = Path(argv[0]), int(argv[1]), float(argv[2])
    watch_lease(path, trainer, poll=poll)
    return 0


def stop(pid: int) -> None:
    """SIGTERM, then SIGKILL after the grace period if the process is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while os.getppid() == pid and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.getppid() == pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
