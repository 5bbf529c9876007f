"""A trainer that Kubernetes restarts instead of failing: notice it after the first crash and say how to fix the
runtime.

Unless a runtime sets `restartPolicy: Never` on its node pods and `backoffLimit: 0` on its Job, JobSet defaults
the pods to `restartPolicy: OnFailure` and the Job API defaults `backoffLimit` to 6: a crashed (or OOM-killed)
trainer restarts in place up to 7 times, and when the Job finally fails its pods are deleted with their exit codes
and logs. The kfp-finetune runtimes fail fast; for any other runtime the launcher stops at the first restart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

NODE = "node"
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
        "(with a podFailurePolicy: Ignore on DisruptionTarget, FailJob on the node container's non-zero exit "
        "codes), as runtimes/torchtune.yaml does; or use that runtime."
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
                lines.append(f"pod {pod['metadata']['name']} (rank {rank}): {detail}")
    return lines
