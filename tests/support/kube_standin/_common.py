"""Shared pieces of the stand-in: Trainer/JobSet constants, Status errors, URL routing and selectors."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
TRAINER_API_VERSION = f"{TRAINER_GROUP}/{TRAINER_VERSION}"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta1"
GROUP_VERSIONS = {TRAINER_GROUP: TRAINER_VERSION, JOBSET_GROUP: JOBSET_VERSION, KUEUE_GROUP: KUEUE_VERSION}

# Trainer v2.3 (pkg/constants, the torch plugin) and the JobSet condition texts the Trainer copies into TrainJobs.
# ContainerTrainerPort in kubeflow/trainer v2.3.0 pkg/constants/constants.go: the torch plugin's PET_MASTER_PORT.
MASTER_PORT = 29500
TORCH_RESERVED_ENV = (
    "PET_NNODES",
    "PET_NPROC_PER_NODE",
    "PET_NODE_RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
)
TUNE_ENTRYPOINT = ["tune", "run"]  # the command the Trainer rewrites (and then injects no PET_* env)
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
JOBSET_FAILED_MESSAGE = "jobset failed due to one or more job failures"
DEADLINE_EXCEEDED = ("DeadlineExceeded", "TrainJob exceeded its active deadline")

KINDS = {  # plural -> (api group ("" = core), kind, namespaced)
    "trainjobs": (TRAINER_GROUP, "TrainJob", True),
    "trainingruntimes": (TRAINER_GROUP, "TrainingRuntime", True),
    "clustertrainingruntimes": (TRAINER_GROUP, "ClusterTrainingRuntime", False),
    "jobsets": (JOBSET_GROUP, "JobSet", True),
    "pods": ("", "Pod", True),
    "events": ("", "Event", True),
    "persistentvolumeclaims": ("", "PersistentVolumeClaim", True),
    "secrets": ("", "Secret", True),
    "localqueues": (KUEUE_GROUP, "LocalQueue", True),
    "workloads": (KUEUE_GROUP, "Workload", True),
    "workloadpriorityclasses": (KUEUE_GROUP, "WorkloadPriorityClass", False),
}
PLURAL_OF_KIND = {kind: plural for plural, (_, kind, _) in KINDS.items()}


def utc_now() -> str:
    """An RFC 3339 timestamp at second granularity, as metav1.Time serializes."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def truthy(value: str | None) -> bool:
    """Boolean query parameters: the Python client sends ``True``, kubectl ``true``."""
    return (value or "").lower() in ("true", "1")


class ApiError(Exception):
    """A request failure rendered as a ``kind: Status`` body."""

    _REASONS = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        405: "MethodNotAllowed",
        409: "AlreadyExists",
        410: "Gone",
        422: "Invalid",
        429: "TooManyRequests",
        500: "InternalError",
        503: "ServiceUnavailable",
        504: "Timeout",
    }

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.headers = headers or {}
        self.status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason or self._REASONS.get(code, "Unknown"),
            "code": code,
        }
        if details is not None:
            self.status["details"] = details


def not_found(plural: str, name: str) -> ApiError:
    group = KINDS[plural][0]
    qualified = f"{plural}.{group}" if group else plural
    return ApiError(
        404, f'{qualified} "{name}" not found', details={"name": name, "group": group, "kind": plural}
    )


def invalid(kind: str, name: str, errors: list[tuple[str, str]]) -> ApiError:
    """422 Invalid the way apimachinery aggregates field errors: ``<Kind>.<group> "<name>" is invalid: ...``."""
    rendered = [f"{field}: {message}" if field else message for field, message in errors]
    summary = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    return ApiError(
        422,
        f'{kind}.{TRAINER_GROUP} "{name}" is invalid: {summary}',
        details={
            "name": name,
            "group": TRAINER_GROUP,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errors],
        },
    )


