"""The stand-in's state: objects, their watch history and pod logs, guarded by one condition variable."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import secrets
import threading
import time
import uuid
from collections.abc import Callable

from ._common import (
    GROUP_VERSIONS,
    JOBSET_NAME_LABEL,
    KINDS,
    PLURAL_OF_KIND,
    TRAINER_API_VERSION,
    Route,
    not_found,
    parse_field_selector,
    parse_label_selector,
    utc_now,
)


@dataclasses.dataclass
class WatchEvent:
    rv: int
    plural: str
    namespace: str | None
    type: str
    obj: dict
    at: float = dataclasses.field(default_factory=time.monotonic)  # when it happened (watch delivery delays)


class Store:
    """Objects keyed by (plural, namespace, name), every change as a watch event, and pod logs.

    Every method takes ``cond`` (re-entrant); ``cond`` is notified on any change, so watchers, log followers and
    waiting tests can block on it. Objects handed out are deep copies unless a method says otherwise.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.RLock())
        self.objects: dict[tuple[str, str | None, str], dict] = {}
        self.history: list[WatchEvent] = []
        self.logs: dict[tuple[str, str], list[tuple[float, str]]] = {}
        self.previous_logs: dict[
            tuple[str, str], list[tuple[float, str]]
        ] = {}  # the container before a restart
        self.current_rv = 999
        self.compacted_rv = 0  # watches from an older resourceVersion get 410 Expired
        self.bookmark_requests = 0  # bumped by a test: watches that allow bookmarks send one
        self.stopping = False
        self.log_cuts = 0  # bumped by KubeStandin.end_log_streams: open log streams end
        self.registry: set[str] = set()  # normalized image references the kubelet can pull
        self.freed_nodes = 0  # bumped by KubeStandin.free_node: unschedulable pods get a node
        self._rv = itertools.count(self.current_rv + 1)  # one global, increasing resourceVersion

    def put(self, plural: str, obj: dict, event_type: str) -> dict:
        """Store (or, for DELETED, remove) ``obj`` under a new resourceVersion and record the watch event."""
        with self.cond:
            rv = next(self._rv)
            self.current_rv = rv
            meta = obj["metadata"]
            meta["resourceVersion"] = str(rv)
            key = (plural, meta.get("namespace"), meta["name"])
            if event_type == "DELETED":
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj
            self.history.append(WatchEvent(rv, plural, meta.get("namespace"), event_type, copy.deepcopy(obj)))
            self.cond.notify_all()
            return obj

    def compact(self) -> int:
        """Forget the watch history up to now (etcd compaction, the watch cache's window moving on): a watch from an
        older resourceVersion gets 410 Expired. The events stay for watches already open, which never miss one.
        Returns the compacted resourceVersion."""
        with self.cond:
            self.compacted_rv = self.current_rv
            return self.compacted_rv

    def request_bookmarks(self) -> None:
        """Every open watch that allows bookmarks sends a BOOKMARK with the newest resourceVersion now."""
        with self.cond:
            self.bookmark_requests += 1
            self.cond.notify_all()

    def update(self, plural: str, namespace: str, name: str, mutate: Callable[[dict], None]) -> dict | None:
        """Apply ``mutate`` to a copy of the object and store it as MODIFIED; None if it is gone."""
        with self.cond:
            obj = self.objects.get((plural, namespace, name))
            if obj is None:
                return None
            obj = copy.deepcopy(obj)
            mutate(obj)
            return self.put(plural, obj, "MODIFIED")

    def find(self, plural: str, namespace: str | None, name: str) -> dict | None:
        """A copy of the object, or None."""
        with self.cond:
            return copy.deepcopy(self.objects.get((plural, namespace, name)))

    def get(self, route: Route) -> dict:
        """A copy of the object the route names, or a 404."""
        obj = self.find(route.plural, route.namespace, route.name or "")
        if obj is None:
            raise not_found(route.plural, route.name or "")
        return obj

    def list_objects(self, plural: str, namespace: str | None) -> list[dict]:
        with self.cond:
            return [
                copy.deepcopy(obj)
                for (p, ns, _), obj in sorted(self.objects.items())
                if p == plural and (namespace is None or ns == namespace)
            ]

    def selector(self, route: Route, query: dict[str, str]) -> Callable[[str, str | None, dict], bool]:
        """Matches (plural, namespace, object) against the route and the label/field selectors of the query."""
        labels = parse_label_selector(query.get("labelSelector", ""))
        fields = parse_field_selector(query.get("fieldSelector", ""), route.plural)
        return lambda plural, namespace, obj: (
            plural == route.plural
            and (route.namespace is None or namespace == route.namespace)
            and labels(obj)
            and fields(obj)
        )

    def list_response(self, route: Route, query: dict[str, str]) -> dict:
        """A ``<Kind>List`` as the API server returns it."""
        selected = self.selector(route, query)
        with self.cond:
            items = [copy.deepcopy(o) for (p, ns, _), o in sorted(self.objects.items()) if selected(p, ns, o)]
            rv = self.current_rv
        group, kind, _ = KINDS[route.plural]
        return {
            "apiVersion": f"{group}/{GROUP_VERSIONS[group]}" if group else "v1",
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    def job_pods(self, namespace: str, job: str) -> list[dict]:
        """Copies of the pods of TrainJob ``job``."""
        return [
            p
            for p in self.list_objects("pods", namespace)
            if (p["metadata"].get("labels") or {}).get(JOBSET_NAME_LABEL) == job
        ]

    def runtime_of(self, job: dict) -> dict | None:
        """The (Cluster)TrainingRuntime the TrainJob refers to (runtimeRef kind defaults to the cluster one)."""
        ref = job["spec"]["runtimeRef"]
        if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime":
            return self.find("clustertrainingruntimes", None, ref["name"])
        return self.find("trainingruntimes", job["metadata"]["namespace"], ref["name"])

    def record_event(
        self, namespace: str, kind: str, name: str, reason: str, message: str, type_: str = "Warning"
    ) -> dict:
        """Store a core/v1 Event about object ``kind``/``name``, as its controller (or kubelet, scheduler) would."""
        involved = self.find(PLURAL_OF_KIND.get(kind, ""), namespace, name) or {}
        component = {"TrainJob": "trainjob-controller", "Pod": "kubelet"}.get(
            kind, f"{kind.lower()}-controller"
        )
        if reason in ("FailedScheduling", "Scheduled", "Preempted"):
            component = "default-scheduler"
        now = utc_now()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{name}.{secrets.token_hex(8)}",
                "namespace": namespace,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now,
            },
            "involvedObject": {
                "apiVersion": {"TrainJob": TRAINER_API_VERSION, "Job": "batch/v1"}.get(kind, "v1"),
                "kind": kind,
                "name": name,
                "namespace": namespace,
                "uid": involved.get("metadata", {}).get("uid", ""),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": component},
            "reportingComponent": component,
        }
        return copy.deepcopy(self.put("events", event, "ADDED"))

    def append_log(self, namespace: str, pod: str, line: str) -> None:
        with self.cond:
            self.logs.setdefault((namespace, pod), []).append((time.time(), line))
            self.cond.notify_all()

    def restart_log(self, namespace: str, pod: str) -> None:
        """The node container starts again: its log so far becomes the ``previous=true`` log."""
        with self.cond:
            self.previous_logs[(namespace, pod)] = self.logs.pop((namespace, pod), [])
            self.cond.notify_all()

    def log_entries(self, namespace: str, pod: str, *, previous: bool = False) -> list[tuple[float, str]]:
        """(time, line) pairs the pod's current (or previous) node container has logged so far."""
        with self.cond:
            return list((self.previous_logs if previous else self.logs).get((namespace, pod), []))
