"""Public data types: the :class:`Scenario` knobs and the :class:`RecordedRequest` log entries."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._common import JOBSET_FAILED_MESSAGE, parse_route

#: torchtune DiskLogger-style lines a successful simulated rank 0 prints by default.
DEFAULT_LOG_LINES = (
    "Step 1 | loss:2.3026 lr:0.0001 tokens_per_second_per_gpu:123.4",
    "Step 2 | loss:2.1000 lr:0.0001 tokens_per_second_per_gpu:125.0",
    "Step 3 | loss:1.9500 lr:0.0001 tokens_per_second_per_gpu:126.1",
)


@dataclasses.dataclass
class Scenario:
    """How the simulated controller drives one TrainJob (or every TrainJob without its own scenario).

    Timeline of a simulated job: pods are created Pending; after ``pending_seconds`` they run (unless
    ``stay_pending``); rank 0 prints ``log_lines`` one every ``line_interval`` seconds (other ranks print one
    banner line); then pods end and the TrainJob gets ``Complete`` or ``Failed``. ``spec.activeDeadlineSeconds``
    is honored at every stage (``Failed``/``DeadlineExceeded``, pods deleted).

    Attributes:
        outcome: ``"succeed"`` or ``"fail"`` (ignored when ``stay_pending`` or ``execute``).
        log_lines: Lines rank 0 writes to its log while running.
        line_interval: Seconds between log lines.
        pending_seconds: Slow start: how long pods stay Pending before running.
        stay_pending: Stay Pending: with a ``FailedScheduling`` pending event until ``KubeStandin.free_node``, else
            for good; the TrainJob gets no terminal condition unless ``spec.activeDeadlineSeconds`` expires.
        pending_events: Events recorded while Pending, as dicts ``{"reason", "message", "type"}`` (type defaults
            to Warning); each is recorded for every pod, or once for the TrainJob if the dict has
            ``"kind": "TrainJob"``. A ``FailedScheduling`` event also makes the pods' PodScheduled condition False.
        waiting_reason: Container waiting reason shown while Pending (e.g. ``"ImagePullBackOff"``); default
            ``ContainerCreating`` (or none while unschedulable).
        waiting_message: Message for ``waiting_reason``.
        resources_creation_error: The Trainer cannot create the JobSet (e.g. a JobSet webhook's denial): a Warning
            ``TrainJobResourcesCreationFailed`` event on the TrainJob with this error, no JobSet, no pods, no
            condition (_podcreate.py).
        failure_reason: TrainJob ``Failed`` condition reason (JobSet's reasons: ``FailedJobs``, ...).
        failure_message: TrainJob ``Failed`` condition message.
        exit_code: Exit code of the failing container.
        oom_killed: The failing container terminates with reason ``OOMKilled`` and exit code 137.
        failed_rank: Which rank fails (the Job controller deletes the other ranks' pods once the Job failed).
        execute: Run the node command as local subprocesses (see :meth:`KubeStandin.execute`).
        lost_node_after_lines: After this many rank-0 log lines, the node of ``lost_node_rank`` is lost (None: never):
            its pod gets a ``DisruptionTarget`` condition and fails, and the Job controller applies the runtime's
            podFailurePolicy (``_disruption.py``): ``Ignore`` replaces the pod (the trainer starts over, once).
        lost_node_rank: Which rank's node is lost.
        preempt_on_line: Execute mode: at the first output line of rank 0 (where training logs) that contains
            this text (e.g. ``"Step 3 |"``), the scheduler preempts rank ``preempted_rank``'s pod
            (``_disruption.py``): ``DisruptionTarget`` (``PreemptionByScheduler``), a graceful delete, the node
            container's ``preStop`` exec hook (if any),
            SIGTERM to the command, SIGKILL to all its processes when the pod's ``terminationGracePeriodSeconds``
            (default 30) is over (_execute.py, ``_stop_container``); the pod fails with the command's exit
            code and the Job controller applies the runtime's podFailurePolicy: ``Ignore`` replaces the pod (after
            the pod back-off, scaled by ``restart_backoff_scale``) and the replacement runs the same command. Once
            per TrainJob start. The policy applies as well to any other pod whose command fails (an ``Ignore`` on
            its exit code replaces it; the failed pod stays).
        preempted_rank: Which rank ``preempt_on_line`` preempts.
        lose_node_on_line: Execute mode: as ``preempt_on_line``, but the node of rank ``lost_node_rank`` is lost:
            every process of the pod is SIGKILLed at once, PodGC marks the pod (``DeletionByPodGC``, phase Failed,
            container statuses as last reported) and deletes it, and the podFailurePolicy decides as above. A
            replacement pinned to the lost node (required node affinity) can never be scheduled.
        kueue_preempt_on_line: Execute mode: at the first rank-0 output line that contains this text, Kueue
            preempts the queued TrainJob's workload (as ``KubeStandin.preempt``): it is suspended, the Job deletes its
            pods gracefully (the preStop hook, SIGTERM, SIGKILL at the end of the grace period, each pod keeping its
            exit code) and it waits in its queue until ``KubeStandin.admit``. For test determinism the container is
            held (SIGSTOP) from that line until its stop begins. Once per TrainJob start.
        restart_backoff_scale: Scales the kubelet's crash-loop back-off (10s doubling to 300s) and the Job
            controller's pod back-off when a failing trainer is restarted or replaced (a runtime without
            ``restartPolicy: Never`` / ``backoffLimit: 0``); each restart runs the trainer's log lines again.
    """

    outcome: str = "succeed"
    log_lines: tuple[str, ...] | list[str] = DEFAULT_LOG_LINES
    line_interval: float = 0.02
    pending_seconds: float = 0.05
    stay_pending: bool = False
    pending_events: tuple[dict, ...] | list[dict] = ()
    waiting_reason: str | None = None
    waiting_message: str = ""
    resources_creation_error: str = ""
    failure_reason: str = "FailedJobs"
    failure_message: str = JOBSET_FAILED_MESSAGE
    exit_code: int = 1
    oom_killed: bool = False
    failed_rank: int = 0
    execute: bool = False
    restart_backoff_scale: float = 0.001
    lost_node_after_lines: int | None = None
    lost_node_rank: int = 0
    preempt_on_line: str | None = None
    preempted_rank: int = 0
    lose_node_on_line: str | None = None
    kueue_preempt_on_line: str | None = None

    @classmethod
    def success(cls, log_lines: list[str] | tuple[str, ...] = DEFAULT_LOG_LINES, **knobs: Any) -> Scenario:
        """A job whose rank 0 prints ``log_lines`` and then completes."""
        return cls(outcome="succeed", log_lines=tuple(log_lines), **knobs)

    @classmethod
    def failure(
        cls, reason: str = "FailedJobs", message: str = JOBSET_FAILED_MESSAGE, **knobs: Any
    ) -> Scenario:
        """A job that fails with the given ``Failed`` condition reason and message."""
        return cls(outcome="fail", failure_reason=reason, failure_message=message, **knobs)

    @classmethod
    def oom(cls, **knobs: Any) -> Scenario:
        """A job whose rank-0 container is OOMKilled (exit code 137) and so fails with ``FailedJobs``."""
        return cls(outcome="fail", oom_killed=True, exit_code=137, **knobs)

    @classmethod
    def stuck_pending(
        cls, *, unschedulable: bool = True, image_pull_backoff: bool = False, **knobs: Any
    ) -> Scenario:
        """Pods that never start.

        By default unschedulable: a ``FailedScheduling`` event and no container statuses, as on a cluster. With
        ``image_pull_backoff``: scheduled, with an ``ImagePullBackOff`` waiting container and ``Failed``/``BackOff``
        events (``unschedulable`` is then ignored).
        """
        events: list[dict] = []
        if unschedulable and not image_pull_backoff:
            events.append(
                {
                    "reason": "FailedScheduling",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
                    "available: 3 No preemption victims found for incoming pod.",
                }
            )
        if image_pull_backoff:
            events += [
                {"reason": "Failed", "message": "Failed to pull image: rpc error: code = NotFound"},
                {"reason": "BackOff", "message": "Back-off pulling image"},
            ]
            knobs.setdefault("waiting_reason", "ImagePullBackOff")
            knobs.setdefault("waiting_message", "Back-off pulling image")
        knobs.setdefault("pending_events", tuple(events))
        return cls(stay_pending=True, **knobs)


@dataclasses.dataclass(frozen=True)
class RecordedRequest:
    """One request the stand-in received (including rejected ones).

    Attributes:
        method: HTTP method, e.g. ``"POST"``.
        path: URL path without the query, e.g. ``/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs``.
        query: Parsed query; each key maps to its last value (``{"propagationPolicy": "Background"}``).
        body: Parsed JSON body, or None.
        status: HTTP status code answered.
    """

    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int

    @property
    def resource(self) -> str | None:
        """The resource plural the request addressed (``trainjobs``, ``pods``, ``events`` …)."""
        route = parse_route(self.path)
        return route.plural if route else None

    @property
    def name(self) -> str | None:
        """The object name in the path, if any."""
        route = parse_route(self.path)
        return route.name if route else None

    @property
    def subresource(self) -> str | None:
        """``"log"`` for pod log requests, else None."""
        route = parse_route(self.path)
        return route.subresource if route else None

    def param(self, key: str) -> Any:
        """A query parameter, or the same key in the JSON body (DeleteOptions travel either way)."""
        if key in self.query:
            return self.query[key]
        return self.body.get(key) if isinstance(self.body, dict) else None
