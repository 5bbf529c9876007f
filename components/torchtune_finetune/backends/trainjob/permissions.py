"""What the launcher checks before it creates or touches anything: the runtime exists, the Kueue LocalQueue
exists, a TrainJob is ours.

The step's ServiceAccount may lack `get` on (cluster) training runtimes or LocalQueues (runtimes/rbac.yaml grants
both, a tighter Role may not): a 403 there is no reason to stop, since creating the TrainJob is the real test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kfp_finetune.components._shared.kube.client import (
    Backoff,
    local_queue_exists,
    missing_local_queue,
    read_training_runtime,
)
from kfp_finetune.components._shared.stop_request import HOOK_COMMAND
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import (
    TrainJobConflict,
    TrainJobError,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.network import check_network

#: Kubernetes' terminationGracePeriodSeconds when a pod sets none.
DEFAULT_GRACE_SECONDS = 30


def check_runtime(
    custom: Any,
    runtime_ref: Mapping[str, Any],
    namespace: str,
    *,
    backoff: Backoff,
    on_retry: Callable[[BaseException, float], None],
    log: Any,
    nodes: int = 1,
    gpus: int = 0,
    allow_slow_network: bool = False,
) -> None:
    """Raise TrainJobError naming the fix when the TrainJob's (Cluster)TrainingRuntime does not exist, or when
    `nodes` > 1 with `gpus` each would train over a slow network on it (network.py) and that is not allowed.

    Args:
        custom: A `kubernetes.client.CustomObjectsApi`.
        runtime_ref: The TrainJob's `spec.runtimeRef`.
        namespace: The TrainJob's namespace (where a namespaced TrainingRuntime must be).
        backoff, on_retry: The launcher's retry settings (`kube.call_with_retry`).
        log: Where to say that the runtime could not be read.
    """
    kind = runtime_ref.get("kind") or tj.CLUSTER_RUNTIME_KIND
    name = runtime_ref["name"]
    exists, runtime = read_training_runtime(
        custom.api_client, name, kind, namespace, backoff=backoff, on_retry=on_retry
    )
    if exists is False:
        where = "" if kind == tj.CLUSTER_RUNTIME_KIND else f" in namespace {namespace}"
        raise TrainJobError(
            f"{kind} {name!r} not found{where}: install the kfp-finetune runtimes with "
            "`kubectl apply -k runtimes/` or pick an existing runtime"
        )
    if exists is None:
        log.info("cannot read %s %r (forbidden); creating the TrainJob anyway", kind, name)
    else:
        check_network(runtime, kind, name, nodes, gpus, allowed=allow_slow_network, log=log)
        note_missing_stop_hook(runtime, kind, name, log)


def note_missing_stop_hook(runtime: Mapping[str, Any], kind: str, name: str, log: Any) -> None:
    """Say so when the runtime's node pods lack our preStop hook (_shared/stop_request.py), or a grace period longer
    than Kubernetes' default 30 s to use it in: a stopping pod then saves its checkpoint on SIGTERM only, which
    torchrun follows with a SIGKILL 30 s later."""
    jobs = (((runtime.get("spec") or {}).get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    pods = [
        (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        for job in jobs
    ]
    nodes = [(pod, c) for pod in pods for c in pod.get("containers") or [] if c.get("name") == tj.NODE]
    if not nodes:
        return
    pod, container = nodes[0]
    hook = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
    grace = pod.get("terminationGracePeriodSeconds") or DEFAULT_GRACE_SECONDS
    if hook != list(HOOK_COMMAND):
        missing = "no preStop hook asking the training to save (runtimes/*.yaml have one)"
    elif grace <= DEFAULT_GRACE_SECONDS:
        missing = f"a grace period of {grace} s for its preStop hook (runtimes/*.yaml give 300 s)"
    else:
        return
    log.info(
        "%s %r has %s: a preempted or drained pod saves its checkpoint on SIGTERM only, within torchrun's 30 s "
        "before it kills the workers",
        kind,
        name,
        missing,
    )


def check_local_queue(
    api_client: Any,
    queue_name: str,
    namespace: str,
    *,
    backoff: Backoff,
    on_retry: Callable[[BaseException, float], None],
    log: Any,
) -> None:
    """Raise TrainJobError naming the fix when the TrainJob's Kueue LocalQueue does not exist ("": no queue): a
    TrainJob in a missing queue would wait for ever (Kueue's Workload only says "LocalQueue ... doesn't exist")."""
    if not queue_name:
        return
    exists = local_queue_exists(api_client, queue_name, namespace, backoff=backoff, on_retry=on_retry)
    if exists is False:
        raise TrainJobError(
            f"tune_queue_name: {missing_local_queue(queue_name, namespace)}; nothing was created"
        )
    if exists is None:
        log.info("cannot read LocalQueue %r (forbidden); creating the TrainJob in it anyway", queue_name)


def require_ours(manifest: Mapping[str, Any], existing: Mapping[str, Any]) -> None:
    """Raise TrainJobConflict unless `existing` carries the KFP run/task labels of the `manifest` we would send."""
    wanted = manifest["metadata"].get("labels") or {}
    have = (existing.get("metadata") or {}).get("labels") or {}
    keys = (tj.LABEL_RUN_ID, tj.LABEL_TASK)
    if not all(k in wanted for k in keys) or any(have.get(k) != wanted[k] for k in keys):
        owner = ", ".join(f"{k}={have.get(k, '<unset>')}" for k in keys)
        where = f"{manifest['metadata']['namespace']}/{manifest['metadata']['name']}"
        raise TrainJobConflict(
            f"TrainJob {where} already exists and does not belong to this pipeline "
            f"run/task ({owner}); not touching it. Delete it or choose another name."
        )
