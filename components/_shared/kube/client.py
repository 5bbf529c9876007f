"""Kubernetes client loading and retry/backoff for API calls.

Inside a KFP step the pod's service account is the identity (and its namespace the place to create objects);
on a laptop the kubeconfig is. Transient API errors (408, 429, 5xx, dropped connections) are retried with
exponential backoff; every other error (other 4xx, local validation) surfaces at once.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})

T = TypeVar("T")


def load_api_client(
    kubeconfig: str | os.PathLike | None = None,
    *,
    context: str | None = None,
    service_account_dir: str | os.PathLike = SERVICE_ACCOUNT_DIR,
):
    """A `kubernetes.client.ApiClient`: the in-cluster service account first, then a kubeconfig.

    An explicit `kubeconfig` wins over both; outside a pod `KUBECONFIG` / `~/.kube/config` is used.
    """
    from kubernetes import client, config
    from kubernetes.config.incluster_config import InClusterConfigLoader

    if kubeconfig is None and _in_cluster(service_account_dir):
        configuration = client.Configuration()
        account = Path(service_account_dir)
        InClusterConfigLoader(
            token_filename=str(account / "token"), cert_filename=str(account / "ca.crt")
        ).load_and_set(configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=_kubeconfig_file(kubeconfig), context=context)


def _kubeconfig_file(kubeconfig: str | os.PathLike | None) -> str | None:
    """The kubeconfig to read; `KUBECONFIG` is read now (the client library reads it once, at import)."""
    return str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG") or None


def _in_cluster(service_account_dir: str | os.PathLike) -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and (Path(service_account_dir) / "token").is_file()


def _kubeconfig_namespace(kubeconfig: str | os.PathLike | None, context: str | None) -> str | None:
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, active = config.list_kube_config_contexts(config_file=_kubeconfig_file(kubeconfig))
    except (ConfigException, OSError):
        return None  # no usable kubeconfig
    if context:
        active = next((c for c in contexts if c["name"] == context), active)
    return (active or {}).get("context", {}).get("namespace")


def current_namespace(
    explicit: str | None = None,
    *,
    kubeconfig: str | os.PathLike | None = None,
    context: str | None = None,
    service_account_dir: str | os.PathLike = SERVICE_ACCOUNT_DIR,
) -> str:
    """The namespace to work in: the service account's, else the kubeconfig context's, else `explicit`.

    The service account wins because a KFP step may only create objects in its own (profile) namespace.
    """
    namespace_file = Path(service_account_dir) / "namespace"
    if kubeconfig is None and namespace_file.is_file():
        namespace = namespace_file.read_text().strip()
        if namespace:
            return namespace
    namespace = _kubeconfig_namespace(kubeconfig, context)
    if namespace:
        return namespace
    if explicit:
        return explicit
    raise RuntimeError(
        "cannot tell which Kubernetes namespace to use: no service account namespace file, "
        "no namespace in the kubeconfig context, and none given"
    )


@dataclasses.dataclass
class Backoff:
    """Exponential backoff with jitter: `initial * factor**n`, capped at `maximum`, `attempts` tries in all.

    `sleep` is injectable so tests do not wait for real.
    """

    initial: float = 1.0
    factor: float = 2.0
    maximum: float = 30.0
    attempts: int = 8
    jitter: float = 0.1
    sleep: Callable[[float], None] = time.sleep

    def delays(self) -> Iterator[float]:
        """The waits between attempts (`attempts - 1` of them)."""
        delay = self.initial
        for _ in range(self.attempts - 1):
            yield min(self.maximum, delay) * (1 + random.uniform(-self.jitter, self.jitter))
            delay *= self.factor


def is_retryable(error: BaseException) -> bool:
    """True for API errors worth retrying: throttling, server errors, and broken or timed-out connections."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError as Urllib3Error

    if isinstance(error, ApiException):
        # status 0 = the client could not reach the server at all
        return error.status in RETRYABLE_STATUSES or error.status == 0
    if isinstance(error, ValueError):
        return False  # e.g. urllib3's LocationValueError (a bad server URL): the same on every try
    return isinstance(error, Urllib3Error | ConnectionError | TimeoutError)


