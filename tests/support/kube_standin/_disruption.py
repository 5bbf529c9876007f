"""A node pod disrupted (its node lost, or preempted by the scheduler), and the Job controller replacing it when the
runtime's podFailurePolicy says so.

Upstream (kubernetes):
  * pkg/scheduler/framework/preemption/executor.go (PreemptPod): the victim first gets the ``DisruptionTarget``
    condition (reason ``PreemptionByScheduler``, message "<schedulerName>: preempting to accommodate a higher
    priority pod"), then a plain DELETE (so the pod's own ``terminationGracePeriodSeconds``), and a Normal
    ``Preempted`` event "Preempted by pod <uid> on node <node>".
  * pkg/kubelet/kuberuntime/kuberuntime_container.go (killContainer): a deleted pod's container gets a ``Killing``
    event "Stopping container <name>", its preStop hook (given at most the grace period; a failure is a
    ``FailedPreStopHook`` event "PreStopHook failed", and the stop goes on), then the stop signal (SIGTERM, to the container's main
    process only: the runtime signals its init process) and SIGKILL for everything left when the rest of the grace
    period ends (at least 2 s, minimumGracePeriodInSeconds); since 1.27 the
    kubelet sets a deleted pod's phase from its containers' exit (Failed unless all exited 0) before it goes
    (pkg/kubelet/kubelet_pods.go generateAPIPodStatus). The exit code is the process's own: 143 when it ends on
    SIGTERM, 137 when killed.
  * pkg/kubelet/eviction (node-pressure eviction) marks its victims ``DisruptionTarget`` (``TerminationByKubelet``)
    the same way; it is not simulated.
  * pkg/controller/podgc/gc_controller.go (gcOrphaned, markFailedAndDeletePodWithCondition): a pod bound to a node
    that no longer exists gets the ``DisruptionTarget`` condition (reason ``DeletionByPodGC``, message "PodGC: node
    no longer exists"), phase ``Failed``, and is then deleted; its container statuses stay as last reported.
  * pkg/controller/job/job_controller.go + pod_failure_policy.go: a failed pod matching an ``Ignore`` rule
    (``onPodConditions: DisruptionTarget``) is not counted and the Job creates a new pod for its completion index;
    a ``FailJob`` match, or a counted failure past ``backoffLimit``, fails the Job.
  * pkg/controller/job: with a podFailurePolicy the Job's ``podReplacementPolicy`` is ``Failed`` (the only value
    allowed), so the replacement is created only once the old pod is terminal, after the Job's pod-failure
    back-off (backoff_utils.go: 10s doubling per failed pod since the last success, ignored ones included).
  * JobSet v0.12 does not restart the set for a pod the Job replaces itself: the replacement joins as the same rank.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ._common import utc_now

if TYPE_CHECKING:
    from ._types import Scenario

NODE_LOST = ("DeletionByPodGC", "PodGC: node no longer exists")
PREEMPTED = ("PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod")
PREEMPTION, LOST_NODE = "preemption", "lost-node"
WORKLOAD_PREEMPTION = "workload-preemption"  # Kueue's: the whole TrainJob is suspended


@dataclasses.dataclass(frozen=True)
class Disruption:
    """Execute mode's disruption of one node pod (``kind`` PREEMPTION or LOST_NODE), or of the whole workload
    (WORKLOAD_PREEMPTION), at the first output line of rank ``rank`` that contains ``on_line``."""

    kind: str
    rank: int
    on_line: str

    @classmethod
    def of(cls, scenario: Scenario) -> Disruption | None:
        given = [scenario.preempt_on_line, scenario.lose_node_on_line, scenario.kueue_preempt_on_line]
        if sum(bool(line) for line in given) > 1:
            raise ValueError("a scenario preempts its pod or its workload, or loses its node: one of them")
        if scenario.kueue_preempt_on_line:
            return cls(WORKLOAD_PREEMPTION, 0, scenario.kueue_preempt_on_line)
        if scenario.preempt_on_line:
            return cls(PREEMPTION, scenario.preempted_rank, scenario.preempt_on_line)
        if scenario.lose_node_on_line:
            return cls(LOST_NODE, scenario.lost_node_rank, scenario.lose_node_on_line)
        return None


def mark_disrupted(pod: dict, reason: str = NODE_LOST[0], message: str = NODE_LOST[1]) -> None:
    """PodGC's mark on a pod whose node is gone: DisruptionTarget=True, phase Failed, not ready."""
    status = pod["status"]
    status["phase"] = "Failed"
    for condition in status.get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="False", reason="PodFailed")
    _add_disruption_target(pod, reason, message)


def mark_preempted(pod: dict) -> None:
    """The scheduler's status patch on its victim, before it deletes it: DisruptionTarget=True, still running."""
    _add_disruption_target(pod, *PREEMPTED)


def _add_disruption_target(pod: dict, reason: str, message: str) -> None:
    pod["status"].setdefault("conditions", []).append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": utc_now(),
        }
    )
