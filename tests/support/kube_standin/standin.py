"""The stand-in's public face: :class:`KubeStandin` (its scenario and fault methods are in ``_knobs``)."""

from __future__ import annotations

import copy
import http.server
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from ._apiserver import ApiServer
from ._common import COMPLETION_INDEX_ANNOTATION, KINDS, PLURAL_OF_KIND, TRAINER_API_VERSION, utc_now
from ._controller import Controller
from ._knobs import ScenarioAndFaultKnobs
from ._kueue import local_queue
from ._rbac import Authorization, RbacAuthorizer
from ._schema import default_crd_dir, load_schemas
from ._startup import DEFAULT_IMAGES, normalize_image
from ._store import Store
from ._typed_schema import typed_model_validators
from ._types import RecordedRequest, Scenario
from ._workload import condition_true, has_terminal_condition

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
CLEANUP_POLICY_ANNOTATION = (
    "kfp-finetune.io/cleanup-policy"  # the launcher's: "never" keeps a TrainJob on purpose
)


class KubeStandin(ScenarioAndFaultKnobs):
    """An in-process Kubernetes API server on 127.0.0.1 with a simulated Trainer/JobSet controller.

    Args:
        namespace: The namespace written into the kubeconfig context (objects may live in any namespace).
        token: Bearer token required on every request (401 without it).
        crd_dir: Directory of the Trainer CRDs to validate against; default :func:`default_crd_dir`. Without
            one, TrainJobs are validated with the ``kubeflow-trainer-api`` typed models (_typed_schema.py).
        default_scenario: Scenario for TrainJobs without their own (default: ``Scenario()`` = quick success).
        images: The image references its registry holds (default ``_startup.DEFAULT_IMAGES``): a node container
            with any other image waits in ``ImagePullBackOff`` until :meth:`push_image` adds it.

    Use as a context manager (or call :meth:`start` / :meth:`stop`).
    """

    def __init__(
        self,
        namespace: str = "default",
        *,
        token: str = "standin-token",
        crd_dir: str | Path | None = None,
        default_scenario: Scenario | None = None,
        images: tuple[str, ...] = DEFAULT_IMAGES,
    ) -> None:
        self.namespace = namespace
        self.token = token
        crd_dir = Path(crd_dir) if crd_dir else default_crd_dir()
        schemas = load_schemas(crd_dir.resolve()) if crd_dir else typed_model_validators()
        self._store = Store()
        self._store.registry = {normalize_image(image) for image in images}
        self._controller = Controller(self._store, default_scenario or Scenario())
        self._api = ApiServer(self._store, self._controller, schemas, token)
        self._controller.preempt_workload = self._api.kueue.preempt
        self._server: http.server.ThreadingHTTPServer | None = None
        self._tmpdir: Path | None = None

    # Lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> KubeStandin:
        """Start serving; writes the kubeconfig. Returns self."""
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._api.handler_class())
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="kube-standin",
            daemon=True,
        ).start()
        self._tmpdir = Path(tempfile.mkdtemp(prefix="kube-standin-"))
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
            "users": [{"name": "standin", "user": {"token": self.token}}],
            "contexts": [
                {
                    "name": "standin",
                    "context": {"cluster": "standin", "user": "standin", "namespace": self.namespace},
                }
            ],
            "current-context": "standin",
        }
        (self._tmpdir / "kubeconfig").write_text(yaml.safe_dump(config))
        return self

    def stop(self) -> None:
        """Stop the server, controller threads and any subprocesses started in execute mode."""
        with self._store.cond:
            self._store.stopping = True  # ends watch and log streams, and the controller's waits
            self._store.cond.notify_all()
        self._controller.stop()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def __enter__(self) -> KubeStandin:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:38211``."""
        assert self._server, "KubeStandin is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def kubeconfig_path(self) -> Path:
        """A kubeconfig file (server, bearer token, context namespace) for ``kubernetes.config``."""
        assert self._tmpdir, "KubeStandin is not started"
        return self._tmpdir / "kubeconfig"

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` loaded from :attr:`kubeconfig_path` (convenience)."""
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig_path))

    # Objects ---------------------------------------------------------------------------------------------------

    def add_object(self, obj: Mapping[str, Any], *, scenario: Scenario | None = None) -> dict:
        """Seed an object as if it already existed (no admission webhooks, no request log entry).

        Kinds: ``TrainingRuntime``, ``ClusterTrainingRuntime``, ``TrainJob``, ``Pod``, ``Event``,
        ``PersistentVolumeClaim`` (node pods mounting a ReadWriteOnce claim that a running pod on another node
        uses never start: ``FailedAttachVolume`` / Multi-Attach, as on a cluster), ``Secret`` (as ``kubectl create
        secret`` makes it: node containers whose env needs it and waited in ``CreateContainerConfigError`` start). A
        TrainJob is checked and defaulted against its CRD schema or typed model (ValueError if invalid). A seeded
        TrainJob (the retry/attach case) is driven by the controller with ``scenario`` (or its registered/default scenario) unless it already
        has a terminal condition; its ``activeDeadlineSeconds`` counts from its ``creationTimestamp``. Namespaced
        objects without a namespace get the stand-in's namespace. Returns the stored object (with
        resourceVersion, uid, creationTimestamp).
        """
        obj = copy.deepcopy(dict(obj))
        plural = PLURAL_OF_KIND.get(obj.get("kind", ""))
        if plural is None:
            raise ValueError(f"cannot seed kind {obj.get('kind')!r}; known: {sorted(PLURAL_OF_KIND)}")
        meta = obj.setdefault("metadata", {})
        if KINDS[plural][2]:
            meta.setdefault("namespace", self.namespace)
        else:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", utc_now())
        meta.setdefault("generation", 1)
        if plural == "trainjobs" and (errors := self._api.schemas["trainjobs"].validate(obj)):
            raise ValueError(f"invalid TrainJob {meta.get('name')}: {errors}")
        if plural == "trainjobs" and scenario is not None:
            self.scenario(meta["name"], scenario)
        stored = copy.deepcopy(self._store.put(plural, obj, "ADDED"))
        if plural == "trainjobs":
            self._api.kueue.create_workload(
                stored
            )  # a queued one (_kueue.py); seeded, it skipped the webhook
        if plural == "trainjobs" and not has_terminal_condition(stored):
            self._controller.start(stored)
        return stored

    def add_runtime(
        self,
        name: str = "torch-distributed",
        *,
        kind: str = "ClusterTrainingRuntime",
        namespace: str | None = None,
        image: str = "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
        command: list[str] | None = None,
        num_nodes: int = 1,
        volumes: list[dict] | None = None,
        volume_mounts: list[dict] | None = None,
        restart_policy: str | None = None,
        backoff_limit: int | None = None,
        pod_failure_policy: dict | None = None,
        resources: dict | None = None,
        lifecycle: dict | None = None,
    ) -> dict:
        """Seed a minimal torch runtime: one replicated job ``node`` with container ``node`` (``lifecycle``: its
        hooks).

        Like the upstream runtimes it sets no ``restartPolicy`` / ``backoffLimit`` unless given, so a failing
        trainer restarts in place (JobSet's OnFailure default) until the Job's default backoffLimit of 6.
        """
        container: dict[str, Any] = {"name": "node", "image": image}
        if command:
            container["command"] = list(command)
        if volume_mounts:
            container["volumeMounts"] = copy.deepcopy(volume_mounts)
        if resources:
            container["resources"] = copy.deepcopy(resources)
        if lifecycle:
            container["lifecycle"] = copy.deepcopy(lifecycle)
        pod_spec: dict[str, Any] = {"containers": [container]}
        if volumes:
            pod_spec["volumes"] = copy.deepcopy(volumes)
        if restart_policy:
            pod_spec["restartPolicy"] = restart_policy
        job_spec: dict[str, Any] = {"template": {"spec": pod_spec}}
        if backoff_limit is not None:
            job_spec["backoffLimit"] = backoff_limit
        if pod_failure_policy:
            job_spec["podFailurePolicy"] = copy.deepcopy(pod_failure_policy)
        runtime = {
            "apiVersion": TRAINER_API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": "torch"}},
            "spec": {
                "mlPolicy": {"numNodes": num_nodes, "torch": {}},
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "metadata": {
                                        "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                                    },
                                    "spec": job_spec,
                                },
                            }
                        ]
                    }
                },
            },
        }
        if namespace:
            runtime["metadata"]["namespace"] = namespace
        return self.add_object(runtime)

    def add_local_queue(
        self, name: str, *, cluster_queue: str = "cluster-queue", namespace: str | None = None
    ) -> dict:
        """A Kueue LocalQueue (``kueue.x-k8s.io/v1beta1``) in the namespace, pointing at ``cluster_queue``."""
        return self.add_object(local_queue(name, namespace or self.namespace, cluster_queue))

    def add_claim(self, name: str, *access_modes: str, namespace: str | None = None) -> dict:
        """A bound PersistentVolumeClaim (volume ``pv-<name>``) with these access modes."""
        return self.add_object(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
                "spec": {
                    "accessModes": list(access_modes),
                    "resources": {"requests": {"storage": "10Gi"}},
                    "volumeName": f"pv-{name}",
                },
                "status": {"phase": "Bound", "accessModes": list(access_modes)},
            }
        )

    def add_running_pod(
        self, name: str, node: str, *, claims: tuple[str, ...] = (), namespace: str | None = None
    ) -> dict:
        """A running pod on ``node`` that mounts ``claims`` (e.g. the KFP step that launches the TrainJob)."""
        return self.add_object(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "main", "image": "kfp-finetune-trainer"}],
                    "volumes": [
                        {"name": f"claim-{i}", "persistentVolumeClaim": {"claimName": claim}}
                        for i, claim in enumerate(claims)
                    ],
                },
                "status": {"phase": "Running"},
            }
        )

    def add_event(
        self,
        involved_name: str,
        reason: str,
        message: str,
        *,
        type_: str = "Warning",
        kind: str = "Pod",
        namespace: str | None = None,
    ) -> dict:
        """Record a core/v1 Event about an object."""
        return self._store.record_event(
            namespace or self.namespace, kind, involved_name, reason, message, type_
        )

    def trainjob(self, name: str, namespace: str | None = None) -> dict | None:
        """The stored TrainJob (a deep copy), or None if it does not exist (any more)."""
        return self._store.find("trainjobs", namespace or self.namespace, name)

    def jobset(self, name: str, namespace: str | None = None) -> dict | None:
        """The stored JobSet (``jobset.x-k8s.io/v1alpha2``, named after its TrainJob), or None."""
        return self._store.find("jobsets", namespace or self.namespace, name)

    def trainjobs(self, namespace: str | None = None) -> list[dict]:
        """All stored TrainJobs in the namespace."""
        return self._store.list_objects("trainjobs", namespace or self.namespace)

    def pods(self, job: str | None = None, namespace: str | None = None) -> list[dict]:
        """Stored pods (deep copies), only those of TrainJob ``job`` if given, ordered by rank."""
        namespace = namespace or self.namespace
        pods = (
            self._store.list_objects("pods", namespace)
            if job is None
            else self._store.job_pods(namespace, job)
        )

        def rank(pod: dict) -> int:
            return int((pod["metadata"].get("labels") or {}).get(COMPLETION_INDEX_ANNOTATION, 0))

        return sorted(pods, key=rank)

    def running_trainjobs(self, namespace: str | None = None) -> dict[str, str]:
        """TrainJobs that still run or wait to: name -> why (no terminal condition, or node pods Pending /
        Running that are not being deleted). A Complete or Failed TrainJob whose pods ended is not running."""
        running = {}
        for job in self.trainjobs(namespace):
            name = job["metadata"]["name"]
            live = [
                p["metadata"]["name"]
                for p in self.pods(name, namespace)
                if p["status"].get("phase") in ("Pending", "Running")
                and not p["metadata"].get("deletionTimestamp")
            ]
            if live:
                running[name] = f"pods {', '.join(live)} are Pending or Running"
            elif not has_terminal_condition(job):
                running[name] = "it has no Complete or Failed condition"
        return running

    def outliving_trainjobs(self, namespace: str | None = None) -> dict[str, str]:
        """TrainJobs a kfp-finetune launcher asked to create (a POST of that name whose labels the stored one
        carries, managed-by ``kfp-finetune``) that still run or wait to, unless annotated with cleanup policy
        ``never``: what no step may leave behind (name -> why)."""
        running = self.running_trainjobs(namespace)
        outliving = {}
        for request in self.requests_for("POST", "trainjobs"):
            meta = (request.body or {}).get("metadata") or {}
            stored = self.trainjob(meta.get("name", ""), namespace)
            if not stored or stored["metadata"]["name"] not in running:
                continue
            labels, annotations = (
                stored["metadata"].get("labels") or {},
                stored["metadata"].get("annotations") or {},
            )
            if (
                labels == meta.get("labels")
                and labels.get(MANAGED_BY_LABEL) == "kfp-finetune"
                and annotations.get(CLEANUP_POLICY_ANNOTATION) != "never"
            ):
                outliving[stored["metadata"]["name"]] = running[stored["metadata"]["name"]]
        return outliving

    def workloads(self, namespace: str | None = None) -> list[dict]:
        """Stored Kueue Workloads in the namespace (one per queued TrainJob, _kueue.py)."""
        return self._store.list_objects("workloads", namespace or self.namespace)

    def events(self, namespace: str | None = None) -> list[dict]:
        """Stored core/v1 Events in the namespace."""
        return self._store.list_objects("events", namespace or self.namespace)

    def pod_log(self, pod_name: str, namespace: str | None = None) -> str:
        """Everything the pod's ``node`` container has logged so far."""
        return "".join(line for _, line in self._store.log_entries(namespace or self.namespace, pod_name))

    def state_report(self, log_lines: int = 30) -> str:
        """What a failed test's reader needs: each TrainJob's conditions, each pod's phase and conditions, the
        events, and the tail of every node container's log (also of pods since removed)."""
        lines = []
        for job in self._store.list_objects("trainjobs", None):
            conditions = [c["type"] for c in (job.get("status") or {}).get("conditions") or []]
            lines.append(f"TrainJob {job['metadata']['name']}: conditions {conditions}")
        for pod in self._store.list_objects("pods", None):
            conditions = [
                c["type"] for c in pod["status"].get("conditions") or [] if c.get("status") == "True"
            ]
            deleting = " (deleting)" if pod["metadata"].get("deletionTimestamp") else ""
            lines.append(
                f"pod {pod['metadata']['name']}: {pod['status'].get('phase')}{deleting} {conditions}"
            )
        for event in self._store.list_objects("events", None):
            lines.append(f"event {event['involvedObject']['name']}: {event['reason']}: {event['message']}")
        with self._store.cond:
            logs = dict(self._store.logs)
        for (_, pod), entries in logs.items():
            lines.append(f"--- log of {pod} (last {log_lines} lines)")
            lines.extend(line.rstrip("\n")[:300] for _, line in entries[-log_lines:])
        return "\n".join(lines)

    def wait_for_pod(
        self, job: str, where: Callable[[dict], bool], *, timeout: float = 10.0, namespace: str | None = None
    ) -> dict:
        """Wait until a pod of TrainJob ``job`` satisfies ``where`` (e.g. its node container is waiting in
        CrashLoopBackOff); returns it."""
        deadline = time.monotonic() + timeout
        with self._store.cond:
            while True:
                pods = self.pods(job, namespace)
                if found := next((p for p in pods if where(p)), None):
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no matching pod of TrainJob {job} after {timeout}s: {pods}")
                self._store.cond.wait(remaining)

    def wait_for_trainjob(
        self, name: str, *, condition: str | None = None, timeout: float = 10.0, namespace: str | None = None
    ) -> dict:
        """Wait until the TrainJob exists (and has ``condition`` True, e.g. ``"Complete"``); returns it."""
        deadline = time.monotonic() + timeout
        with self._store.cond:
            while True:
                job = self._store.find("trainjobs", namespace or self.namespace, name)
                if job and (condition is None or condition_true(job, condition)):
                    return job
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"TrainJob {name} not {condition or 'created'} after {timeout}s: {job}"
                    )
                self._store.cond.wait(remaining)

    # Authorization -----------------------------------------------------------------------------------------

    def enforce_rbac(self, documents: Iterable[Mapping[str, Any]], *, service_account: str) -> str:
        """From now on the token authenticates as ``service_account`` (``"<namespace>:<name>"``) and every request
        needs a grant from the RBAC ``documents`` (Roles, ClusterRoles and their bindings, e.g. the parsed
        runtimes/rbac.yaml); anything else answers 403 Forbidden with the apiserver's message. Returns the user
        name (``system:serviceaccount:<namespace>:<name>``)."""
        namespace, _, name = service_account.partition(":")
        authorizer = RbacAuthorizer([dict(d) for d in documents], namespace, name)
        with self._store.cond:
            self._api.rbac = authorizer
        return authorizer.user

    @property
    def authorizations(self) -> list[Authorization]:
        """Every resource request's attributes (verb, group, resource, subresource, namespace, name) and whether it
        was allowed, in order (all allowed while RBAC is not enforced)."""
        with self._store.cond:
            return list(self._api.authorizations)

    # Request log -------------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, in order."""
        with self._store.cond:
            return list(self._api.requests)

    def wait_for_request(
        self,
        method: str,
        resource: str | None = None,
        *,
        where: Callable[[RecordedRequest], bool] | None = None,
        timeout: float = 10.0,
    ) -> RecordedRequest:
        """Wait until a matching request has been answered (it is in the request log) and return the first.

        Synchronises a test with a client in another thread: an object appears in the store before the request
        that created it is logged, so waiting for the object does not order two clients' requests."""
        deadline = time.monotonic() + timeout
        with self._store.cond:
            while True:
                matching = [r for r in self.requests_for(method, resource) if where is None or where(r)]
                if matching:
                    return matching[0]
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no {method} {resource or ''} request after {timeout}s")
                self._store.cond.wait(remaining)

    def requests_for(
        self, method: str | None = None, resource: str | None = None, name: str | None = None
    ) -> list[RecordedRequest]:
        """Recorded requests filtered by method, resource plural and object name in the path."""
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper())
            and (resource is None or r.resource == resource)
            and (name is None or r.name == name)
        ]
