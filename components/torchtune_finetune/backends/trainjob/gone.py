"""Wait until a deleted TrainJob is gone together with what it owned, before one of the same name is created.

Deletion is asynchronous on a cluster: a Background DELETE removes the TrainJob at once (the Trainer puts no
finalizer on it), the garbage collector deletes its JobSet later, and the pods terminate within their grace period
(30 s by default, 300 s in our runtimes). The Trainer finds a TrainJob's JobSet by the TrainJob's name and leaves an
existing one alone (kubeflow/trainer v2.3 pkg/runtime/framework/plugins/jobset: Build returns nothing for an
existing, unsuspended JobSet; Status copies its conditions). A TrainJob re-created while the old JobSet is still there would inherit it:
the old Failed condition, the old (terminating) pods. So the replacement waits for all three to answer 404 / none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
# The pods' grace period (300 s in our runtimes: time to save a checkpoint) plus garbage-collector latency, with room.
WAIT_TIMEOUT = 480.0


def leftovers(custom: Any, core: Any, namespace: str, name: str, *, api: Callable[..., Any]) -> list[str]:
    """What of TrainJob `name` still exists: "TrainJob", "JobSet", "N pod(s)" (terminating ones included)."""
    from kubernetes.client.exceptions import ApiException

    left = []
    for label, group, version, plural in (
        ("TrainJob", "trainer.kubeflow.org", "v1alpha1", "trainjobs"),
        ("JobSet", JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL),
    ):
        try:
            api(custom.get_namespaced_custom_object, group, version, namespace, plural, name)
            left.append(f"{label} {name}")
        except ApiException as error:
            if error.status != 404:
                raise
    pods = api(core.list_namespaced_pod, namespace, label_selector=f"{LABEL_JOBSET}={name}").items
    if pods:
        left.append(f"{len(pods)} pod(s) of JobSet {name}")
    return left


def wait_until_gone(
    custom: Any,
    core: Any,
    namespace: str,
    name: str,
    *,
    api: Callable[..., Any],
    sleep: Callable[[float], None],
    log: Any,
    timeout: float = WAIT_TIMEOUT,
) -> list[str]:
    """Poll until nothing of TrainJob `name` is left; returns what is still left when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    delays = Backoff(initial=0.2, maximum=5.0, attempts=1_000_000).delays()
    shown: list[str] = []
    while left := leftovers(custom, core, namespace, name, api=api):
        if time.monotonic() > deadline:
            return left
        if left != shown:
            log.info("waiting for the old TrainJob to be gone: %s", ", ".join(left))
            shown = left
        sleep(next(delays))
    return []
