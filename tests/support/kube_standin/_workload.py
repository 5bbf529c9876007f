"""What JobSet, the Job controller and the kubelet make of a TrainJob: pod templates, pods and pod states (execute
mode's local node containers: _container.py)."""

from __future__ import annotations

import copy
import secrets
import uuid
from collections.abc import Mapping
from typing import Any

from ._common import COMPLETION_INDEX_ANNOTATION, JOBSET_NAME_LABEL, MASTER_PORT, TUNE_ENTRYPOINT, utc_now
from ._jobpolicy import JOBSET_DEFAULT_RESTART_POLICY, node_job_policy
from ._types import Scenario


def merge_patch(base: Any, patch: Any) -> Any:
    """Strategic-merge-like: dicts merge, lists of keyed dicts merge by key (``mountPath`` for volume mounts,
    else ``name``), anything else is replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = merge_patch(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    items = base + patch if isinstance(base, list) and isinstance(patch, list) else []
    merge_key = next((k for k in ("mountPath", "name") if items and all(k in i for i in items)), None)
    if merge_key and all(isinstance(i, dict) for i in items):
        merged_list = list(base)
        for item in patch:
            index = next((i for i, old in enumerate(merged_list) if old[merge_key] == item[merge_key]), None)
            if index is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[index] = merge_patch(merged_list[index], item)
        return merged_list
    return copy.deepcopy(patch)


def merge_resources(runtime: Mapping[str, Any], per_node: Mapping[str, Any]) -> dict:
    """trainer.resourcesPerNode merged into the runtime's `node` container resources, key by key: a strategic
    merge patch on the limits/requests maps (kubeflow/trainer v2.3.0 pkg/runtime/core/trainingruntime.go calls
    pkg/util/trainingruntime MergeResourceRequirements), so runtime keys the TrainJob does not name are kept."""
    merged = copy.deepcopy(dict(runtime))
    for key, values in per_node.items():
        if isinstance(values, Mapping):
            merged[key] = {**(merged.get(key) or {}), **copy.deepcopy(dict(values))}
        else:
            merged[key] = copy.deepcopy(values)
    return merged


def upsert_env(env: list[dict], additions: list[dict]) -> list[dict]:
    """``env`` with ``additions`` replacing same-named entries, as the Trainer's apply.UpsertEnvVars."""
    result = [e for e in env if e["name"] not in {a["name"] for a in additions}]
    return result + copy.deepcopy(additions)


def expand_kube_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion as the kubelet does: ``$$`` escapes, unknown references stay verbatim."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def new_condition(type_: str, status: str, reason: str | None, message: str | None) -> dict:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": utc_now(),
        "observedGeneration": 1,
    }


def condition_true(obj: dict, type_: str) -> bool:
    return any(
        c["type"] == type_ and c["status"] == "True" for c in obj.get("status", {}).get("conditions", [])
    )


def has_terminal_condition(obj: dict) -> bool:
    return condition_true(obj, "Complete") or condition_true(obj, "Failed")


def build_jobs_status(runtime: dict, **counts: int) -> list[dict]:
    """One entry per replicated job; only ``node`` is simulated, the others (initializers) count as succeeded."""
    statuses = []
    for replicated in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        entry = {
            "name": replicated["name"],
            "active": 0,
            "ready": 0,
            "succeeded": 0,
            "failed": 0,
            "suspended": 0,
        }
        entry.update(counts if replicated is node_replicated_job(runtime) else {"succeeded": 1})
        statuses.append(entry)
    return statuses


def mark_running(pod: dict) -> None:
    """Scheduled, started and ready, as the kubelet reports it."""
    now = utc_now()
    pod["spec"].setdefault("nodeName", "standin-node-0")
    pod["status"] = {
        "phase": "Running",
        "startTime": now,
        "hostIP": "127.0.0.1",
        "podIP": "127.0.0.1",
        "qosClass": pod["status"].get("qosClass", "BestEffort"),
        "conditions": [
            {"type": t, "status": "True", "lastTransitionTime": now}
            for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": now}},
            }
            for c in pod["spec"].get("containers", [])
        ],
    }


