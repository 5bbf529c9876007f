"""How a training process that saved its checkpoint and stopped for a pod's stop exits, and how its node pod does:
the exit codes the runtimes' podFailurePolicy tells apart (runtimes/).

- Its own pod is stopping (the preStop hook asked, stop_request.py, or SIGTERM): 143, the exit a SIGTERM'd process
  has. That pod is preempted, drained or evicted (DisruptionTarget: the Job replaces it), its TrainJob deleted or
  suspended (nothing to replace), or its step's lease lapsed (FailJob: nobody watches the training any more).
- On several nodes, another node's pod is stopping: every process agrees to stop at the same step (one
  all-reduce), so the pods that are not stopping end too, with nothing wrong with them. They exit 75 (sysexits.h
  EX_TEMPFAIL: a temporary failure, to be retried), which the runtimes' podFailurePolicy ignores as it ignores the
  disrupted pod: the Job replaces every node pod, and the new ones resume together from the checkpoint. With 143
  and no DisruptionTarget, the runtimes' FailJob rule would fail the whole TrainJob instead.

Under torchrun the pod's exit is its agent's, which raises ChildFailedError (Python then exits 1) when any worker
exits non-zero: `node_exit_code` gives the pod its workers' stop code instead. The agent can also fail before it
saw its workers end: on several nodes the rendezvous store lives in one node's agent, which may exit first, and the
others' agents then raise RendezvousConnectionError at their next look at it and end their workers. So each worker
that saved its part of the stop's checkpoint says so before the checkpoint's last barrier, which no node's pod passes
before every worker said it (`record_stop`, in the container's stop folder), and the node's entrypoint reads what
they said (`recorded_stop_codes`) where torchrun's error has no exit codes.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

from kfp_finetune.components._shared.stop_request import folder

#: A training process stopped because its own pod is stopping.
OWN_POD_STOPPING = 128 + signal.SIGTERM
#: A training process stopped because another node's pod is stopping (the runtimes' podFailurePolicy: Ignore).
OTHER_POD_STOPPING = 75
#: A stopped worker's record in the container's stop folder, followed by its local rank.
_STOPPED = "stopped-"


def stop_exit_code(own_pod: bool) -> int:
    """The exit code of a training process that saved its checkpoint and stops: for its own pod's stop or not."""
    return OWN_POD_STOPPING if own_pod else OTHER_POD_STOPPING


def node_exit_code(worker_exit_codes: Iterable[int]) -> int | None:
    """The node pod's exit code for the exit codes of its failed torchrun workers (torch elastic's ProcessFailure:
    a signal as its negative number) when every one stopped for a stop: OTHER_POD_STOPPING when all stopped for
    another pod's, OWN_POD_STOPPING when any stopped for its own pod's or was ended by SIGTERM (torchrun stops the
    other workers once one exited). None for anything else: a crash, whose torchrun error stands."""
    codes = set(worker_exit_codes)
    if codes and codes <= {OTHER_POD_STOPPING}:
        return OTHER_POD_STOPPING
    if codes and codes <= {OTHER_POD_STOPPING, OWN_POD_STOPPING, -signal.SIGTERM}:
        return OWN_POD_STOPPING
    return None


def record_stop(code: int) -> None:
    """Say, for the node's entrypoint, that this training process saved its part of the stop's checkpoint and
    exits with `code` (torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE name it among the node's workers)."""
    rank, workers = os.environ.get("LOCAL_RANK", "0"), os.environ.get("LOCAL_WORLD_SIZE", "1")
    with contextlib.suppress(OSError):  # a folder that cannot be written: the agent's own view stands
        folder().mkdir(parents=True, exist_ok=True)
        partial = folder() / f".{_STOPPED}{rank}.{os.getpid()}"
        partial.write_text(f"{code} {workers}\n")
        partial.replace(folder() / f"{_STOPPED}{rank}")


def recorded_stop_codes(since: float) -> list[int]:
    """The exit codes every worker of this node recorded since `since` (this container's training began), or []
    when any of them recorded none."""
    said: dict[int, tuple[int, int]] = {}
    with contextlib.suppress(OSError):
        for path in folder().glob(f"{_STOPPED}*"):
            with contextlib.suppress(OSError, ValueError):
                if path.stat().st_mtime >= since:
                    code, workers = (int(word) for word in path.read_text().split())
                    said[int(path.name.removeprefix(_STOPPED))] = (code, workers)
    workers = {count for _, count in said.values()}
    if len(workers) != 1 or set(said) != set(range(workers.pop())):
        return []
    return [code for code, _ in said.values()]
