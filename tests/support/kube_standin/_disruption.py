"""A lost node: its pod is disrupted, and the Job controller replaces it when the runtime's podFailurePolicy says so.

Upstream (kubernetes):
  * pkg/controller/podgc/gc_controller.go (gcOrphaned, markFailedAndDeletePodWithCondition): a pod bound to a node
    that no longer exists gets the ``DisruptionTarget`` condition (reason ``DeletionByPodGC``, message "PodGC: node
    no longer exists"), phase ``Failed``, and is then deleted; its container statuses stay as last reported.
  * pkg/controller/job/job_controller.go + pod_failure_policy.go: a failed pod matching an ``Ignore`` rule
    (``onPodConditions: DisruptionTarget``) is not counted and the Job creates a new pod for its completion index;
    a ``FailJob`` match, or a counted failure past ``backoffLimit``, fails the Job.
  * JobSet v0.12 does not restart the set for a pod the Job replaces itself: the replacement joins as the same rank.
"""

from __future__ import annotations

from ._common import utc_now

NODE_LOST = ("DeletionByPodGC", "PodGC: node no longer exists")


def mark_disrupted(pod: dict, reason: str = NODE_LOST[0], message: str = NODE_LOST[1]) -> None:
    """PodGC's mark on a pod whose node is gone: DisruptionTarget=True, phase Failed, not ready."""
    now = utc_now()
    status = pod["status"]
    status["phase"] = "Failed"
    for condition in status.get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="False", reason="PodFailed")
    status.setdefault("conditions", []).append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
        }
    )
