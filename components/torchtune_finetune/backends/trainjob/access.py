"""What the step's ServiceAccount may do, asked before anything is created (SelfSubjectAccessReview).

A Role that lacks a verb the launcher cannot do without (create, watch or delete TrainJobs, watch pods) would
otherwise surface mid-run, after a TrainJob exists that nobody can follow or delete: so those are asked first and
a missing one stops the step naming the verb and the resource. A permission that only feeds the step log (the
rank-0 log, events) is reported as a warning and the launcher does without it.

kubernetes pkg/registry/authorization/selfsubjectaccessreview: every authenticated user may create a review
(bootstrap ClusterRole `system:basic-user`); it answers what the authorizer would decide for that request. A
cluster without the API (404) or that forbids it leaves the first real calls as the test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff, call_with_retry
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import (
    TrainJobForbidden,
    api_message,
)

RBAC_FIX = (
    "bind the ClusterRole kfp-finetune-trainjob-launcher of runtimes/rbac.yaml to the step's ServiceAccount "
    "in this namespace (see the file's header), or add the missing rules to its Role"
)


@dataclasses.dataclass(frozen=True)
class Permission:
    """One verb on one resource in the TrainJob's namespace.

    Attributes:
        verb: get, list, watch, create, delete.
        group: API group ("" for core).
        resource: Resource plural.
        subresource: e.g. "log".
        without: What the launcher does without it; "" when it cannot run at all.
    """

    verb: str
    group: str
    resource: str
    subresource: str = ""
    without: str = ""

    def __str__(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {resource}" + (f" ({self.group})" if self.group else "")


LOG = Permission(
    "get", "", "pods", "log", without="the rank-0 log is not streamed into this step (training goes on)"
)
LAUNCHER_PERMISSIONS = (
    *(Permission(verb, tj.GROUP, tj.PLURAL) for verb in ("create", "get", "list", "watch", "delete")),
    Permission("list", "", "pods"),
    Permission("watch", "", "pods"),
    Permission("get", "jobset.x-k8s.io", "jobsets"),
    Permission(
        "patch",
        tj.GROUP,
        tj.PLURAL,
        without="a retry cannot add its pod as an owner of the TrainJob it attaches to",
    ),
    Permission("get", "", "pods", without="a rank-0 log stream that ends cannot tell a finished pod"),
    LOG,
    Permission("list", "", "events", without="pods that do not start are reported without their events"),
    Permission(
        "get",
        "visibility.kueue.x-k8s.io",
        "localqueues",
        "pendingworkloads",
        without="a queued TrainJob's wait is reported without its position in the queue",
    ),
)


def check_permissions(
    api_client: Any,
    namespace: str,
    *,
    backoff: Backoff,
    on_retry: Callable[[BaseException, float], None],
    log: Any,
) -> set[Permission]:
    """Raise TrainJobForbidden naming every missing permission the launcher cannot do without; warn about the
    others and return them (the launcher skips what needs them)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    authorization = client.AuthorizationV1Api(api_client)
    missing = set()
    for permission in LAUNCHER_PERMISSIONS:
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=namespace,
                    verb=permission.verb,
                    group=permission.group,
                    resource=permission.resource,
                    subresource=permission.subresource or None,
                )
            )
        )
        try:
            answer = call_with_retry(
                authorization.create_self_subject_access_review, review, backoff=backoff, on_retry=on_retry
            )
        except ApiException as error:
            if error.status not in (403, 404):
                raise
            log.info("cannot ask what this step may do (%s); the first calls will tell", api_message(error))
            return set()
        if not answer.status.allowed:
            missing.add(permission)
    fatal = [p for p in LAUNCHER_PERMISSIONS if p in missing and not p.without]
    if fatal:
        raise TrainJobForbidden(
            f"this step's ServiceAccount may not {', '.join(map(str, fatal))} in namespace {namespace}: "
            f"nothing was created. Fix: {RBAC_FIX}"
        )
    for permission in (p for p in LAUNCHER_PERMISSIONS if p in missing):
        log.warning(
            "this step's ServiceAccount may not %s in namespace %s: %s. Fix: %s",
            permission,
            namespace,
            permission.without,
            RBAC_FIX,
        )
    return missing
