"""What happens when a node container exits non-zero: JobSet/Job defaults, the kubelet's restarts in place
(restartPolicy OnFailure), the Job controller's backoffLimit and podFailurePolicy, and the pods it deletes.

Upstream sources followed:
  * kubernetes-sigs/jobset v0.12 ``pkg/webhooks/jobset_webhook.go`` (Default): a replicated job's pod template
    without ``restartPolicy`` gets ``OnFailure``.
  * kubernetes ``pkg/apis/batch/v1/defaults.go`` (SetDefaults_Job): ``backoffLimit`` defaults to 6.
  * kubernetes ``pkg/controller/job/job_controller.go``: ``pastBackoffLimitOnFailure`` (OnFailure: the restart
    counts of the Job's Pending/Running pods reach ``backoffLimit``, or exceed it when it is 0), failed pods
    beyond ``backoffLimit`` (Never), reasons ``BackoffLimitExceeded`` / ``PodFailurePolicy``, a Warning event on
    the Job with the finished condition, and ``deleteActivePods`` once the Job failed.
  * kubernetes ``pkg/controller/job/pod_failure_policy.go`` (matchPodFailurePolicy): rules in order, the first
    match wins; ``onExitCodes`` (optional containerName, In/NotIn, exit code 0 never matches) and
    ``onPodConditions`` (type + status); FailJob's message names container, pod, exit code and rule index.
  * kubernetes ``pkg/kubelet/kuberuntime/kuberuntime_manager.go`` (doBackOff) and ``pkg/kubelet/kubelet.go``
    (MaxContainerBackOff): a crashed container waits in ``CrashLoopBackOff`` for 10s, doubling up to 300s, then
    runs again with ``restartCount`` + 1 and the crash in ``lastState.terminated``.
"""

from __future__ import annotations

import dataclasses

from ._common import utc_now

JOBSET_DEFAULT_RESTART_POLICY = "OnFailure"
JOB_DEFAULT_BACKOFF_LIMIT = 6
KUBELET_INITIAL_BACKOFF = 10.0  # seconds; Scenario.restart_backoff_scale scales these for tests
KUBELET_MAX_BACKOFF = 300.0
BACKOFF_LIMIT_EXCEEDED = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")


@dataclasses.dataclass(frozen=True)
class JobPolicy:
    """The ``node`` Job's failure handling after JobSet's and the Job API's defaults."""

    restart_policy: str
    backoff_limit: int
    pod_failure_rules: tuple[dict, ...]


def node_job_policy(replicated_job: dict) -> JobPolicy:
    """The policy of a runtime's replicated job (its ``template`` is a Job template)."""
    job_spec = replicated_job.get("template", {}).get("spec", {})
    pod_spec = job_spec.get("template", {}).get("spec", {})
    backoff = job_spec.get("backoffLimit")
    return JobPolicy(
        restart_policy=pod_spec.get("restartPolicy") or JOBSET_DEFAULT_RESTART_POLICY,
        backoff_limit=JOB_DEFAULT_BACKOFF_LIMIT if backoff is None else int(backoff),
        pod_failure_rules=tuple((job_spec.get("podFailurePolicy") or {}).get("rules") or ()),
    )


def restarts_exceed_limit(policy: JobPolicy, restart_count: int) -> bool:
    """pastBackoffLimitOnFailure: the sum of restart counts against ``backoffLimit``."""
    if policy.backoff_limit == 0:
        return restart_count > 0
    return restart_count >= policy.backoff_limit


def crash_loop_delay(restarts: int, scale: float) -> float:
    """The kubelet's back-off before restart number ``restarts`` (1-based), scaled by ``scale``."""
    return min(KUBELET_INITIAL_BACKOFF * 2 ** (restarts - 1), KUBELET_MAX_BACKOFF) * scale


def match_pod_failure_policy(policy: JobPolicy, pod: dict) -> tuple[str, str] | None:
    """``(action, message)`` of the first rule matching a failed pod, or None (default handling: count it)."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    status = pod.get("status") or {}
    for index, rule in enumerate(policy.pod_failure_rules):
        on_codes = rule.get("onExitCodes")
        if on_codes:
            for container in status.get("containerStatuses") or []:
                if on_codes.get("containerName") not in (None, container["name"]):
                    continue
                code = ((container.get("state") or {}).get("terminated") or {}).get("exitCode")
                if not code:  # running, or exit code 0: never matches
                    continue
                values = on_codes.get("values") or []
                if (code in values) == (on_codes.get("operator") == "In"):
                    message = (
                        f"Container {container['name']} for pod {namespace}/{name} failed with exit code {code} "
                        f"matching {rule['action']} rule at index {index}"
                    )
                    return rule["action"], message
        for pattern in rule.get("onPodConditions") or []:
            for condition in status.get("conditions") or []:
                if condition["type"] == pattern["type"] and condition["status"] == pattern.get(
                    "status", "True"
                ):
                    message = (
                        f"Pod {namespace}/{name} has condition {condition['type']} matching {rule['action']} "
                        f"rule at index {index}"
                    )
                    return rule["action"], message
    return None


def mark_crash_looping(pod: dict, exit_code: int, reason: str, delay: float) -> None:
    """The node container crashed and will be restarted (OnFailure): it waits in CrashLoopBackOff with the crash
    in ``lastState.terminated``; the pod stays Running."""
    now = utc_now()
    meta = pod["metadata"]
    for condition in pod["status"].get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="False", reason="ContainersNotReady")
    for status in pod["status"].get("containerStatuses", []):
        if status["name"] != "node":
            continue
        started = (status.get("state") or {}).get("running", {}).get("startedAt", now)
        status.update(ready=False, started=False)
        status["lastState"] = {
            "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now}
        }
        status["state"] = {
            "waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container=node "
                f"pod={meta['name']}_{meta['namespace']}({meta['uid']})",
            }
        }


def mark_restarted(pod: dict) -> None:
    """The kubelet started the node container again: running, ``restartCount`` + 1, ``lastState`` kept."""
    now = utc_now()
    for condition in pod["status"].get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="True", reason=None)
    for status in pod["status"].get("containerStatuses", []):
        if status["name"] == "node":
            status.update(ready=True, started=True, restartCount=status.get("restartCount", 0) + 1)
            status["state"] = {"running": {"startedAt": now}}


def restart_count(pod: dict) -> int:
    return sum(s.get("restartCount", 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])
