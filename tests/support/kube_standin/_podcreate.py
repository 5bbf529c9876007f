"""Node pods that are never created, and the only trace they leave: Warning events, no TrainJob condition.

- The API server validates each pod the Job controller creates (kubernetes pkg/apis/core/validation/validation.go
  ValidateResourceRequirements): a request above its limit is invalid ("must be less than or equal to <r> limit of
  <q>"), and a resource that cannot be overcommitted (an extended resource such as ``nvidia.com/gpu``) needs a
  limit equal to its request ("must be equal to <r> limit of <q>", "Limit must be set for non overcommitable
  resources"). A runtime's limits merged with a TrainJob's larger requests (resourcesPerNode) produce such pods.
- The Job controller (pkg/controller/job/job_controller.go, via controller_utils.go) then records a Warning
  ``FailedCreate`` event ``Error creating: <the API error>`` on the Job and retries with back-off for ever; the
  Job, the JobSet and the TrainJob get no condition.
- The Trainer (kubeflow/trainer pkg/controller/trainjob_controller.go Reconcile) records a Warning
  ``TrainJobResourcesCreationFailed`` event ``TrainJob resources reconciliation failed: <error>`` on the TrainJob
  when building or applying its JobSet fails (``Scenario.resources_creation_error``), and retries; no condition.
"""

from __future__ import annotations

from fractions import Fraction

RESOURCES_CREATION_FAILED = "TrainJobResourcesCreationFailed"

_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def quantity(value: object) -> Fraction:
    """A resource.Quantity's value (``500m``, ``16Gi``, ``2``, ``1e3``)."""
    text = str(value).strip()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    suffix = text[len(number) :]
    if suffix.startswith(("e", "E")) and suffix[1:].lstrip("+-").isdigit():  # decimal exponent, e.g. 1e3
        return Fraction(text)
    return Fraction(number) * _SUFFIXES[suffix]


def overcommit_allowed(resource: str) -> bool:
    """Native resources (cpu, memory, ephemeral-storage, ...) may be requested below their limit; extended ones
    (a domain-prefixed name outside kubernetes.io, e.g. nvidia.com/gpu) and hugepages may not
    (pkg/apis/core/helper IsOvercommitAllowed)."""
    prefix = resource.split("/", 1)[0] if "/" in resource else ""
    native = not prefix or prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io")
    return native and not resource.startswith("hugepages-")


def pod_spec_errors(spec: dict) -> list[str]:
    """The field errors the API server reports for the pod's resources, in its wording."""
    errors = []
    for index, container in enumerate(spec.get("containers") or []):
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        path = f"spec.containers[{index}].resources"
        for name, requested in requests.items():
            if name in limits:
                limit = limits[name]
                if quantity(requested) != quantity(limit) and not overcommit_allowed(name):
                    errors.append(
                        f'{path}.requests[{name}]: Invalid value: "{requested}": must be equal to {name} limit '
                        f"of {limit}"
                    )
                elif quantity(requested) > quantity(limit):
                    errors.append(
                        f'{path}.requests[{name}]: Invalid value: "{requested}": must be less than or equal to '
                        f"{name} limit of {limit}"
                    )
            elif not overcommit_allowed(name):
                errors.append(
                    f"{path}.limits: Required value: Limit must be set for non overcommitable resources"
                )
    return errors


def failed_create_message(pod_name: str, errors: list[str]) -> str:
    """The Job controller's event message for a pod the API server rejected as invalid (field errors joined the
    way apimachinery's NewInvalid aggregates them)."""
    summary = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return f'Error creating: Pod "{pod_name}" is invalid: {summary}'
