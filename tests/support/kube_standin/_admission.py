"""The Trainer v2.3 admission webhooks for TrainJobs, as the API server reports their denials.

Upstream (kubeflow/trainer v2.3.0):
  * pkg/webhooks/trainjob_webhook.go: the defaulter stamps ``runtimePatches[].time`` on create; the validator answers
    ``unsupported runtime: <kind>.<group>`` for an unknown runtimeRef, else the runtime's ValidateObjects.
  * pkg/runtime/core/{clustertrainingruntime,trainingruntime}.go ValidateObjects: the runtime must exist, else one
    error; otherwise every validation plugin runs and their field errors are aggregated.
  * pkg/runtime/framework/plugins/jobset/jobset.go Validate: each ``runtimePatches[].manager`` must be a
    domain-prefixed path (apimachinery util/validation IsDomainPrefixedPath); patched replicated jobs, containers and
    initContainers must exist in the runtime template; no ``env`` on the dataset-initializer, model-initializer or
    ``node`` containers.
  * pkg/runtime/framework/plugins/torch/torch.go Validate: no reserved ``PET_*`` names in ``trainer.env``, whatever
    the command (the torchtune checks for ``command == ["tune", "run"]`` are not simulated).

controller-runtime's admission.Validator turns a returned error into ``Denied(err.Error())``: HTTP 403, reason
Forbidden; kube-apiserver (admission/plugin/webhook/errors ToStatusErr) prefixes the message with
``admission webhook "<name>" denied the request: ``. An aggregate of one error reads as that error; of several as
``[e1, e2]`` (apimachinery util/errors aggregate); a bad value that is not a string or number is rendered as JSON
(util/validation/field ErrorBody).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ._common import PLURAL_OF_KIND, TORCH_RESERVED_ENV, TRAINER_GROUP, ApiError, utc_now

WEBHOOK_DENIED = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
NO_ENV_CONTAINERS = ("dataset-initializer", "model-initializer", "node")  # pkg/constants
_DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_HTTP_PATH = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")  # apimachinery httpPathFmt


def _render(value: Any) -> str:
    """A bad value as field.Error prints it: strings quoted, anything else as JSON."""
    return json.dumps(value, separators=(",", ":"))


def _invalid(field: str, value: Any, detail: str) -> str:
    return f"{field}: Invalid value: {_render(value)}: {detail}"


def domain_prefixed_path_errors(field: str, path: str) -> list[str]:
    """apimachinery util/validation IsDomainPrefixedPath: ``<RFC 1123 subdomain>/<HTTP path>``."""
    if not path:
        return [f"{field}: Required value"]
    host, slash, rest = path.partition("/")
    if not slash or not host or not rest:
        return [_invalid(field, path, 'must be a domain-prefixed path (such as "acme.io/foo")')]
    errors = []
    if len(host) > 253:
        errors.append(_invalid(field, host, "must be no more than 253 characters"))
    if not _DNS1123_SUBDOMAIN.match(host):
        errors.append(
            _invalid(
                field,
                host,
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                f"validation is '{_DNS1123_SUBDOMAIN.pattern[1:-1]}')",
            )
        )
    if not _HTTP_PATH.match(rest):
        errors.append(
            _invalid(field, rest, f"Invalid path (regex used for validation is '{_HTTP_PATH.pattern[1:-1]}')")
        )
    return errors


def _container_names(runtime: dict) -> dict[str, set[str]]:
    """Replicated job name -> names of its containers and initContainers, from the runtime's JobSet template."""
    names: dict[str, set[str]] = {}
    for job in ((runtime["spec"].get("template") or {}).get("spec") or {}).get("replicatedJobs") or []:
        pod = (((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        names[job["name"]] = {c["name"] for c in pod.get("containers", []) + pod.get("initContainers", [])}
    return names


def _jobset_errors(job: dict, runtime: dict) -> list[str]:
    patches = job["spec"].get("runtimePatches") or []
    errors: list[str] = []
    containers_of = _container_names(runtime)
    for patch in patches:
        errors += domain_prefixed_path_errors("spec.runtimePatches.manager", patch.get("manager", ""))
        template = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec")
        for job_patch in (template or {}).get("replicatedJobs") or []:
            containers = containers_of.get(job_patch.get("name"))
            if containers is None:
                detail = "must not have replicated job that doesn't exist in the runtime job template"
                errors.append(_invalid("spec.runtimePatches", patches, detail))
                continue
            spec = (((job_patch.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
            name = job_patch["name"]
            for init in (spec or {}).get("initContainers") or []:
                if init.get("name") not in containers:
                    detail = f"must not have initContainer that doesn't exist in the runtime job {name}"
                    errors.append(_invalid("spec.runtimePatches", patches, detail))
            for container in (spec or {}).get("containers") or []:
                if container.get("name") not in containers:
                    detail = f"must not have container that doesn't exist in the runtime job {name}"
                    errors.append(_invalid("spec.runtimePatches", patches, detail))
                elif container.get("env") and container["name"] in NO_ENV_CONTAINERS:
                    detail = f"must not have envs for the {', '.join(NO_ENV_CONTAINERS)} containers"
                    errors.append(_invalid("spec.runtimePatches", patches, detail))
    return errors


def _torch_errors(job: dict, runtime: dict) -> list[str]:
    if "torch" not in (runtime["spec"].get("mlPolicy") or {}):
        return []
    env = (job["spec"].get("trainer") or {}).get("env") or []
    reserved = sorted({e["name"] for e in env if e["name"] in TORCH_RESERVED_ENV})
    if not reserved:
        return []
    detail = f"must not have reserved envs, invalid envs configured: [{' '.join(reserved)}]"
    return [_invalid("spec.trainer.env", env, detail)]


def admit_trainjob(job: dict, runtime: dict | None) -> None:
    """Default ``job`` in place and validate it against ``runtime`` (None: it does not exist); ApiError if denied."""
    now = utc_now()
    for patch in job["spec"].get("runtimePatches", []):
        patch.setdefault("time", now)
    ref = job["spec"]["runtimeRef"]
    if ref.get("apiGroup") != TRAINER_GROUP or ref.get("kind") not in PLURAL_OF_KIND:
        raise ApiError(403, WEBHOOK_DENIED + f"unsupported runtime: {ref.get('kind')}.{ref.get('apiGroup')}")
    if runtime is None:
        cluster = ref["kind"] == "ClusterTrainingRuntime"
        field = "spec.RuntimeRef" if cluster else "spec.runtimeRef"  # sic: upstream spells them differently
        which = "clusterTrainingRuntime" if cluster else "trainingRuntime"
        raise ApiError(
            403,
            WEBHOOK_DENIED + f"{field}: Invalid value: {_render(ref)}: "
            f'{ref["kind"]}.{TRAINER_GROUP} "{ref["name"]}" not found: specified {which} must be created '
            "before the TrainJob is created",
        )
    # Plugin order: jobset, then torch; the aggregate shows a repeated message once (util/errors aggregate.Error).
    errors = list(dict.fromkeys(_jobset_errors(job, runtime) + _torch_errors(job, runtime)))
    if errors:
        message = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        raise ApiError(403, WEBHOOK_DENIED + message)