def retry_after_seconds(error: BaseException) -> float | None:
    """The server's `Retry-After` hint of a 429/503, if any."""
    headers = getattr(error, "headers", None) or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def call_with_retry(
    fn: Callable[..., T],
    *args: Any,
    backoff: Backoff | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
    **kwargs: Any,
) -> T:
    """Call `fn(*args, **kwargs)`, retrying transient API errors with exponential backoff."""
    backoff = backoff or Backoff()
    delays = backoff.delays()
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            if not is_retryable(error):
                raise
            delay = next(delays, None)
            if delay is None:
                raise
            hint = retry_after_seconds(error)
            if hint is not None:
                delay = min(max(delay, hint), backoff.maximum)
            if on_retry:
                on_retry(error, delay)
            backoff.sleep(delay)


TRAINER_GROUP, TRAINER_VERSION = "trainer.kubeflow.org", "v1alpha1"
RUNTIME_PLURALS = {"ClusterTrainingRuntime": "clustertrainingruntimes", "TrainingRuntime": "trainingruntimes"}


def read_training_runtime(
    api_client: Any,
    name: str,
    kind: str,
    namespace: str,
    *,
    backoff: Backoff | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> tuple[bool | None, dict]:
    """(whether the Kubeflow Trainer (Cluster)TrainingRuntime `name` exists — a TrainingRuntime in `namespace` —,
    the runtime object). (False, {}) when it does not; (None, {}) when the ServiceAccount may not read it (403: a
    tighter Role than runtimes/rbac.yaml; creating the TrainJob is then the real test). Raises ValueError for an
    unknown `kind`."""
    from kubernetes import client

    if kind not in RUNTIME_PLURALS:
        raise ValueError(f"runtime kind must be one of {sorted(RUNTIME_PLURALS)}, got {kind!r}")
    custom = client.CustomObjectsApi(api_client)
    group = (TRAINER_GROUP, TRAINER_VERSION)
    if kind == "ClusterTrainingRuntime":
        args = (custom.get_cluster_custom_object, *group, RUNTIME_PLURALS[kind], name)
    else:
        args = (custom.get_namespaced_custom_object, *group, namespace, RUNTIME_PLURALS[kind], name)
    return _read(*args, backoff=backoff, on_retry=on_retry)


def _read(
    get: Callable[..., Any],
    *args: Any,
    backoff: Backoff | None,
    on_retry: Callable[[BaseException, float], None] | None,
) -> tuple[bool | None, dict]:
    """(found, object) of `get(*args)`: (False, {}) on 404, (None, {}) on 403 (the ServiceAccount may not read it)."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = call_with_retry(get, *args, backoff=backoff, on_retry=on_retry)
    except ApiException as error:
        if error.status == 404:
            return False, {}
        if error.status == 403:
            return None, {}
        raise
    return True, found if isinstance(found, dict) else {}


# Kueue's API as every release since v0.5 serves it (v1beta1 stays served next to v1beta2 from v0.15 on).
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"


def local_queue_exists(
    api_client: Any,
    name: str,
    namespace: str,
    *,
    backoff: Backoff | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> bool | None:
    """Whether the Kueue LocalQueue `name` exists in `namespace` (False also where Kueue is not installed: the
    API answers 404 for the resource itself); None when the ServiceAccount may not read it (403)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)
    return _read(
        custom.get_namespaced_custom_object,
        KUEUE_GROUP,
        KUEUE_VERSION,
        namespace,
        "localqueues",
        name,
        backoff=backoff,
        on_retry=on_retry,
    )[0]


def missing_local_queue(name: str, namespace: str) -> str:
    """What to say when `local_queue_exists` answered False."""
    return (
        f"Kueue LocalQueue {name!r} not found in namespace {namespace} (or Kueue is not installed): "
        f"`kubectl get localqueues -n {namespace}` lists the queues; name one of them, or leave it empty to run "
        "without Kueue"
    )
