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
exits non-zero: `node_exit_code` gives the pod its workers' stop code instead.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

#: A training process stopped because its own pod is stopping.
OWN_POD_STOPPING = 128 + signal.SIGTERM
#: A training process stopped because another node's pod is stopping (the runtimes' podFailurePolicy: Ignore).
OTHER_POD_STOPPING = 75


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