@dataclasses.dataclass(frozen=True)
class Route:
    """What a request path addresses."""

    plural: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_route(path: str) -> Route | None:
    """``/api/v1/...`` or ``/apis/trainer.kubeflow.org/v1alpha1/...`` → Route; None for anything not served."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis" and GROUP_VERSIONS.get(parts[1]) == parts[2]:
        rest = parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3 or rest[0] not in KINDS:
        return None
    group = KINDS[rest[0]][0]
    if group != ("" if parts[0] == "api" else parts[1]):
        return None
    return Route(rest[0], namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None)


def lookup_field(obj: dict, dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def parse_label_selector(selector: str) -> Callable[[dict], bool]:
    """A predicate for ``labelSelector``: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``."""
    terms = []
    # split on commas that are not inside "in (a,b)" parentheses
    for raw in re.split(r",(?![^()]*\))", selector):
        term = raw.strip()
        if not term:
            continue
        if match := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
            key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
            terms.append(lambda labels, k=key, o=op, vs=values: (labels.get(k) in vs) == (o == "in"))
        elif match := re.fullmatch(r"([^!=\s]+)\s*(==|!=|=)\s*(\S*)", term):
            key, op, value = match.groups()
            terms.append(lambda labels, k=key, o=op, v=value: (labels.get(k) == v) == (o != "!="))
        elif term.startswith("!"):
            absent = term[1:].strip()
            terms.append(lambda labels, k=absent: k not in labels)
        else:
            terms.append(lambda labels, k=term: k in labels)
    return lambda obj: all(term(obj.get("metadata", {}).get("labels") or {}) for term in terms)


# The fields each resource can be selected by, as the API server converts field labels: every kind has
# metadata.name / metadata.namespace (generic registry ObjectMetaFieldsSet); pods add pkg/registry/core/pod/
# strategy.go PodToSelectableFields, events pkg/registry/core/event/strategy.go ToSelectableFields ("source" is
# source.component). Custom resources (apiextensions-apiserver pkg/registry/customresource) and the other core
# kinds served here have only the metadata ones.
_METADATA_FIELDS = {"metadata.name": "metadata.name", "metadata.namespace": "metadata.namespace"}
SELECTABLE_FIELDS = {
    "pods": {
        **_METADATA_FIELDS,
        **{
            f: f
            for f in (
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            )
        },
    },
    "events": {
        **_METADATA_FIELDS,
        **{
            f"involvedObject.{f}": f"involvedObject.{f}"
            for f in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
        },
        "reason": "reason",
        "reportingComponent": "reportingComponent",
        "source": "source.component",
        "type": "type",
    },
}


def unsupported_field(plural: str, field: str) -> ApiError:
    """400 for a field label the resource cannot be selected by, with the API server's words: core kinds
    (pkg/apis/core/v1 conversion: "field label not supported"), custom resources (customresource strategy)."""
    if KINDS[plural][0]:
        return ApiError(
            400, f'"{field}" is not a known field selector: only "metadata.name", "metadata.namespace"'
        )
    return ApiError(400, f"field label not supported: {field}")


def _field_text(value: Any) -> str:
    """A field's value as a field selector compares it (booleans as "true"/"false", absent as "")."""
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


def parse_field_selector(selector: str, plural: str) -> Callable[[dict], bool]:
    """A predicate for ``fieldSelector`` (``=``, ``==``, ``!=``) on the fields ``plural`` supports
    (``SELECTABLE_FIELDS``); any other field answers 400 as on a real server."""
    selectable = SELECTABLE_FIELDS.get(plural, _METADATA_FIELDS)
    terms = []
    for raw in selector.split(","):
        if not raw.strip():
            continue
        match = re.fullmatch(r"\s*([^!=\s]+)\s*(==|!=|=)\s*(.*?)\s*", raw)
        if not match:
            raise ApiError(400, f'invalid selector: "{selector}"; can\'t understand "{raw}"')
        field, op, value = match.groups()
        if field not in selectable:
            raise unsupported_field(plural, field)
        terms.append(
            lambda obj, f=selectable[field], o=op, v=value: (
                (_field_text(lookup_field(obj, f)) == v) == (o != "!=")
            )
        )
    return lambda obj: all(term(obj) for term in terms)
