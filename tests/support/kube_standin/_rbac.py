"""Authorization: what a request asks for (its attributes) and whether RBAC documents grant it to one user.

Upstream (kubernetes):
  * staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go: the request's verb (GET on a collection is
    ``list``, with ``watch=true`` ``watch``; POST ``create``; DELETE ``delete`` / ``deletecollection``; PUT
    ``update``; PATCH ``patch``), API group, namespace, resource, name (for a list/watch, from an exact
    ``metadata.name`` field selector) and subresource come from the URL alone, so authorization happens before the
    server knows whether the resource exists.
  * plugin/pkg/auth/authorizer/rbac/rbac.go + pkg/apis/rbac/v1/evaluation_helpers.go: a request is allowed when a
    rule of a role bound to the user matches verb, API group, resource (``resource/subresource``, ``*``, ``*/sub``)
    and resourceNames; ClusterRoleBindings grant everywhere, RoleBindings only in their namespace. A
    ServiceAccount subject matches ``system:serviceaccount:<ns>:<name>``; the ``system:serviceaccounts``,
    ``system:serviceaccounts:<ns>`` and ``system:authenticated`` groups are the service account's too.
  * staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go forbiddenMessage + apimachinery
    errors.NewForbidden: 403 ``<resource>[.<group>] ["<name>" ]is forbidden: User "<user>" cannot <verb> resource
    "<resource>[/<sub>]" in API group "<group>" in the namespace "<ns>"`` (``at the cluster scope`` without one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ._common import ApiError, truthy

_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}


@dataclasses.dataclass(frozen=True)
class RequestAttributes:
    """What a resource request asks for, as the authorizer sees it."""

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """(verb, group, resource, subresource, namespace): what a Role grants, without the object name."""
        return (self.verb, self.group, self.resource, self.subresource, self.namespace)


@dataclasses.dataclass(frozen=True)
class Authorization:
    """One authorization decision the stand-in made (``allowed`` is True when RBAC is not enforced)."""

    attributes: RequestAttributes
    user: str
    allowed: bool


def request_attributes(method: str, path: str, query: dict[str, str]) -> RequestAttributes | None:
    """The attributes of a resource request (``/api/v1/...``, ``/apis/<group>/<version>/...``); None otherwise."""
    parts = [p for p in path.split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return None
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:  # "namespaces/<ns>" alone: the namespace object
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource, name, subresource = rest[0], (rest[1:2] or [""])[0], "/".join(rest[2:])
    if method == "GET" and not name:  # a collection: list or watch; a metadata.name selector names the object
        verb = "watch" if truthy(query.get("watch")) else "list"
        terms = [t.replace("==", "=").split("=", 1) for t in query.get("fieldSelector", "").split(",")]
        name = dict(t for t in terms if len(t) == 2 and not t[0].endswith("!")).get("metadata.name", "")
    elif method == "GET":
        verb = "get"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = _VERBS.get(method, method.lower())
    return RequestAttributes(verb, group, resource, subresource, namespace, name)


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


class RbacAuthorizer:
    """Grants of ``documents`` (Role, ClusterRole, RoleBinding, ClusterRoleBinding) to one service account."""

    def __init__(self, documents: Iterable[dict], namespace: str, service_account: str) -> None:
        self.user = service_account_user(namespace, service_account)
        groups = {"system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"}
        docs = [d for d in documents if (d.get("apiVersion") or "").startswith("rbac.authorization.k8s.io/")]
        roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d for d in docs}
        # (rules, namespace the grant is limited to or "" for everywhere)
        self.grants: list[tuple[list[dict], str]] = []
        for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            if not any(
                self._subject_matches(s, namespace, service_account, groups) for s in binding["subjects"]
            ):
                continue
            scope = binding["metadata"].get("namespace", "") if binding["kind"] == "RoleBinding" else ""
            ref = binding["roleRef"]
            role = roles.get((ref["kind"], scope if ref["kind"] == "Role" else "", ref["name"]))
            if role is not None:  # a binding to a missing role grants nothing
                self.grants.append((role.get("rules") or [], scope))

    @staticmethod
    def _subject_matches(subject: dict, namespace: str, name: str, groups: set[str]) -> bool:
        if subject["kind"] == "ServiceAccount":
            return (subject.get("namespace"), subject["name"]) == (namespace, name)
        if subject["kind"] == "Group":
            return subject["name"] in groups
        return subject["kind"] == "User" and subject["name"] == service_account_user(namespace, name)

    def allows(self, attrs: RequestAttributes) -> bool:
        return any(
            (not scope or scope == attrs.namespace) and any(_rule_allows(rule, attrs) for rule in rules)
            for rules, scope in self.grants
        )

    def forbidden(self, attrs: RequestAttributes) -> ApiError:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        where = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        reason = f'User "{self.user}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {where}'
        qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
        named = f' "{attrs.name}"' if attrs.name else ""
        return ApiError(
            403,
            f"{qualified}{named} is forbidden: {reason}",
            details={
                k: v for k, v in (("name", attrs.name), ("group", attrs.group), ("kind", attrs.resource)) if v
            },
        )


def _rule_allows(rule: dict, attrs: RequestAttributes) -> bool:
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    verbs, groups, resources = (
        rule.get("verbs") or [],
        rule.get("apiGroups") or [],
        rule.get("resources") or [],
    )
    names = rule.get("resourceNames") or []
    return (
        ("*" in verbs or attrs.verb in verbs)
        and ("*" in groups or attrs.group in groups)
        and any(
            r in ("*", combined) or (attrs.subresource and r == f"*/{attrs.subresource}") for r in resources
        )
        and (not names or attrs.name in names)
    )


ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def self_subject_access_review(rbac: RbacAuthorizer | None, body: object) -> dict:
    """What POST selfsubjectaccessreviews answers: the review with ``status.allowed`` for the caller.

    Every authenticated user may create one (the bootstrap ClusterRole ``system:basic-user``, plugin/pkg/auth/
    authorizer/rbac/bootstrappolicy/policy.go), so it is never forbidden. pkg/registry/authorization/
    selfsubjectaccessreview/rest.go: exactly one of ``resourceAttributes`` / ``nonResourceAttributes`` (422
    otherwise), the decision of the same authorizer a request would meet, ``denied`` never set by RBAC.
    """
    spec = (body or {}).get("spec") if isinstance(body, dict) else None
    attrs = (spec or {}).get("resourceAttributes")
    if not isinstance(attrs, dict) or (spec or {}).get("nonResourceAttributes"):
        raise ApiError(
            422,
            'SelfSubjectAccessReview.authorization.k8s.io "" is invalid: spec.resourceAttributes: Invalid value: '
            '"null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
        )
    request = RequestAttributes(
        verb=attrs.get("verb", ""),
        group=attrs.get("group", ""),
        resource=attrs.get("resource", ""),
        subresource=attrs.get("subresource", ""),
        namespace=attrs.get("namespace", ""),
        name=attrs.get("name", ""),
    )
    allowed = rbac is None or rbac.allows(request)
    return {
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": spec,
        "status": {"allowed": allowed},
    }
