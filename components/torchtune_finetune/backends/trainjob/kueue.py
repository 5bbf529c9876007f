"""Kueue: the TrainJob waits in a LocalQueue until Kueue admits it, and may be preempted and re-queued.

What Kueue's TrainJob integration (kubernetes-sigs/kueue pkg/controller/jobs/trainjob) does with our TrainJob:

- It manages a TrainJob labelled `kueue.x-k8s.io/queue-name` (pkg/controller/constants QueueLabel); the label
  `kueue.x-k8s.io/priority-class` (WorkloadPriorityClassLabel) names its WorkloadPriorityClass. Its mutating
  webhook (trainjob_webhook.go Default) suspends a queued TrainJob on create; we send `spec.suspend: true`
  ourselves, so the manifest shown in train_config is the one that waits.
- It makes a Workload (kueue.x-k8s.io, labelled `kueue.x-k8s.io/job-uid=<the TrainJob's uid>`: jobframework
  reconciler.go ConstructWorkload) whose status says why it waits: condition QuotaReserved False with the
  scheduler's message (pkg/workload UnsetQuotaReservationWithCondition, e.g. "couldn't assign flavors to pod set
  node: insufficient unused quota for nvidia.com/gpu in flavor h100, 8 more needed"); Admitted True once admitted.
- Admission unsuspends the TrainJob; the Trainer then creates its JobSet and starts the clock of
  `activeDeadlineSeconds` (kubeflow/trainer v2.3.0 pkg/controller/trainjob_controller.go reconcileDeadline counts
  from the Suspended condition's transition to False).
- Preemption suspends it again (trainjob_controller.go Stop): the JobSet's pods are deleted, the Workload gets
  Evicted (reason Preempted) and waits in the queue again.

So the launcher counts the time a queued TrainJob waits apart from its training (`queue_timeout_seconds`, all
waits together), and its training timeout from the latest admission, as the Trainer's deadline does. Each
minute of waiting gives one line in the step log: the queue, the time waited, the Workload's message where
the step's Role may list Workloads (a 403 is said once, and the lines go on without it), and the Workload's
position in its LocalQueue and ClusterQueue where Kueue's visibility API answers (queue_position.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kfp_finetune.components._shared.kube.client import KUEUE_GROUP, KUEUE_VERSION
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import TrainJobTimeout, api_message
from kfp_finetune.components.torchtune_finetune.backends.trainjob.queue_position import QueuePosition
from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import condition

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKLOADS = "workloads"
QUEUE_REPORT_INTERVAL = 60.0  # seconds between the step log's lines about a TrainJob waiting in its queue


class TrainJobQueueTimeout(TrainJobTimeout):
    """Kueue did not admit the TrainJob within queue_timeout_seconds; the message names the queue."""


def queue_labels(queue_name: str, priority_class: str) -> dict[str, str]:
    """The TrainJob's Kueue labels ({} without a queue)."""
    if not queue_name:
        return {}
    return {QUEUE_LABEL: queue_name, **({PRIORITY_CLASS_LABEL: priority_class} if priority_class else {})}


def queue_of(job: Mapping[str, Any] | None) -> str:
    """The Kueue queue the TrainJob is labelled with ("" for none; Kueue's webhook may have defaulted it)."""
    return ((job or {}).get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL, "")


def waits_for_admission(job: Mapping[str, Any]) -> bool:
    """Suspended (Kueue's `spec.suspend`, or the Trainer's Suspended condition not yet turned to Resumed)."""
    return bool((job.get("spec") or {}).get("suspend")) or condition(job, "Suspended") is not None


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


