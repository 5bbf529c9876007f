"""Where a queued TrainJob's Workload stands in its Kueue queue, from Kueue's visibility API.

Upstream (kubernetes-sigs/kueue):

- apis/visibility/v1beta2/types.go (v1beta1 the same): `GET /apis/visibility.kueue.x-k8s.io/<version>/namespaces/
  <ns>/localqueues/<name>/pendingworkloads` (query `limit`, default 1000, and `offset`) answers a
  PendingWorkloadsSummary whose `items` are PendingWorkloads: `metadata` (name, namespace, ownerReferences),
  `priority`, `localQueueName`, `positionInClusterQueue` and `positionInLocalQueue`, both counted from 0.
  pkg/visibility/storage/pending_workloads_lq.go: the LocalQueue's pending Workloads in their ClusterQueue's order
  (a 404 when Kueue does not know the LocalQueue).
- It is served by Kueue's own API server behind APIServices (config/components/visibility): `v1beta2` since Kueue
  v0.15 (the version the "Pending Workloads on-demand" docs use), `v1beta1` from v0.9 to now (pkg/visibility/
  server.go installs both). So v1beta2 is asked first and v1beta1 after a 404 (v1alpha1, v0.6 to v0.9, is not).
- kube-apiserver authorizes it before proxying: verb `get` on `localqueues/pendingworkloads` in group
  `visibility.kueue.x-k8s.io` (config/components/rbac/pending_workloads_lq_viewer_role.yaml grants it). Without
  the APIService the path is unknown: 404 (apiserver pkg/util/notfoundhandler); with it but Kueue's server not
  reachable, 503 "service unavailable" (kube-aggregator pkg/apiserver/handler_proxy.go).

The position only adds to the step log's lines, so a 403, 404 or 503 is said once and the API is not asked again;
other errors are retried as every other call of the launcher.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import api_message

VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")  # the newest first: see the module docstring
# Under /apis/<group>/<version>/namespaces/{namespace}/.
PENDING_WORKLOADS = "localqueues/{name}/pendingworkloads"
# No RBAC grant, no visibility API, or Kueue's API server not reachable: said once, not asked again.
NOT_SERVED = frozenset({403, 404, 503})


class _NotServed(Exception):
    """A 403/404/503 of the visibility API, kept out of the retries (they only retry API errors)."""

    def __init__(self, error: Any) -> None:
        super().__init__(str(error))
        self.error = error


class QueuePosition:
    """Reads the position of one TrainJob's Workload in its LocalQueue and its ClusterQueue.

    Args:
        api_client: A `kubernetes.client.ApiClient`.
        namespace: The TrainJob's namespace.
        log: The step's logger.
    """

    def __init__(self, api_client: Any, namespace: str, *, log: Any) -> None:
        self.api_client, self.namespace, self.log = api_client, namespace, log
        self._versions = list(VISIBILITY_VERSIONS)
        self.readable = True

    def words(self, queue: str, *, workload: str, job_uid: str, api: Callable[..., Any]) -> str:
        """ "; position N in queue <queue> (M in the cluster queue)", counted from 1, for the Workload named
        `workload` or owned by the TrainJob `job_uid`; "" when it is not listed or cannot be read."""
        if not self.readable:
            return ""
        try:
            summary = self._pending_workloads(queue, api=api)
        except _NotServed as not_served:
            self.readable = False
            self._say_unreadable(queue, not_served.error)
            return ""
        for item in summary.get("items") or []:
            meta = item.get("metadata") or {}
            owned = any(ref.get("uid") == job_uid for ref in meta.get("ownerReferences") or [])
            if (workload and meta.get("name") == workload) or (job_uid and owned):
                return (
                    f"; position {item.get('positionInLocalQueue', 0) + 1} in queue {queue} "
                    f"({item.get('positionInClusterQueue', 0) + 1} in the cluster queue)"
                )
        return ""

    def _pending_workloads(self, queue: str, *, api: Callable[..., Any]) -> dict:
        while True:
            try:
                return api(self._get, queue, self._versions[0])
            except _NotServed as not_served:
                if not_served.error.status != 404 or len(self._versions) == 1:
                    raise
                self._versions.pop(0)  # an older Kueue: the next version

    def _get(self, queue: str, version: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.api_client.call_api(
                f"/apis/{VISIBILITY_GROUP}/{version}/namespaces/{{namespace}}/{PENDING_WORKLOADS}",
                "GET",
                path_params={"namespace": self.namespace, "name": queue},
                header_params={"Accept": "application/json"},
                response_type="object",
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except ApiException as error:
            if error.status in NOT_SERVED:
                raise _NotServed(error) from error
            raise

    def _say_unreadable(self, queue: str, error: Any) -> None:
        if error.status == 403:
            fix = (
                "runtimes/rbac.yaml grants it (get on localqueues/pendingworkloads in group "
                f"{VISIBILITY_GROUP})"
            )
        else:
            fix = (
                "Kueue's visibility API is not installed or not available (`kubectl get apiservices "
                f"v1beta2.{VISIBILITY_GROUP} v1beta1.{VISIBILITY_GROUP}`)"
            )
        self.log.warning(
            "cannot read the position in Kueue queue %s (%s): the wait is reported without it; %s",
            queue,
            api_message(error),
            fix,
        )
