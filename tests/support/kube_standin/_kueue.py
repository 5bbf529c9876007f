"""Kueue's handling of TrainJobs: queued TrainJobs wait suspended until a test admits them, and may be preempted.

Upstream (kubernetes-sigs/kueue):
  * pkg/controller/jobs/trainjob/trainjob_webhook.go Default: a TrainJob labelled ``kueue.x-k8s.io/queue-name``
    (pkg/controller/constants QueueLabel) is suspended on create, and gets an empty ``runtimePatches`` entry of
    manager ``kueue.x-k8s.io/manager`` (where admission writes the flavors' node selectors). ValidateCreate
    (pkg/controller/jobframework/validation.go ValidateLabelAsCRDName): the queue name must be a DNS-1123
    subdomain, else the webhook denies the create.
  * pkg/controller/jobframework/reconciler.go ConstructWorkload + workload_names.go: one Workload per TrainJob,
    ``trainjob-<name>-<5 hex of sha1(kind, group, name, uid)>``, controlled by it (ownerReference), labelled
    ``kueue.x-k8s.io/job-uid=<uid>``, ``spec.queueName`` from the label, one podSet ``node`` of numNodes pods.
  * pkg/workload/workload.go: a Workload that cannot be admitted has QuotaReserved False (reason Pending, the
    scheduler's message: pkg/scheduler/scheduler.go, flavorassigner.go "couldn't assign flavors ..."), or reason
    Misconfigured "LocalQueue <name> doesn't exist" (pkg/controller/core/workload_controller.go); admitted, it has
    QuotaReserved True "Quota reserved in ClusterQueue <cq>" and Admitted True, and the TrainJob is unsuspended
    (trainjob_controller.go RunWithPodSetsInfo).
  * Preemption (pkg/scheduler/preemption/preemption.go, jobframework reconciler.go): Evicted True (reason
    Preempted) and Preempted True (reason InClusterQueue, "Preempted to accommodate a workload ... due to
    prioritization in the ClusterQueue"), QuotaReserved and Admitted False, and the TrainJob suspended again
    (trainjob_controller.go Stop); the Trainer then stops the JobSet, whose pods are deleted.

  * Priority (jobframework reconciler.go prepareWorkload, pkg/util/priority): ``spec.priority`` is the ``value`` of
    the WorkloadPriorityClass the ``kueue.x-k8s.io/priority-class`` label names, else 0.
  * The visibility API (pkg/visibility/server.go, an aggregated API server behind the APIServices
    ``v1beta2.visibility.kueue.x-k8s.io`` (Kueue v0.15 on) and ``v1beta1`` (v0.9 on)): ``GET /apis/visibility.kueue.
    x-k8s.io/<v>/namespaces/<ns>/localqueues/<name>/pendingworkloads?limit=&offset=`` answers a
    PendingWorkloadsSummary (apis/visibility/v1beta2/types.go; pkg/visibility/storage/pending_workloads_lq.go, utils.go
    newPendingWorkload, boundedLimitOffset: limit 1000 by default, at most 100000), a 404 ``localqueue.visibility...
    not found`` for a LocalQueue Kueue does not know. The positions count from 0 over the ClusterQueue's pending
    Workloads (no quota reserved, their LocalQueue pointing at it) in queue order (pkg/cache/queue/cluster_queue.go
    baseCompareFunc: higher ``spec.priority`` first, then the earlier queue-order timestamp, which is the
    creationTimestamp for the evictions simulated here (pkg/workload/workload.go GetQueueOrderTimestamp), then UID).
    Authorization is kube-apiserver's (_rbac.py: ``get`` on ``localqueues/pendingworkloads``). ``visibility(versions=
    ())``: no APIService, the path is unknown (apiserver pkg/util/notfoundhandler: plain-text ``404 page not found``);
    ``visibility(available=False)``: registered but Kueue's server unreachable (kube-aggregator handler_proxy.go:
    plain-text 503 ``service unavailable``).

Admission and preemption happen only when a test calls ``KubeStandin.admit`` / ``preempt`` (a real cluster admits
when quota frees up); a TrainJob no test admits waits for ever, as in a queue whose quota never frees. Deviations:
no fair sharing, StrictFIFO head blocking, sticky workloads or ClusterQueue objects (every LocalQueue's ClusterQueue
exists); a priority class that does not exist counts as 0 (Kueue would not make the Workload).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Callable
from typing import Any

from ._common import KUEUE_GROUP, KUEUE_VERSION, TRAINER_API_VERSION, ApiError
from ._store import Store
from ._workload import new_condition

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
RUNTIME_PATCH_MANAGER = "kueue.x-k8s.io/manager"
WEBHOOK_DENIED = 'admission webhook "vtrainjob.kb.io" denied the request: '
#: The scheduler's message while the ClusterQueue has no room (flavorassigner.go).
PENDING_MESSAGE = (
    "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor "
    "default-flavor, 1 more needed"
)
VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")  # what Kueue v0.15 and later serve
DEFAULT_PENDING_LIMIT, MAX_PENDING_LIMIT = 1000, 100_000  # pkg/constants
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def queue_of(job: dict) -> str:
    return (job.get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL, "")


def admit_queued_trainjob(body: dict) -> None:
    """Kueue's TrainJob webhooks on create: deny a queue name that is not a DNS-1123 subdomain, then suspend a
    queued TrainJob and add Kueue's runtime patch."""
    queue = queue_of(body)
    if not queue:
        return
    if len(queue) > 253 or not _DNS1123_SUBDOMAIN.match(queue):
        raise ApiError(
            403,
            f'{WEBHOOK_DENIED}metadata.labels[{QUEUE_LABEL}]: Invalid value: "{queue}": a lowercase RFC 1123 '
            "subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end "
            "with an alphanumeric character",
        )
    spec = body.setdefault("spec", {})
    spec["suspend"] = True
    patch = {"manager": RUNTIME_PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}}
    spec["runtimePatches"] = [*(spec.get("runtimePatches") or []), patch]