def mark_terminated(pod: dict, exit_code: int, reason: str) -> None:
    """The container ended (``reason``: Completed, Error, OOMKilled); the phase follows the exit code."""
    now = utc_now()
    pod["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
    for condition in pod["status"].get("conditions", []):
        if condition["type"] in ("Ready", "ContainersReady"):
            condition.update(status="False", reason="PodCompleted" if exit_code == 0 else "PodFailed")
    for status in pod["status"].get("containerStatuses", []):
        started = status.get("state", {}).get("running", {}).get("startedAt", now)
        status.update(ready=False, started=False)
        status["state"] = {
            "terminated": {"exitCode": exit_code, "reason": reason, "startedAt": started, "finishedAt": now}
        }


def new_jobset(job: dict) -> dict:
    """The JobSet the Trainer creates for a TrainJob: same name, owned by it (a controller reference)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": utc_now(),
            "labels": dict(job["metadata"].get("labels") or {}),
            "ownerReferences": [
                {
                    "apiVersion": job["apiVersion"],
                    "kind": "TrainJob",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 1}]},
        "status": {"conditions": []},
    }


def jobset_finished(jobset: dict, condition: dict) -> None:
    """The JobSet's own terminal condition (``Completed`` / ``Failed``), which the Trainer copies."""
    type_ = "Completed" if condition["type"] == "Complete" else condition["type"]
    jobset.setdefault("status", {})["conditions"] = [{**condition, "type": type_}]


def mark_deleting(job: dict) -> None:
    """What a Foreground deletion shows on the owner while its dependents are being removed."""
    job["metadata"]["deletionTimestamp"] = utc_now()
    job["metadata"]["finalizers"] = ["foregroundDeletion"]


ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"


def is_trainer_job(replicated_job: dict) -> bool:
    """Whether a replicated job is the trainer's: the Trainer v2.3 finds it by the ancestor label, not by its name
    (pkg/runtime/core/trainingruntime.go: numNodes applies to the job labelled ``trainjob-ancestor-step:
    trainer``; the torch plugin's FindContainerByPodSetAncestorContainerName(AncestorTrainer, "node") takes the
    ``node`` container of that pod set for trainer.image/command/args/env/resourcesPerNode and PET_*)."""
    labels = (replicated_job.get("template", {}).get("metadata") or {}).get("labels") or {}
    return labels.get(ANCESTOR_LABEL) == ANCESTOR_TRAINER


def node_replicated_job(runtime: dict) -> dict:
    """The replicated job the stand-in runs pods for: the trainer's (by the ancestor label), else one named
    ``node``, else the first (a runtime without a trainer job: the TrainJob's trainer settings apply nowhere)."""
    replicated_jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return next(
        (r for r in replicated_jobs if is_trainer_job(r)),
        next((r for r in replicated_jobs if r["name"] == "node"), replicated_jobs[0]),
    )


def node_pod_template(job: dict, runtime: dict) -> tuple[dict, int, str]:
    """The ``node`` pod template after runtimePatches and the TrainJob's ``trainer`` (the Trainer's job builder),
    with JobSet's webhook default ``restartPolicy: OnFailure`` when the runtime sets none."""
    replicated = node_replicated_job(runtime)
    template = copy.deepcopy(replicated["template"]["spec"]["template"])
    template.setdefault("spec", {}).setdefault("restartPolicy", node_job_policy(replicated).restart_policy)
    template.setdefault("metadata", {}).setdefault("labels", {}).update(
        replicated["template"].get("metadata", {}).get("labels") or {}
    )
    for patch in job["spec"].get("runtimePatches", []):
        for patched in (
            (patch.get("trainingRuntimeSpec") or {})
            .get("template", {})
            .get("spec", {})
            .get("replicatedJobs", [])
        ):
            if patched["name"] == replicated["name"]:
                template = merge_patch(
                    template, patched.get("template", {}).get("spec", {}).get("template", {})
                )
    trainer = (job["spec"].get("trainer") or {}) if is_trainer_job(replicated) else {}
    policy = runtime["spec"].get("mlPolicy", {})
    num_nodes = trainer.get("numNodes") or policy.get("numNodes") or 1
    if not is_trainer_job(replicated):  # mlPolicy.numNodes counts the trainer's pods only; else the Job's own
        num_nodes = replicated["template"].get("spec", {}).get("parallelism") or 1
    nproc = str(trainer.get("numProcPerNode") or policy.get("torch", {}).get("numProcPerNode") or "auto")
    containers = template.setdefault("spec", {}).setdefault("containers", [])
    node = next((c for c in containers if c["name"] == "node"), None)
    if node is not None and is_trainer_job(replicated):
        for key in ("image", "command", "args"):
            if trainer.get(key):
                node[key] = copy.deepcopy(trainer[key])
        if trainer.get("resourcesPerNode"):
            node["resources"] = merge_resources(node.get("resources") or {}, trainer["resourcesPerNode"])
        node["env"] = upsert_env(node.get("env", []), trainer.get("env", []))
        if "torch" in policy and trainer.get("command") != TUNE_ENTRYPOINT:
            name = job["metadata"]["name"]
            node["env"] = upsert_env(
                node["env"],
                [
                    {"name": "PET_NNODES", "value": str(num_nodes)},
                    {"name": "PET_NPROC_PER_NODE", "value": nproc},
                    {
                        "name": "PET_NODE_RANK",
                        "valueFrom": {
                            "fieldRef": {
                                "apiVersion": "v1",
                                "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']",
                            }
                        },
                    },
                    {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
                    {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)},
                ],
            )
        if not any(p.get("containerPort") == MASTER_PORT for p in node.get("ports", [])):
            node.setdefault("ports", []).append({"containerPort": MASTER_PORT, "protocol": "TCP"})
    return template, int(num_nodes), nproc


def new_pod(
    job: dict, template: dict, rank: int, scenario: Scenario, blocked: tuple[dict, list[dict]] | None
) -> dict:
    """Pod ``rank`` of the ``node`` replicated job, Pending, as JobSet + the Job controller + the scheduler make it
    (``blocked``: the node container's waiting state when the kubelet cannot start it, _startup.py)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    pod_name = f"{name}-node-0-{rank}-{secrets.token_hex(3)[:5]}"
    spec = copy.deepcopy(template.get("spec", {}))
    labels = {
        **(template.get("metadata", {}).get("labels") or {}),
        JOBSET_NAME_LABEL: name,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "1",
        "jobset.sigs.k8s.io/job-index": "0",
        "jobset.sigs.k8s.io/job-key": secrets.token_hex(20),
        COMPLETION_INDEX_ANNOTATION: str(rank),
        "batch.kubernetes.io/job-name": f"{name}-node-0",
        "job-name": f"{name}-node-0",
    }
    annotations = {
        **(template.get("metadata", {}).get("annotations") or {}),
        COMPLETION_INDEX_ANNOTATION: str(rank),
        JOBSET_NAME_LABEL: name,
        "jobset.sigs.k8s.io/replicatedjob-name": "node",
    }
    spec.update(
        hostname=f"{name}-node-0-{rank}",
        subdomain=name,
        restartPolicy=spec.get("restartPolicy") or JOBSET_DEFAULT_RESTART_POLICY,
    )
    unschedulable = unschedulable_event(scenario)
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": utc_now()}
    if unschedulable:
        scheduled.update(status="False", reason="Unschedulable", message=unschedulable["message"])
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name,
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "creationTimestamp": utc_now(),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": f"{name}-node-0",
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_OID, f"{job['metadata']['uid']}/node-0")),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [scheduled],
            "qosClass": "BestEffort",
        },
    }
    if not unschedulable:
        mark_scheduled(pod, rank, scenario, blocked)
    return pod


def unschedulable_event(scenario: Scenario) -> dict | None:
    """The scenario's ``FailedScheduling`` event: its pods wait for a node (``KubeStandin.free_node``)."""
    return next((e for e in scenario.pending_events if e.get("reason") == "FailedScheduling"), None)


def mark_scheduled(pod: dict, rank: int, scenario: Scenario, blocked: tuple[dict, list[dict]] | None) -> None:
    """Bound to a node, its containers waiting (``blocked``: the kubelet cannot start the node container)."""
    spec = pod["spec"]
    spec["nodeName"] = required_node(spec) or f"standin-node-{rank}"
    for condition in pod["status"]["conditions"]:
        if condition["type"] == "PodScheduled":
            condition.clear()
            condition.update(type="PodScheduled", status="True", lastTransitionTime=utc_now())
    waiting = {"reason": scenario.waiting_reason or "ContainerCreating"}
    if scenario.waiting_message:
        waiting["message"] = scenario.waiting_message
    pod["status"]["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {"waiting": blocked[0] if blocked and c.get("name") == "node" else waiting},
        }
        for c in spec.get("containers", [])
    ]


