"""Where the TrainJob's node pods may run, given the access modes of the PVCs they mount.

The fine-tune step's pod keeps the run workspace mounted while its TrainJob trains. A ReadWriteMany claim can be
mounted from any node. A ReadWriteOnce claim attaches to one node at a time: a node pod scheduled elsewhere hangs
in ContainerCreating ("Multi-Attach error") until the timeout, so a single-node TrainJob is pinned to the step's
own node, and a multi-node one is refused before it is created. A ReadWriteOncePod claim admits one pod in all,
so the step and a node pod can never share it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.kube.client import call_with_retry
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import NodePodSettings

log = get_logger(__name__)

#: The KFP executor pod's own name: KFP's compilers set it from the downward API (metadata.name) in every step.
POD_NAME_ENV = "KFP_POD_NAME"
SHARED_MODES = ("ReadWriteMany", "ReadOnlyMany")
ONE_POD_MODE = "ReadWriteOncePod"
SHARED_WORKSPACE_HINT = (
    "use a ReadWriteMany storage class for the workspace (compile with KFP_FINETUNE_WORKSPACE_ACCESS_MODE="
    "ReadWriteMany and KFP_FINETUNE_WORKSPACE_STORAGE_CLASS=<an RWX class>, see docs/cluster-install.md)"
)


def claim_access_modes(core: Any, namespace: str, claim: str) -> list[str] | None:
    """The claim's access modes (as bound, else as requested); None when we may not read PVCs."""
    from kubernetes.client.exceptions import ApiException

    try:
        pvc = call_with_retry(core.read_namespaced_persistent_volume_claim, claim, namespace)
    except ApiException as error:
        if error.status == 404:
            raise ConfigError(
                f"the TrainJob mounts PVC {claim!r}, which does not exist in namespace {namespace!r}: its node "
                "pods would wait for it forever. PVCs are namespaced: the TrainJob runs in the KFP run's own "
                "namespace, so name a claim there (tune_workspace_pvc), or let KFP provide the run workspace"
            ) from error
        if error.status == 403:
            log.warning(
                "cannot read PVC %s (403): its access mode is not checked; grant the step's service account "
                "`get` on persistentvolumeclaims (runtimes/rbac.yaml)",
                claim,
            )
            return None
        raise
    return list((pvc.status and pvc.status.access_modes) or pvc.spec.access_modes or [])


def own_node_name(core: Any, namespace: str) -> str | None:
    """The node this step's pod runs on; None outside a KFP pod."""
    from kubernetes.client.exceptions import ApiException

    pod_name = os.environ.get(POD_NAME_ENV)
    if not pod_name:
        return None
    try:
        pod = call_with_retry(core.read_namespaced_pod, pod_name, namespace)
    except ApiException as error:
        if error.status in (403, 404):
            return None
        raise
    return pod.spec.node_name or None


def require_node(affinity: dict[str, Any] | None, node_name: str) -> dict[str, Any]:
    """`affinity` with every required node-selector term also requiring `node_name` (terms are ORed, so the
    field goes into each of them)."""
    affinity = copy.deepcopy(affinity or {})
    required = affinity.setdefault("nodeAffinity", {}).setdefault(
        "requiredDuringSchedulingIgnoredDuringExecution", {}
    )
    on_node = {"key": "metadata.name", "operator": "In", "values": [node_name]}
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*term.get("matchFields", []), on_node]}
        for term in required.get("nodeSelectorTerms") or [{}]
    ]
    return affinity


def place_node_pods(
    pod: NodePodSettings, *, api_client: Any, namespace: str, num_nodes: int
) -> NodePodSettings:
    """`pod` as it must be for its PVCs: unchanged, or pinned to this step's node; ConfigError when no
    placement can work."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    single_node_claims = []
    for volume in pod.volumes:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        modes = claim_access_modes(core, namespace, claim) if claim else None
        if not modes or any(mode in SHARED_MODES for mode in modes):
            continue
        if modes == [ONE_POD_MODE]:
            raise ConfigError(
                f"PVC {claim!r} is ReadWriteOncePod: this step already mounts it, so no TrainJob pod can; "
                f"{SHARED_WORKSPACE_HINT}"
            )
        single_node_claims.append(claim)
    if not single_node_claims:
        return pod
    claims = ", ".join(repr(claim) for claim in single_node_claims)
    if num_nodes > 1:
        raise ConfigError(
            f"tune_num_nodes={num_nodes} needs a workspace every node can mount, but PVC {claims} is ReadWriteOnce "
            f"(one node at a time): {SHARED_WORKSPACE_HINT}, or train with tune_num_nodes=1"
        )
    node = own_node_name(core, namespace)
    if node is None:
        log.warning(
            "PVC %s is ReadWriteOnce and this step's node is unknown (%s unset or its pod unreadable): the "
            "TrainJob's pod starts only if it is scheduled onto the node that has the volume attached",
            claims,
            POD_NAME_ENV,
        )
        return pod
    log.info("PVC %s is ReadWriteOnce: the TrainJob's node pod runs on this step's node %s", claims, node)
    if pod.gpus:
        log.info(
            "the node pod needs %d GPU(s) on %s: if it stays Pending, give the fine-tune task the GPU nodes' node "
            "selector and tolerations (they apply to this step too), or use a ReadWriteMany workspace",
            pod.gpus,
            node,
        )
    return dataclasses.replace(pod, affinity=require_node(pod.affinity, node))