class QueueWait:
    """The waits of one queued TrainJob for Kueue's admission: their time, their lines in the step log, the timeout.

    Args:
        custom: A `kubernetes.client.CustomObjectsApi` (the Workload is read with it).
        namespace, name: The TrainJob.
        queued: Whether the manifest we send names a queue (Kueue's webhook may also default one).
        timeout: Seconds the TrainJob may wait in its queue, all waits together (None: no limit).
        report_interval: Seconds between the lines that say it still waits.
        log: The step's logger.
    """

    def __init__(
        self,
        custom: Any,
        namespace: str,
        name: str,
        *,
        queued: bool,
        timeout: float | None,
        report_interval: float = QUEUE_REPORT_INTERVAL,
        log: Any,
    ) -> None:
        self.custom, self.namespace, self.name = custom, namespace, name
        self.timeout, self.report_interval, self.log = timeout, report_interval, log
        self.queued = queued
        self.admitted_at: float | None = None  # when the latest admission was seen: the training clock
        self._waited = 0.0  # seconds of the waits that ended
        self._since: float | None = None  # when the current wait began
        self._next_report = 0.0
        self._workloads_readable = True
        self._workload_name = ""  # the TrainJob's Workload, once read
        self._position = QueuePosition(custom.api_client, namespace, log=log)

    def waiting(self, job: Mapping[str, Any] | None, now: float, *, api: Callable[..., Any]) -> bool:
        """Whether the TrainJob waits in a Kueue queue now; says so when a wait begins and every interval."""
        queue = queue_of(job)
        if job is None or not queue:
            return False
        if not waits_for_admission(job):
            if self._since is not None or self.admitted_at is None:
                if self._since is not None:
                    self._waited += now - self._since
                    self.log.info(
                        "TrainJob %s admitted by Kueue (queue %s) after %s in the queue: training starts",
                        self.name,
                        queue,
                        _duration(self._waited),
                    )
                self._since, self.admitted_at = None, now
            return False
        if self._since is None:
            self._since, self._next_report = now, now + self.report_interval
            if self.admitted_at is not None:
                self.log.warning(
                    "TrainJob %s was preempted by Kueue, re-queued in queue %s%s; waiting for admission again "
                    "(its node pods are deleted)",
                    self.name,
                    queue,
                    self._workload_words(job, api=api, evicted=True),
                )
                self.admitted_at = None
            else:
                self.log.info(
                    "TrainJob %s waits for admission in Kueue queue %s%s",
                    self.name,
                    queue,
                    f" (tune_queue_timeout_seconds={self.timeout:g})" if self.timeout is not None else "",
                )
        elif now >= self._next_report:
            self._next_report += self.report_interval
            workload_words = self._workload_words(job, api=api)
            self.log.info(
                "TrainJob %s still waits for admission in Kueue queue %s: %s so far%s%s",
                self.name,
                queue,
                _duration(self.waited(now)),
                workload_words,
                self._position.words(
                    queue,
                    workload=self._workload_name,
                    job_uid=job.get("metadata", {}).get("uid", ""),
                    api=api,
                ),
            )
        return True

    def training_since(self, launched: float) -> float | None:
        """Where the training timeout counts from: the latest admission of a queued TrainJob (None before it),
        else `launched`."""
        if self.admitted_at is not None:
            return self.admitted_at
        return None if self.queued else launched

    def waited(self, now: float) -> float:
        """Seconds in the queue so far, all waits together."""
        return self._waited + (now - self._since if self._since is not None else 0.0)

    def overdue(self, now: float) -> bool:
        return self.timeout is not None and self.waited(now) > self.timeout

    def timeout_error(self, job: Mapping[str, Any] | None, deletion_words: str) -> TrainJobQueueTimeout:
        return TrainJobQueueTimeout(
            f"TrainJob {self.namespace}/{self.name} was not admitted by Kueue queue {queue_of(job)!r} within "
            f"tune_queue_timeout_seconds={self.timeout:g} ({deletion_words}); raise tune_queue_timeout_seconds (0: no "
            "limit) or ask for fewer resources"
        )

    def _workload_words(
        self, job: Mapping[str, Any], *, api: Callable[..., Any], evicted: bool = False
    ) -> str:
        """ "; Workload <name>: <why it waits>" (or why it was evicted) from the TrainJob's Workload, where the
        Role allows reading it."""
        from kubernetes.client.exceptions import ApiException

        uid = job.get("metadata", {}).get("uid")
        if not self._workloads_readable or not uid:
            return ""
        try:
            listing = api(
                self.custom.list_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                self.namespace,
                WORKLOADS,
                label_selector=f"{JOB_UID_LABEL}={uid}",
            )
        except ApiException as error:
            if error.status not in (403, 404):
                raise
            self._workloads_readable = False
            self.log.warning(
                "cannot read Kueue Workloads in namespace %s (%s): the queue's admission messages are not "
                "shown; `kubectl describe workloads -n %s -l %s=%s` shows them (runtimes/rbac.yaml grants the "
                "read)",
                self.namespace,
                api_message(error),
                self.namespace,
                JOB_UID_LABEL,
                uid,
            )
            return ""
        workloads = listing.get("items") or []
        if not workloads:
            return "; Kueue has not made its Workload yet"
        workload = workloads[0]
        self._workload_name = workload["metadata"]["name"]
        for type_ in ("Evicted", "Preempted") if evicted else ("QuotaReserved", "Admitted"):
            found = next(
                (c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == type_),
                None,
            )
            if found and found.get("message") and found.get("status") == ("True" if evicted else "False"):
                return f"; Workload {workload['metadata']['name']}: {found['message']}"
        return f"; Workload {workload['metadata']['name']}"
