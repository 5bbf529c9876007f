"""The TrainJob is owned by the step's pod, so that deleting the pod deletes the TrainJob.

When the step's pod object is deleted (evicted through the eviction API, its node lost and the pod garbage-collected,
its workflow deleted), the garbage collector deletes the TrainJob, and with it the JobSet and the node pods
(kubernetes pkg/controller/garbagecollector: a dependent is deleted once all its owners are gone). This complements
the lease (lease.py), which covers a step whose process dies while its pod object stays.

- The pod is found by name: `KFP_POD_NAME` (KFP sets it from the downward API in every step), else `HOSTNAME` in a
  pod (a pod's hostname is its name unless its spec sets one), read in the TrainJob's namespace for its uid.
- ownerReferences are namespace-local: a TrainJob created in another namespace than the step's pod cannot be owned by
  it (the collector would treat the owner as absent and delete the TrainJob at once), so none is set and the step
  log says so; the lease still stops that TrainJob if the step is killed.
- No `controller` and no `blockOwnerDeletion`: nothing else manages the TrainJob through this reference, and
  blockOwnerDeletion would need `update` on pods/finalizers (OwnerReferencesPermissionEnforcement).
- Not under cleanup policy "never": such a TrainJob is the user's to delete.
- A KFP retry attaching to the TrainJob adds its own pod as a second owner (merge PATCH with the resourceVersion as a
  precondition), so deleting the killed attempt's pod does not delete the training the retry now follows.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from kfp_finetune.components._shared.kube.watch import raw_json
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import api_message
from kfp_finetune.components.torchtune_finetune.backends.trainjob.placement import POD_NAME_ENV

PATCH_ATTEMPTS = 3  # another writer (the Trainer) may change the TrainJob between our read and our patch


def step_pod_name() -> str | None:
    """The step's own pod name: KFP's downward-API variable, else the hostname inside a pod; None elsewhere."""
    if os.environ.get(POD_NAME_ENV):
        return os.environ[POD_NAME_ENV]
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return os.environ.get("HOSTNAME") or None
    return None


def step_pod_reference(core: Any, namespace: str, *, api: Callable[..., Any], log: Any) -> dict | None:
    """An ownerReference to the step's pod for a TrainJob in `namespace`, or None (see the module docstring)."""
    from kubernetes.client.exceptions import ApiException

    name = step_pod_name()
    if name is None:
        return None
    try:
        pod = api(raw_json(core.read_namespaced_pod), name, namespace)
    except ApiException as error:
        if error.status not in (403, 404):
            raise
        why = (
            f"this step's pod {name} is not in namespace {namespace}, where the TrainJob goes, and owner references "
            "cannot cross namespaces"
            if error.status == 404
            else f"this step's pod {name} cannot be read ({api_message(error)})"
        )
        log.info(
            "%s: the TrainJob is not owned by the step's pod (the lease still stops it if the step dies)", why
        )
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"]}


def add_owner(
    custom: Any, existing: Mapping[str, Any], owner: Mapping[str, Any], *, api: Callable[..., Any], log: Any
) -> None:
    """Make `owner` (this attempt's pod) an owner of the TrainJob `existing` too, unless it is one already."""
    from kubernetes.client.exceptions import ApiException

    meta = existing["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for _ in range(PATCH_ATTEMPTS):
        references = meta.get("ownerReferences") or []
        if any(r.get("uid") == owner["uid"] for r in references):
            return
        patch = {
            "metadata": {
                "ownerReferences": [*references, dict(owner)],
                "resourceVersion": meta["resourceVersion"],
            }
        }
        try:
            api(
                custom.patch_namespaced_custom_object, tj.GROUP, tj.VERSION, namespace, tj.PLURAL, name, patch
            )
            log.info("this step's pod %s now owns TrainJob %s too", owner["name"], name)
            return
        except ApiException as error:
            if error.status != 409:
                log.warning(
                    "could not make this step's pod %s an owner of TrainJob %s (%s): if the earlier attempt's pod is "
                    "deleted, the garbage collector deletes the TrainJob this step follows",
                    owner["name"],
                    name,
                    api_message(error),
                )
                return
        meta = api(custom.get_namespaced_custom_object, tj.GROUP, tj.VERSION, namespace, tj.PLURAL, name)[
            "metadata"
        ]
    log.warning(
        "could not make this step's pod %s an owner of TrainJob %s: it kept changing", owner["name"], name
    )