def workload_name(job: dict) -> str:
    meta = job["metadata"]
    digest = hashlib.sha1(
        f"TrainJob\ntrainer.kubeflow.org\n{meta['name']}\n{meta['uid']}".encode()
    ).hexdigest()
    return f"trainjob-{meta['name']}"[:247] + f"-{digest[:5]}"


class Kueue:
    """The Workloads of queued TrainJobs, and what admission and preemption do to both."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.visibility_versions: tuple[str, ...] = VISIBILITY_VERSIONS  # () : no APIService
        self.visibility_available = True

    def create_workload(self, job: dict) -> None:
        """The job reconciler makes the queued TrainJob's Workload, pending."""
        queue = queue_of(job)
        if not queue:
            return
        namespace = job["metadata"]["namespace"]
        labels = job["metadata"].get("labels") or {}
        priority_class = self.store.find(
            "workloadpriorityclasses", None, labels.get(PRIORITY_CLASS_LABEL, "")
        )
        workload = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {
                "name": workload_name(job),
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                # Made within the TrainJob's create (a seeded TrainJob's Workload: as if made with it).
                "creationTimestamp": job["metadata"]["creationTimestamp"],
                "generation": 1,
                "labels": {JOB_UID_LABEL: job["metadata"]["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": TRAINER_API_VERSION,
                        "kind": "TrainJob",
                        "name": job["metadata"]["name"],
                        "uid": job["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {
                "queueName": queue,
                "podSets": [
                    {"name": "node", "count": int((job["spec"].get("trainer") or {}).get("numNodes") or 1)}
                ],
                "priority": int((priority_class or {}).get("value") or 0),
                **(
                    {"priorityClassName": labels[PRIORITY_CLASS_LABEL]}
                    if PRIORITY_CLASS_LABEL in labels
                    else {}
                ),
            },
            "status": {"conditions": [self._pending(namespace, queue)]},
        }
        self.store.put("workloads", workload, "ADDED")

    def _pending(self, namespace: str, queue: str) -> dict:
        if self.store.find("localqueues", namespace, queue) is None:
            return new_condition(
                "QuotaReserved", "False", "Misconfigured", f"LocalQueue {queue} doesn't exist"
            )
        return new_condition("QuotaReserved", "False", "Pending", PENDING_MESSAGE)

    def admit(self, namespace: str, job_name: str) -> None:
        """Quota reserved and admitted: the TrainJob is unsuspended (and the Trainer starts it)."""
        workload, job = self._workload_and_job(namespace, job_name)
        queue = self.store.find("localqueues", namespace, workload["spec"]["queueName"]) or {}
        cluster_queue = (queue.get("spec") or {}).get("clusterQueue", "cluster-queue")

        def admitted(wl: dict) -> None:
            wl["status"]["admission"] = {
                "clusterQueue": cluster_queue,
                "podSetAssignments": [{"name": "node", "count": wl["spec"]["podSets"][0]["count"]}],
            }
            _set(
                wl,
                "QuotaReserved",
                "True",
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {cluster_queue}",
            )
            _set(wl, "Admitted", "True", "Admitted", "The workload is admitted")
            for type_ in ("Evicted", "Preempted"):  # workload.go resetActiveCondition
                _reset(wl, type_)

        with self.store.cond:
            self.store.update("workloads", namespace, workload["metadata"]["name"], admitted)
            self.store.update("trainjobs", namespace, job["metadata"]["name"], _suspend(False))

    def preempt(self, namespace: str, job_name: str) -> None:
        """Evicted to make room for a workload of higher priority: the TrainJob is suspended again."""
        workload, job = self._workload_and_job(namespace, job_name)
        message = (
            f"Preempted to accommodate a workload (UID: {uuid.uuid4()}, JobUID: {uuid.uuid4()}) due to "
            "prioritization in the ClusterQueue"
        )

        def evicted(wl: dict) -> None:
            wl["status"].pop("admission", None)
            _set(wl, "Evicted", "True", "Preempted", message)
            _set(wl, "Preempted", "True", "InClusterQueue", message)
            _set(wl, "QuotaReserved", "False", "Pending", "Preempted")
            _set(wl, "Admitted", "False", "NoReservation", "The workload has no reservation")

        with self.store.cond:
            self.store.update("workloads", namespace, workload["metadata"]["name"], evicted)
            self.store.update("trainjobs", namespace, job["metadata"]["name"], _suspend(True))

    def visibility(self, method: str, path: str, query: dict[str, str]) -> tuple[int, Any, Callable | None]:
        """A request under ``/apis/visibility.kueue.x-k8s.io/`` (authorized already): the pending Workloads of a
        LocalQueue, or what kube-apiserver answers when the API is missing or unreachable."""
        parts = [p for p in path.split("/") if p]
        if len(parts) < 3 or parts[2] not in self.visibility_versions:
            return 404, None, plain_text(404, "404 page not found")
        if not self.visibility_available:
            return 503, None, plain_text(503, "service unavailable")
        rest = parts[3:]
        if len(rest) != 5 or rest[0] != "namespaces" or rest[2:5:2] != ["localqueues", "pendingworkloads"]:
            raise ApiError(404, "the server could not find the requested resource", details={})
        if method != "GET":
            raise ApiError(405, "the server does not allow this method on the requested resource")
        namespace, name = rest[1], rest[3]
        try:
            limit, offset = int(query.get("limit") or 0), int(query.get("offset") or 0)
        except ValueError as error:
            raise ApiError(400, f"invalid query: {error}") from None
        limit = min(
            max(limit or DEFAULT_PENDING_LIMIT, 0), MAX_PENDING_LIMIT
        )  # defaults.go, boundedLimitOffset
        offset = max(offset, 0)
        with self.store.cond:
            local_queue = self.store.find("localqueues", namespace, name)
            if local_queue is None:
                raise ApiError(
                    404,
                    f'localqueue.{VISIBILITY_GROUP} "{name}" not found',
                    details={"name": name, "group": VISIBILITY_GROUP, "kind": "localqueue"},
                )
            pending = self._pending_in(local_queue["spec"]["clusterQueue"])
        items = []
        in_local_queue = [
            (index, wl)
            for index, wl in enumerate(pending)
            if (wl["metadata"]["namespace"], wl["spec"]["queueName"]) == (namespace, name)
        ]
        for position, (index, wl) in enumerate(in_local_queue[offset : offset + limit], start=offset):
            meta = wl["metadata"]
            owners = [
                {k: ref[k] for k in ("apiVersion", "kind", "name", "uid")}
                for ref in meta.get("ownerReferences") or []
            ]
            items.append(
                {
                    "metadata": {
                        "name": meta["name"],
                        "namespace": meta["namespace"],
                        "creationTimestamp": meta["creationTimestamp"],
                        **({"ownerReferences": owners} if owners else {}),  # omitempty
                    },
                    "priority": wl["spec"].get("priority", 0),
                    "localQueueName": wl["spec"]["queueName"],
                    "positionInClusterQueue": index,
                    "positionInLocalQueue": position,
                }
            )
        summary = {
            "kind": "PendingWorkloadsSummary",
            "apiVersion": f"{VISIBILITY_GROUP}/{parts[2]}",
            "metadata": {"creationTimestamp": None},
            "items": items,
        }
        return 200, summary, None

    def _pending_in(self, cluster_queue: str) -> list[dict]:
        """The ClusterQueue's Workloads without reserved quota whose LocalQueue points at it, in queue order."""
        queues = {
            (q["metadata"]["namespace"], q["metadata"]["name"]): (q.get("spec") or {}).get("clusterQueue")
            for q in self.store.list_objects("localqueues", None)
        }
        pending = [
            wl
            for wl in self.store.list_objects("workloads", None)
            if queues.get((wl["metadata"]["namespace"], wl["spec"]["queueName"])) == cluster_queue
            and not any(
                c["type"] == "QuotaReserved" and c["status"] == "True"
                for c in wl["status"].get("conditions", [])
            )
        ]
        # baseCompareFunc: priority (higher first), the queue-order timestamp, then UID. RFC 3339 in UTC at
        # second granularity sorts as text.
        return sorted(
            pending,
            key=lambda wl: (
                -wl["spec"].get("priority", 0),
                wl["metadata"]["creationTimestamp"],
                wl["metadata"]["uid"],
            ),
        )

    def _workload_and_job(self, namespace: str, job_name: str) -> tuple[dict, dict]:
        job = self.store.find("trainjobs", namespace, job_name)
        if job is None:
            raise KeyError(f"no TrainJob {namespace}/{job_name}")
        workload = self.store.find("workloads", namespace, workload_name(job))
        if workload is None:
            raise KeyError(f"TrainJob {namespace}/{job_name} is in no Kueue queue")
        return workload, job


def _set(workload: dict, type_: str, status: str, reason: str, message: str) -> None:
    """apimachinery meta.SetStatusCondition: lastTransitionTime changes only with the status."""
    conditions = workload["status"].setdefault("conditions", [])
    new = new_condition(type_, status, reason, message)
    for index, old in enumerate(conditions):
        if old["type"] == type_:
            if old["status"] == status:
                new["lastTransitionTime"] = old["lastTransitionTime"]
            conditions[index] = new
            return
    conditions.append(new)


def _reset(workload: dict, type_: str) -> None:
    old = next((c for c in workload["status"].get("conditions", []) if c["type"] == type_), None)
    if old and old["status"] == "True":
        _set(workload, type_, "False", "QuotaReserved", f"Previously: {old['message']}")


def _suspend(suspend: bool):
    def mutate(job: dict) -> None:
        job["spec"]["suspend"] = suspend
        job["metadata"]["generation"] = job["metadata"].get("generation", 1) + 1

    return mutate


def plain_text(status: int, text: str) -> Callable:
    """Go's http.Error: a text/plain body (what kube-apiserver's not-found handler and the aggregator's proxy write,
    where the API group's own handlers would write a Status)."""

    def write(handler: Any) -> None:
        data = f"{text}\n".encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("X-Content-Type-Options", "nosniff")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return write


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict:
    """A LocalQueue as ``kubectl apply`` would make it, pointing at ``cluster_queue``."""
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }
