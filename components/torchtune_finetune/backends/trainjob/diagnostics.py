"""Why node pods do not run: pods that cannot start, and trainers restarted in place.

Node pods that cannot start: tell why, and fail the step after a short grace period instead of after the
TrainJob timeout (a day by default).

Three causes the kubelet and the scheduler keep retrying for ever, so the TrainJob never fails by itself:

- an image that cannot be pulled (`ErrImagePull` / `ImagePullBackOff`, kubelet pkg/kubelet/images): a typo in
  the image or tag, a private registry without `imagePullSecrets`, a registry the nodes cannot reach;
- a container that cannot be configured (`CreateContainerConfigError`, kubelet kuberuntime_container.go), most
  often a Secret or ConfigMap that its `env`/`envFrom` needs and that does not exist (`secret "x" not found`);
- no node that fits (`PodScheduled=False`, reason `Unschedulable`, scheduler schedule_one.go): too many GPUs or
  too much memory per node, a nodeSelector or taint nothing matches.

Grace periods (launcher options): a pull or config error persisting for `start_failure_grace` (default 5 minutes:
the kubelet's image back-off reaches its 5-minute cap by then, and a Secret created by a slower part of the
pipeline has had time to appear) fails the step. Unschedulable pods get `unschedulable_grace` (default 30 minutes):
a cluster autoscaler adds a node in minutes, a GPU node pool scaling from zero can take 10-20, and Kueue-style
queueing shows as `Suspended`, not as unschedulable pods, so 30 minutes of "no node fits" means no node will.

A trainer that Kubernetes restarts instead of failing: notice it after the first crash and say how to fix the
runtime.

Unless a runtime sets `restartPolicy: Never` on its node pods and `backoffLimit: 0` on its Job, JobSet defaults
the pods to `restartPolicy: OnFailure` and the Job API defaults `backoffLimit` to 6: a crashed (or OOM-killed)
trainer restarts in place up to 7 times, and when the Job finally fails its pods are deleted with their exit codes
and logs. The kfp-finetune runtimes fail fast; for any other runtime the launcher stops at the first restart.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kfp_finetune.components._shared.stop_exit import OTHER_POD_STOPPING
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import api_message

NODE = "node"
IMAGE_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
CONFIG_REASONS = frozenset({"CreateContainerConfigError"})
DEFAULT_START_FAILURE_GRACE = 300.0
DEFAULT_UNSCHEDULABLE_GRACE = 1800.0


@dataclasses.dataclass(frozen=True)
class StartProblem:
    """Why one node pod does not start.

    Attributes:
        kind: "image", "config", "unschedulable", or (creation.py) "create" (the node pods are rejected) and
            "resources" (the Trainer cannot create the JobSet).
        pod: Pod name (for "create" the Job's, for "resources" the TrainJob's).
        reason: The kubelet's waiting reason or the scheduler's condition reason.
        message: Their message.
        image: The node container's image.
    """

    kind: str
    pod: str
    reason: str
    message: str
    image: str = ""

    def explain(self, namespace: str) -> str:
        """One line: what is wrong and how to fix it."""
        if self.kind == "image":
            return (
                f"pod {self.pod}: image {self.image!r} cannot be pulled ({self.reason}: {self.message}). "
                "Fix: check the image name and tag (the trainer image setting), that the registry is reachable "
                "from the nodes, and for a private registry give the runtime's node pods imagePullSecrets."
            )
        if self.kind == "config":
            secret = re.search(r'(secret|configmap)s? "([^"]+)" not found', self.message, re.IGNORECASE)
            fix = (
                f"create {secret.group(1).capitalize()} {secret.group(2)!r} in namespace {namespace} "
                f"(kubectl create {secret.group(1).lower()} generic {secret.group(2)} -n {namespace} ...) "
                "or remove the reference from the env"
                if secret
                else "fix the container's env, volumes or securityContext that the message names"
            )
            return f"pod {self.pod}: container {NODE} cannot be configured ({self.reason}: {self.message}). Fix: {fix}."
        if self.kind == "create":
            return (
                f"Job {self.pod}: its pods cannot be created ({self.reason}: {self.message}). Fix: what the API "
                "server or admission policy names: requests above the runtime's limits, GPUs without an equal limit, "
                "a ResourceQuota or a Pod Security level; fix the step's resources or the runtime."
            )
        if self.kind == "resources":
            return (
                f"TrainJob {self.pod}: the Trainer cannot create its JobSet ({self.reason}: {self.message}). Fix: "
                f"what the message names in the TrainJob's settings or its runtime (kubectl describe trainjob -n "
                f"{namespace} {self.pod})."
            )
        return (
            f"pod {self.pod}: no node can run it ({self.reason}: {self.message}). Fix: request fewer GPUs or "
            "less memory per node (or more nodes with less each), fix the nodeSelector / tolerations, or add "
            "capacity to the cluster."
        )


def start_problems(pods: Iterable[Mapping[str, Any]]) -> list[StartProblem]:
    """What keeps each not-yet-running node pod from starting (pods without a problem are left out)."""
    problems = []
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        if status.get("phase") not in (None, "Pending", "Running") or pod["metadata"].get(
            "deletionTimestamp"
        ):
            continue
        spec_node = next(
            (c for c in (pod.get("spec") or {}).get("containers") or [] if c["name"] == NODE), {}
        )
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason", "")
            kind = "image" if reason in IMAGE_REASONS else "config" if reason in CONFIG_REASONS else None
            if kind and container.get("name") == NODE:
                image = container.get("image") or spec_node.get("image", "")
                problems.append(StartProblem(kind, name, reason, waiting.get("message", ""), image))
        for condition in status.get("conditions") or []:
            if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
                "PodScheduled",
                "False",
                "Unschedulable",
            ):
                problems.append(
                    StartProblem("unschedulable", name, "Unschedulable", condition.get("message", ""))
                )
    return problems


class StartWatch:
    """Remembers since when each (pod, kind) problem has persisted and answers those past their grace period.

    Args:
        start_failure_grace: Seconds an image-pull, container-config or creation error may persist.
        unschedulable_grace: Seconds a pod may stay unschedulable.
    """

    def __init__(
        self,
        start_failure_grace: float = DEFAULT_START_FAILURE_GRACE,
        unschedulable_grace: float = DEFAULT_UNSCHEDULABLE_GRACE,
    ) -> None:
        self.grace = {kind: start_failure_grace for kind in ("image", "config", "create", "resources")}
        self.grace["unschedulable"] = unschedulable_grace
        self._since: dict[tuple[str, str], float] = {}

    def overdue(
        self, pods: Iterable[Mapping[str, Any]], now: float, also: Iterable[StartProblem] = ()
    ) -> list[StartProblem]:
        """The problems seen now (in `pods`, and `also` those read from events) that were first seen at least their
        grace period ago (by our clock: pod timestamps come from other machines' clocks)."""
        problems = [*start_problems(pods), *also]
        current = {(p.pod, p.kind) for p in problems}
        self._since = {key: t for key, t in self._since.items() if key in current}
        for key in current:
            self._since.setdefault(key, now)
        return [p for p in problems if now - self._since[(p.pod, p.kind)] >= self.grace[p.kind]]


def waiting_lines(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """`pod P container C waiting: REASON MESSAGE` for each container waiting for more than its creation."""
    lines = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] != "ContainerCreating":
                lines.append(
                    f"pod {pod['metadata']['name']} container {status.get('name')} waiting: "
                    f"{waiting['reason']} {waiting.get('message', '')}"
                )
    return lines


def start_failure_message(problems: list[StartProblem], namespace: str, name: str) -> tuple[str, str]:
    """(reason, message) for the step's error: the first problem's kind decides the reason."""
    reason = {
        "image": "ImagePullFailed",
        "config": "ContainerConfigError",
        "unschedulable": "Unschedulable",
        "create": "PodCreationFailed",
        "resources": "ResourcesCreationFailed",
    }[problems[0].kind]
    seen: set[str] = set()
    lines = []
    for problem in problems:
        line = problem.explain(namespace)
        if line.split(": ", 1)[1] not in seen:  # the same cause on every rank: say it once
            seen.add(line.split(": ", 1)[1])
            lines.append(line)
    return reason, f"node pods of TrainJob {namespace}/{name} cannot start:\n  " + "\n  ".join(lines)


def report_pending(
    core: Any,
    namespace: str,
    name: str,
    pods: list[dict],
    seconds: float,
    *,
    api: Callable[..., Any],
    log: Any,
    shown_events: set[str],
) -> None:
    """Log why the node pods of TrainJob `name` are still Pending: waiting reasons and events not yet shown.

    Args:
        core: A `kubernetes.client.CoreV1Api`.
        namespace: The TrainJob's namespace.
        name: The TrainJob's name.
        pods: Its node pods.
        seconds: How long they have been Pending.
        api: Calls an API function with retries.
        log: Where the warnings go.
        shown_events: Uids of the events already logged (updated).
    """
    log.warning(
        "TrainJob %s: node pods still Pending after %.1fs (%s)",
        name,
        seconds,
        ", ".join(p["metadata"]["name"] for p in pods) or "no pods created yet",
    )
    for line in waiting_lines(pods):
        log.warning("  %s", line)
    log_events(core, namespace, name, pods, api=api, log=log, shown_events=shown_events)


def node_job_name(trainjob: str) -> str:
    """The `node` Job JobSet creates for a TrainJob: `<jobset>-<replicatedJob>-<index>` (jobset
    pkg/controllers/jobset_controller.go, placement.GenJobName), one Job whose pods are the ranks."""
    return f"{trainjob}-{NODE}-0"


def log_events(
    core: Any,
    namespace: str,
    name: str,
    pods: list[dict],
    *,
    api: Callable[..., Any],
    log: Any,
    shown_events: set[str],
) -> None:
    """Log the events not yet shown of TrainJob `name`, its `node` Job (pods it could not create) and `pods`."""
    from kubernetes.client.exceptions import ApiException

    for involved in [name, node_job_name(name), *(p["metadata"]["name"] for p in pods)]:
        try:
            events = api(
                core.list_namespaced_event, namespace, field_selector=f"involvedObject.name={involved}"
            )
        except ApiException as error:  # diagnostics only: never fail the run for them
            log.warning("  cannot list events of %s: %s", involved, api_message(error))
            return
        for event in events.items:
            if event.metadata.uid in shown_events:
                continue
            shown_events.add(event.metadata.uid)
            log.warning(
                "  event %s %s: %s: %s", event.involved_object.kind, involved, event.reason, event.message
            )


def pod_status_lines(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per node pod: phase, an unscheduled pod's reason, and each container's state."""
    lines = []
    for pod in pods:
        status = pod.get("status") or {}
        rank = (pod["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, "?")
        parts = [status.get("phase") or "Unknown"]
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                parts.append(f"not scheduled: {cond.get('reason')} {cond.get('message', '')}".rstrip())
        for container in status.get("containerStatuses") or []:
            states = [*(container.get("state") or {}).items()]
            states += [(f"last {kind}", d) for kind, d in (container.get("lastState") or {}).items()]
            for kind, detail in states:
                words = " ".join(
                    str(detail[key])
                    for key in ("reason", "exitCode", "message")
                    if detail.get(key) is not None
                )
                parts.append(f"container {container.get('name')} {kind} {words}".rstrip())
        lines.append(f"pod {pod['metadata']['name']} (rank {rank}): " + "; ".join(parts))
    return lines


def log_post_mortem(
    core: Any,
    namespace: str,
    name: str,
    pods: list[dict],
    reason: str,
    *,
    api: Callable[..., Any],
    log: Any,
    shown_events: set[str],
) -> None:
    """Before a TrainJob that did not end by itself is deleted: why, its pods' status and its events (the pods
    and, after an hour, the events are gone with it)."""
    log.error("TrainJob %s declared failed: %s", name, reason)
    lines = pod_status_lines(pods) or ["no node pods"]
    for line in lines:
        log.error("  %s", line)
    log_events(core, namespace, name, pods, api=api, log=log, shown_events=shown_events)


# Trainers restarted in place ---------------------------------------------------------------------------------

LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


@dataclasses.dataclass(frozen=True)
class Restart:
    """A node container that crashed and is (being) restarted in place.

    Attributes:
        pod: Pod name.
        rank: Its completion index ("?" when unlabelled).
        restarts: The container's restartCount.
        reason: The crash's termination reason (Error, OOMKilled, ...).
        exit_code: The crash's exit code (None when the kubelet did not report it).
    """

    pod: str
    rank: str
    restarts: int
    reason: str
    exit_code: int | None


def restarted_node_containers(pods: Iterable[Mapping[str, Any]]) -> list[Restart]:
    """The node containers that crashed and restart in place: a restartCount above 0, or a crash in `lastState`
    while the kubelet backs off (CrashLoopBackOff) before the first restart."""
    found = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != NODE:
                continue
            crash = (status.get("lastState") or {}).get("terminated") or {}
            restarts = status.get("restartCount") or 0
            if restarts or crash:
                found.append(
                    Restart(
                        pod=metadata.get("name", "?"),
                        rank=(metadata.get("labels") or {}).get(LABEL_COMPLETION_INDEX, "?"),
                        restarts=restarts,
                        reason=crash.get("reason") or "Error",
                        exit_code=crash.get("exitCode"),
                    )
                )
    return found


def restarting_message(runtime_ref: Mapping[str, Any], restarts: list[Restart]) -> str:
    """Why we stopped waiting, and the fix, naming the runtime."""
    kind = runtime_ref.get("kind") or "ClusterTrainingRuntime"
    most = max(restart.restarts for restart in restarts)
    return (
        f"the trainer crashed and Kubernetes restarts it in place (restartCount {most}); stopped after the first "
        f"crash instead of watching it repeat.\n{kind} {runtime_ref.get('name')!r} does not fail fast: JobSet "
        "defaults its node pods to restartPolicy OnFailure and the Job to backoffLimit 6, so a crash is retried up "
        "to 7 times and the pods (exit code, log) are deleted when the Job fails.\nFix: in the runtime's node "
        "replicated job set `restartPolicy: Never` on the pod template and `backoffLimit: 0` on the Job template "
        "(with a podFailurePolicy: Ignore on DisruptionTarget and on the node container's exit code 75, FailJob on "
        "its other non-zero exit codes), as runtimes/torchtune.yaml does; or use that runtime."
    )


def termination_summary(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per node container that ended with a non-zero exit code: pod, rank, reason, exit code, message."""
    lines = []
    for pod in pods:
        rank = (pod["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, "?")
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != NODE:
                continue
            terminated = (status.get("state") or {}).get("terminated") or (
                (status.get("lastState") or {}).get("terminated")
            )
            if terminated and terminated.get("exitCode", 0) != 0:
                detail = f"{terminated.get('reason') or 'Error'} (exit code {terminated.get('exitCode')})"
                if terminated.get("message"):
                    detail += f": {terminated['message'].strip()}"
                if terminated.get("exitCode") == OTHER_POD_STOPPING:
                    detail += (
                        f". It saved the checkpoint and stopped because another node's pod was stopping; the "
                        f"runtime's podFailurePolicy should Ignore exit code {OTHER_POD_STOPPING} on the node "
                        "container, as runtimes/torchtune.yaml does, so that the Job replaces it"
                    )
                lines.append(f"pod {pod['metadata']['name']} (rank {rank}): {detail}")
    return lines