def mark_unschedulable(pod: dict, message: str) -> None:
    """Not bound to any node: PodScheduled False (Unschedulable), no container statuses."""
    pod["spec"].pop("nodeName", None)
    pod["status"] = {
        "phase": "Pending",
        "qosClass": pod["status"].get("qosClass", "BestEffort"),
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": utc_now(),
            }
        ],
    }


def required_node(spec: dict) -> str | None:
    """The node a required node affinity pins the pod to (``matchFields`` on ``metadata.name``), as the
    scheduler would place it; other node-selector terms are not simulated."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in required.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and field.get("values"):
                return field["values"][0]
    return None


def claim_names(pod: dict) -> set[str]:
    return {
        volume["persistentVolumeClaim"]["claimName"]
        for volume in pod["spec"].get("volumes") or []
        if volume.get("persistentVolumeClaim")
    }


def multi_attach_error(pod: dict, claims: Mapping[str, dict], other_pods: list[dict]) -> str | None:
    """The attach/detach controller's error when a ReadWriteOnce claim of ``pod`` is in use on another node.

    ``claims``: PVC objects by name; ``other_pods``: the namespace's other pods. The volume is attached where a
    running pod uses it (a pod stuck before its containers start holds no attachment).
    """
    for claim in sorted(claim_names(pod)):
        pvc = claims.get(claim)
        modes = ((pvc or {}).get("status") or {}).get("accessModes") or ((pvc or {}).get("spec") or {}).get(
            "accessModes"
        )
        if modes != ["ReadWriteOnce"]:
            continue
        users = [
            other["metadata"]["name"]
            for other in other_pods
            if claim in claim_names(other)
            and other["spec"].get("nodeName") not in (None, pod["spec"].get("nodeName"))
            and (other.get("status") or {}).get("phase") == "Running"
        ]
        if users:
            volume = (pvc.get("spec") or {}).get("volumeName") or f"pvc-{pvc['metadata']['uid']}"
            return f'Multi-Attach error for volume "{volume}" Volume is already used by pod(s) {", ".join(users)}'
    return None
