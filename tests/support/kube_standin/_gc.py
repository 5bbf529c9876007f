"""Deletion as a cluster does it: the TrainJob goes (or shows a deletionTimestamp), its JobSet and pods later.

- kube-apiserver staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go (Delete): an object with
  no finalizers is removed at once; ``propagationPolicy: Foreground`` adds the ``foregroundDeletion`` finalizer and
  sets ``deletionTimestamp`` instead, and the object stays readable until the garbage collector removes it.
  The Trainer v2.3 puts no finalizer on a TrainJob, so a Background DELETE removes it at once.
- kube-controller-manager pkg/controller/garbagecollector: dependents are deleted afterwards, in the background:
  the JobSet (ownerReference to the TrainJob, named after it) and through its Jobs the pods.
- pkg/registry/core/pod/strategy.go (CheckGracefulDelete): a pod DELETE is graceful: ``deletionTimestamp`` =
  now + ``deletionGracePeriodSeconds`` (``spec.terminationGracePeriodSeconds``, default 30); the pod stays (Running,
  terminating) until the kubelet has stopped its containers and removes it.

By default every step runs within the DELETE request (a known kindness, see the package docstring). After
``KubeStandin.hold_garbage_collection()`` the steps wait for ``collect_garbage()``, so a test can look at, and
act in, each state in between.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from ._owners import orphans
from ._store import Store
from ._workload import mark_deleting

DEFAULT_TERMINATION_GRACE_SECONDS = 30


class GarbageCollector:
    """Pending deletion steps of TrainJobs' dependents, run at once or one by one when held."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.held = False
        self._steps: collections.deque[tuple[str, Callable[[], None]]] = collections.deque()
        self._lock = threading.RLock()

    def delete_trainjob(self, job: dict, policy: str) -> dict:
        """What DELETE answers (the object as deleted, or as now terminating) and the steps that follow."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        store = self.store
        with store.cond:
            if policy == "Foreground":
                answer = store.update("trainjobs", namespace, name, mark_deleting) or job
            else:
                answer = store.put("trainjobs", job, "DELETED")
            steps: list[tuple[str, Callable[[], None]]] = []
            if policy != "Orphan":
                steps += [
                    (
                        f"JobSet {name} deleted, its pods terminating",
                        lambda: self._delete_jobset(namespace, name, job["metadata"].get("uid")),
                    ),
                    (f"pods of {name} terminated and removed", lambda: self._remove_pods(namespace, name)),
                ]
            if policy == "Foreground":  # the owner goes once its dependents are gone
                steps.append((f"TrainJob {name} removed", lambda: self._remove("trainjobs", namespace, name)))
            with self._lock:
                self._steps.extend(steps)
            if not self.held:
                self.collect_all()
            return answer

    def delete_orphans(self, namespace: str, cancel: Callable[[str, str], None]) -> None:
        """Delete (Background) every TrainJob of ``namespace`` whose owners are all gone (_owners.py); a step of its
        own while collection is held."""
        for job in orphans(self.store, namespace):
            name = job["metadata"]["name"]

            def delete(job: dict = job, name: str = name) -> None:
                if (current := self.store.find("trainjobs", namespace, name)) is None:
                    return
                if current["metadata"].get("uid") == job["metadata"]["uid"]:
                    cancel(namespace, name)
                    self.delete_trainjob(current, "Background")

            if self.held:
                with self._lock:
                    self._steps.append((f"TrainJob {name} deleted: its owners are gone", delete))
            else:
                delete()

    def collect(self) -> str | None:
        """Run the next pending step; its description, or None when nothing is pending."""
        with self.store.cond, self._lock:
            if not self._steps:
                return None
            description, step = self._steps.popleft()
            step()
            self.store.cond.notify_all()
            return description

    def collect_all(self) -> list[str]:
        done = []
        while (description := self.collect()) is not None:
            done.append(description)
        return done

    def _remove(self, plural: str, namespace: str, name: str) -> None:
        found = self.store.find(plural, namespace, name)
        if found is not None:
            self.store.put(plural, found, "DELETED")

    def _delete_jobset(self, namespace: str, name: str, uid: str | None) -> None:
        """The TrainJob's dependents: its JobSet (whose pods start terminating) and its Kueue Workload."""
        self._remove("jobsets", namespace, name)
        for workload in self.store.list_objects("workloads", namespace):
            if any(r.get("uid") == uid for r in workload["metadata"].get("ownerReferences") or []):
                self.store.put("workloads", workload, "DELETED")
        for pod in self.store.job_pods(namespace, name):
            if not pod["metadata"].get("deletionTimestamp"):
                self.store.update("pods", namespace, pod["metadata"]["name"], mark_terminating)

    def _remove_pods(self, namespace: str, name: str) -> None:
        for pod in self.store.job_pods(namespace, name):
            self.store.put("pods", pod, "DELETED")


def mark_terminating(pod: dict) -> None:
    """A graceful pod delete: deletionTimestamp at the end of the grace period; the pod runs on until then."""
    grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_SECONDS)
    at = datetime.now(timezone.utc) + timedelta(seconds=grace)
    pod["metadata"]["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
    pod["metadata"]["deletionGracePeriodSeconds"] = grace
