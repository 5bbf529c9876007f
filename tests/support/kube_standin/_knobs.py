"""What a test turns on a running stand-in: the scenario each TrainJob plays, execute mode, Kueue's queues
(admission, preemption), and the faults of a real cluster (API errors, dropped and expired watches, lagging
watches, images and nodes that appear, held garbage collection, deleted pods, cut log streams).

A mixin of :class:`~.standin.KubeStandin`, kept apart so that the facade's own file holds its lifecycle, objects
and request log; every knob acts under the store's lock on the parts the facade owns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._apiserver import ApiServer, Fault
from ._container import ExecuteConfig
from ._controller import Controller
from ._devices import GpuPool
from ._startup import normalize_image
from ._store import Store
from ._types import Scenario


class ScenarioAndFaultKnobs:
    """The scenario and fault methods of :class:`~.standin.KubeStandin` (see the module docstring)."""

    namespace: str
    _store: Store
    _controller: Controller
    _api: ApiServer

    def scenario(self, job: str | None, scenario: Scenario | None = None, **knobs: Any) -> Scenario:
        """Register the scenario for TrainJob ``job`` (None: the default for all jobs). Knobs build a Scenario.

        With both ``scenario`` and knobs, the knobs replace those fields of ``scenario``. Takes effect for jobs
        the controller starts afterwards.
        """
        chosen = dataclasses.replace(scenario or Scenario(), **knobs)
        with self._store.cond:
            self._controller.scenarios[job] = chosen
        return chosen

    def execute(
        self,
        volume_dirs: Mapping[str, str | Path] | None = None,
        *,
        extra_env: Mapping[str, str] | None = None,
        job: str | None = None,
        gpus: Sequence[int] = (),
    ) -> None:
        """Run TrainJobs' node commands as local subprocesses, one per node rank (``job``: only that one).

        The command is the runtime's ``node`` container ``command``/``args`` with the TrainJob's
        ``trainer.command``/``trainer.args`` replacing them when set; env is the container env + ``trainer.env`` +
        ``PET_NNODES``/``PET_NPROC_PER_NODE``/``PET_NODE_RANK``/``PET_MASTER_ADDR=127.0.0.1``/``PET_MASTER_PORT``
        (a free local port per job) + ``extra_env``, over the test process's environment. ``$(VAR)`` references
        are expanded as the kubelet does; ``fieldRef`` env (name, namespace, labels, annotations, podIP) is
        resolved, secret/configMap references are not. Volumes: ``volume_dirs`` maps a pod volume *name* or a PVC
        *claimName* to a local directory; every ``mountPath`` of a mapped volume in the node container (joined with
        its ``subPath``) is rewritten to that directory wherever it appears as a path prefix in command, args, env
        values and workingDir. Unmapped volumes are ignored. The working directory is the rewritten
        ``workingDir`` or else the test process's. Exit code 0 → pod Succeeded, else Failed with the exit code on
        the container (signals as 128+N); the TrainJob becomes Complete / Failed accordingly.

        Applies to TrainJobs the controller starts afterwards; a per-job registration wins over the global one.
        The job's scenario still decides the pending phase (``pending_seconds``, ``stay_pending``,
        ``pending_events``); its log lines and outcome are replaced by the real processes'.
        ``Scenario(execute=True)`` alone executes with no volume mapping.

        GPUs: ``gpus`` (host GPU indices, this registration's pool) are handed out as the NVIDIA device plugin does
        (_devices.py): a node pod whose ``node`` container limits ``nvidia.com/gpu: N`` runs with N distinct free
        ones as CUDA_VISIBLE_DEVICES, given back when its process ends; one asking for more than are free cannot
        start (its log says why, the pod fails). Empty: CUDA_VISIBLE_DEVICES is left as the test process has it.

        Each pod's container has a temp folder of its own (``TMPDIR``), as each container has its own /tmp; its
        ``preStop`` exec hook runs there too, with the container's environment, when the pod is stopped gracefully
        (``Scenario.preempt_on_line``, _execute.py).
        """
        config = ExecuteConfig(
            {key: str(Path(value).resolve()) for key, value in (volume_dirs or {}).items()},
            dict(extra_env or {}),
            GpuPool(list(gpus)),
            str(self.kubeconfig_path.parent / "pods"),  # removed with the stand-in
        )
        with self._store.cond:
            self._controller.execute_configs[job] = config

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 503,
        method: str | None = None,
        path_contains: str | None = None,
        retry_after: int | None = None,
        committed: bool = False,
    ) -> None:
        """The next ``count`` matching requests get a ``kind: Status`` error (500/503/429/504 …) and no effect.

        ``committed``: only writes (POST, DELETE) match, and each takes effect before the error is answered, as
        when the apiserver's request timeout answers 504 "may still be processing the request" while the handler
        goes on (staging/src/k8s.io/apiserver/pkg/server/filters/timeout.go) or etcd commits a write whose
        response is lost. A client that retries then meets the write's result (409 on create, 404 on delete)."""
        with self._store.cond:
            self._api.faults.append(
                Fault(count, status, method and method.upper(), path_contains, retry_after, committed)
            )

    def push_image(self, reference: str) -> None:
        """The image appears in the registry: pods waiting in ``ImagePullBackOff`` for it start (the kubelet retries
        the pull at its next pod sync)."""
        with self._store.cond:
            self._store.registry.add(normalize_image(reference))
            self._store.cond.notify_all()

    def free_node(self) -> None:
        """A node with room appears (an autoscaler added one, another workload ended): unschedulable pods are
        scheduled and go on to start, as kube-scheduler retries them on node and pod-delete events."""
        with self._store.cond:
            self._store.freed_nodes += 1
            self._store.cond.notify_all()

    def clear_faults(self) -> None:
        """Forget the faults ``fail_next`` injected that have not been used up."""
        with self._store.cond:
            self._api.faults.clear()

    def drop_watch_after(self, events: int, *, times: int = 1, abrupt: bool = False) -> None:
        """The next ``times`` watch connections are closed by the server after ``events`` events.

        By default the stream ends cleanly (as when the server's watch timeout expires); ``abrupt`` cuts the
        connection mid-stream instead (the client sees a protocol error).
        """
        with self._store.cond:
            self._api.watch_drops.extend([(events, abrupt)] * times)

    def expire_next_watch(self, *, times: int = 1, as_http_error: bool = False) -> None:
        """The next ``times`` watches with a resourceVersion get 410 "too old resource version".

        By default as the real server does for watches: HTTP 200 with one ``ERROR`` event carrying a
        ``Status`` (code 410, reason ``Expired``); ``as_http_error`` answers HTTP 410 (reason ``Gone``) instead.
        """
        with self._store.cond:
            self._api.watch_expiries.extend([as_http_error] * times)

    def delay_watch_events(self, plural: str, seconds: float) -> None:
        """Watches of ``plural`` (e.g. ``"pods"``) deliver each event ``seconds`` after it happened, in order, while
        lists answer at once: the apiserver's watch cache trails etcd (apiserver pkg/storage/cacher: events reach
        watchers through the cache and each watcher's buffer), and a client's informer trails its watch, so a
        watch-fed view can lag what a fresh list returns. Applies to watches open now and later."""
        with self._store.cond:
            self._api.watch_delays[plural] = seconds
            self._store.cond.notify_all()

    def send_bookmarks(self) -> None:
        """Every open watch that was asked with ``allowWatchBookmarks=true`` sends a BOOKMARK event now: an object of
        the watched kind with only ``metadata.resourceVersion`` (the newest, also past events its selectors filter
        out). The stand-in also sends them on its own as the watch cache does: every minute, and 2s before a
        watch's ``timeoutSeconds`` ends."""
        self._store.request_bookmarks()

    def compact_history(self) -> str:
        """Compact the watch history at the current resourceVersion (returned): from now on a watch from an older
        resourceVersion gets an ``ERROR`` event with a 410 ``Expired`` Status ("too old resource version"), as when
        etcd compacts or the watch cache's window moves on; watches already open are not affected."""
        return str(self._store.compact())

    def hold_garbage_collection(self) -> None:
        """From now on a TrainJob DELETE only removes the TrainJob (or, Foreground, marks it deleting); its JobSet
        and pods go step by step at :meth:`collect_garbage` (_gc.py names the upstream behaviour)."""
        with self._store.cond:
            self._api.gc.held = True

    def collect_garbage(self) -> str | None:
        """Run the next pending deletion step (JobSet deleted + pods terminating; pods removed; a Foreground owner
        removed). Returns what it did, or None when nothing was pending."""
        return self._api.gc.collect()

    def delete_pod(self, name: str, namespace: str | None = None) -> None:
        """The pod is deleted and gone (evicted, its node lost and PodGC done, or its workflow deleted); then the
        garbage collector deletes the TrainJobs it owned alone (_owners.py, at once unless collection is held)."""
        namespace = namespace or self.namespace
        with self._store.cond:
            pod = self._store.find("pods", namespace, name)
            if pod is None:
                raise KeyError(f"no pod {namespace}/{name}")
            self._store.put("pods", pod, "DELETED")
        self._api.gc.delete_orphans(namespace, self._controller.cancel)

    def end_log_streams(self) -> None:
        """End every open ``follow`` log stream cleanly while the containers run on, as when the kubelet or
        the API server's proxy connection goes away (kube-apiserver pkg/registry/core/pod/rest/log.go streams
        from the kubelet; a restarted kubelet ends the response). Clients must reconnect."""
        with self._store.cond:
            self._store.log_cuts += 1
            self._store.cond.notify_all()

    def admit(self, job: str, namespace: str | None = None) -> None:
        """Kueue admits the queued TrainJob ``job`` (_kueue.py): its Workload gets QuotaReserved and Admitted, the
        TrainJob is unsuspended and the Trainer starts it (activeDeadlineSeconds counts from now)."""
        self._api.kueue.admit(namespace or self.namespace, job)

    def kueue_visibility(
        self, *, versions: tuple[str, ...] = ("v1beta2", "v1beta1"), available: bool = True
    ) -> None:
        """Kueue's visibility API (pending positions, _kueue.py) as a cluster serves it: ``versions`` the
        APIServices registered (default Kueue v0.15 and later; ``("v1beta1",)`` v0.9 to v0.14; ``()`` none: the
        path answers kube-apiserver's plain 404), ``available=False`` registered but Kueue's server unreachable
        (the aggregator's plain 503)."""
        with self._store.cond:
            self._api.kueue.visibility_versions = tuple(versions)
            self._api.kueue.visibility_available = available

    def preempt(self, job: str, namespace: str | None = None) -> None:
        """Kueue preempts the admitted TrainJob ``job``: its Workload is Evicted (Preempted), the TrainJob is
        suspended again and its node pods are deleted; it waits in its queue until :meth:`admit`."""
        self._api.kueue.preempt(namespace or self.namespace, job)
