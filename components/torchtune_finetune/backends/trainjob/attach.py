"""Create the TrainJob, or attach to the one an earlier attempt of this run and task created.

The name is deterministic per KFP run + task, so a 409 means a KFP retry or a restarted step. If the existing
TrainJob carries our run/task labels we attach to it (a Failed one is replaced, since a retry is meant to train
again; one being deleted is waited for); anything else is someone else's and we stop with a clear error. The
runtime and the Kueue LocalQueue are checked first (permissions.py), and the step's pod becomes the TrainJob's
owner (owner.py) unless the cleanup policy is "never". A replaced or deleted TrainJob must be gone with its JobSet
and pods before the new one is created (gone.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff
from kfp_finetune.components.torchtune_finetune.backends.trainjob import gone
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.deletion import Deletion
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import TrainJobError, api_message
from kfp_finetune.components.torchtune_finetune.backends.trainjob.kueue import queue_of
from kfp_finetune.components.torchtune_finetune.backends.trainjob.network import (
    ANNOTATION_ALLOW_SLOW_NETWORK,
    gpus_per_node,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.owner import add_owner, step_pod_reference
from kfp_finetune.components.torchtune_finetune.backends.trainjob.permissions import (
    check_local_queue,
    check_runtime,
    require_ours,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import terminal_state


def create_or_attach(
    custom: Any,
    core: Any,
    manifest: dict,
    *,
    cleanup: str,
    api: Callable[..., Any],
    backoff: Backoff,
    on_retry: Callable[[BaseException, float], None],
    delete: Callable[..., Deletion],
    log: Any,
) -> bool:
    """True if we created the TrainJob, False if we attached to an existing one of ours.

    `manifest` has its namespace set; it gets the step pod's ownerReference. `delete(reason=...)` deletes the
    TrainJob (deletion.py), `api` calls the API with retries.
    """
    from kubernetes.client.exceptions import ApiException

    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]

    def wait_gone() -> None:
        """Until the TrainJob, its JobSet and its pods are gone: a new one must not inherit them."""
        if left := gone.wait_until_gone(custom, core, namespace, name, api=api, sleep=backoff.sleep, log=log):
            raise TrainJobError(f"TrainJob {namespace}/{name} was not deleted in time: {', '.join(left)}")

    check_runtime(
        custom,
        manifest["spec"]["runtimeRef"],
        namespace,
        backoff=backoff,
        on_retry=on_retry,
        log=log,
        nodes=int((manifest["spec"].get("trainer") or {}).get("numNodes") or 1),
        gpus=gpus_per_node(manifest),
        allow_slow_network=manifest["metadata"].get("annotations", {}).get(ANNOTATION_ALLOW_SLOW_NETWORK)
        == "true",
    )
    check_local_queue(
        custom.api_client, queue_of(manifest), namespace, backoff=backoff, on_retry=on_retry, log=log
    )
    # Under cleanup policy "never" the TrainJob is the user's to delete: no owner would take it with the pod.
    owner = None if cleanup == "never" else step_pod_reference(core, namespace, api=api, log=log)
    if owner is not None:
        manifest["metadata"]["ownerReferences"] = [owner]
    left = gone.leftovers(custom, core, namespace, name, api=api)
    if left and not left[0].startswith("TrainJob"):
        # An earlier attempt's TrainJob was deleted (a Background delete removes it at once) while its JobSet and
        # pods remain: the pods take their grace period to save and stop (300 s in our runtimes). A TrainJob
        # created now would inherit them, and two trainings would share the run folder.
        log.info(
            "TrainJob %s of this run and task was deleted, but %s remain: waiting for them to be gone, then "
            "creating",
            name,
            ", ".join(left),
        )
        wait_gone()
    for _ in range(2):  # a second round after replacing a failed TrainJob of ours
        try:
            api(custom.create_namespaced_custom_object, tj.GROUP, tj.VERSION, namespace, tj.PLURAL, manifest)
            log.info("created TrainJob %s/%s", namespace, name)
            return True
        except ApiException as error:
            if error.status != 409:
                raise TrainJobError(
                    f"creating TrainJob {namespace}/{name} failed: {api_message(error)}"
                ) from None
        existing = api(custom.get_namespaced_custom_object, tj.GROUP, tj.VERSION, namespace, tj.PLURAL, name)
        require_ours(manifest, existing)
        if existing["metadata"].get("deletionTimestamp"):
            # An earlier attempt's, being deleted (Foreground, or finalizers): attached, we would only see it go.
            log.info(
                "TrainJob %s of this run and task is being deleted: waiting for it to be gone, then creating",
                name,
            )
            wait_gone()
            continue
        if terminal_state(existing) != "Failed":
            if owner is not None:
                add_owner(custom, existing, owner, api=api, log=log)
            log.info(
                "TrainJob %s/%s already exists for this run and task: attaching to it instead of "
                "starting a second training",
                namespace,
                name,
            )
            return False
        log.info("TrainJob %s of this run and task failed before: replacing it", name)
        deletion = delete(reason="replacing a failed attempt")
        if not deletion.confirmed:
            raise TrainJobError(
                f"an earlier attempt's failed TrainJob {namespace}/{name} is in the way and "
                f"{deletion.words(namespace, name)}; run the step again once it is gone"
            )
        wait_gone()
    raise TrainJobError(f"TrainJob {namespace}/{name} keeps coming back; giving up")
