"""The request checks of the KFP v2beta1 API server (KFP 2.15+) that the stand-in in kfp_standin.py applies.

Each rule names the upstream file it follows (kubeflow/pipelines, backend/src/...). Where upstream accepts a
request, so does this module: it is never stricter (a NUMBER_INTEGER parameter takes any JSON number, because
v2_template.go checks only for a number value) and never kinder.
"""

from __future__ import annotations

import re
from typing import Any

# apiserver/template/v2_template.go `validatePipelineJobInputs`: the structpb.Value kind each declared type needs,
# and the message the server gives. NUMBER_INTEGER and NUMBER_DOUBLE share one check (any number value).
_KIND_CHECKS = {
    "NUMBER_DOUBLE": (
        lambda v: _is_number(v),
        "requires type double or integer, but the parameter value is not of number value type",
    ),
    "NUMBER_INTEGER": (
        lambda v: _is_number(v),
        "requires type double or integer, but the parameter value is not of number value type",
    ),
    "STRING": (
        lambda v: isinstance(v, str),
        "requires type string, but the input parameter is not of string value type",
    ),
    "BOOLEAN": (
        lambda v: isinstance(v, bool),
        "requires type bool, but the input parameter is not of bool value type",
    ),
    "LIST": (
        lambda v: isinstance(v, list),
        "requires type list, but the input parameter is not of list value type",
    ),
    "STRUCT": (
        lambda v: isinstance(v, dict),
        "requires type struct, but the input parameter is not of struct value type",
    ),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def pipeline_job_input_problem(spec: dict, values: dict[str, Any] | None) -> str | None:
    """What v2_template.go `validatePipelineJobInputs` refuses in a run's runtime_config.parameters, else None.

    Messages are the server's, including its wrapping by resource/resource_manager.go `CreateRun`
    ("Failed to generate the ExecutionSpec") and v2_template.go `RunWorkflow` ("invalid pipeline job inputs").
    """
    declared = ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}
    problem = _input_problem(declared, values)
    return (
        f"Failed to generate the ExecutionSpec: invalid pipeline job inputs: {problem}" if problem else None
    )


def _input_problem(declared: dict[str, dict], values: dict[str, Any] | None) -> str | None:
    if values is None:  # no runtime config at all
        if declared:
            return "pipeline requiring input has no parameter(s) provided. Need parameter(s): " + ", ".join(
                declared
            )
        return None
    for name, definition in declared.items():
        if name not in values:
            if not definition.get("isOptional") and "defaultValue" not in definition:
                return (
                    f"parameter {name} is not optional, yet has neither default value nor user provided value"
                )
            continue
        kind = definition.get("parameterType")
        if kind == "TASK_FINAL_STATUS":
            return (
                f"input parameter {name} requires type TASK_FINAL_STATUS, which is invalid for root component"
            )
        if kind not in _KIND_CHECKS:
            return f"input parameter {name} requires type unknown"
        accepts, message = _KIND_CHECKS[kind]
        if not accepts(values[name]):
            return f"input parameter {name} {message}"
    extra = [name for name in values if name not in declared]
    if extra:
        return "parameter(s) provided are not required by pipeline: " + ", ".join(extra)
    return None


# apiserver/template/v2_template.go `NewV2SpecTemplate`: Go's regexp.MatchString is unanchored, so a name passes
# when it contains one lower-case letter or digit anywhere ("My Pipeline" passes, "ABC" and "--" do not).
_PIPELINE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def pipeline_spec_problem(spec: dict) -> str | None:
    """What v2_template.go `NewV2SpecTemplate` refuses in a PipelineSpec (an upload answers 400 with it)."""
    if spec.get("schemaVersion") != "2.1.0":
        return f"KFP only supports schema version 2.1.0, but the pipeline spec has version {spec.get('schemaVersion')}"
    name = (spec.get("pipelineInfo") or {}).get("name") or ""
    if not name:
        return "invalid v2 pipeline spec: name is empty"
    if not _PIPELINE_NAME.search(name):
        return (
            "invalid v2 pipeline spec: name should consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character"
        )
    if not spec.get("root"):
        return "invalid v2 pipeline spec: root component is empty"
    return None


# apiserver/common/utils.go `ValidatePipelineName` ("Validates a pipeline name to match MLMD requirements", pattern
# `^[a-z0-9][a-z0-9-]{0,127}$`: anchored, no dots, no upper case), the second check of a spec's pipelineInfo.name:
# resource/resource_manager.go `CreatePipelineAndPipelineVersion` and `CreatePipelineVersion` apply it after
# NewV2SpecTemplate, so it holds for uploads only (a run with an inline spec meets only the first), and the
# upload server answers its InvalidInputError 400 with the error's external message.
_MLMD_PIPELINE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")


def upload_name_problem(spec: dict) -> str | None:
    """What `ValidatePipelineName` refuses in an uploaded spec's pipelineInfo.name, else None."""
    name = (spec.get("pipelineInfo") or {}).get("name") or ""
    if not name:
        return "pipeline's name cannot be empty"
    if len(name) > 128:
        return "pipeline's name must contain no more than 128 characters"
    if not _MLMD_PIPELINE_NAME.fullmatch(name):
        return (
            "pipeline's name must contain only lowercase alphanumeric characters or '-' and must start with "
            "alphanumeric characters"
        )
    return None


# --- cron: github.com/robfig/cron v1.2.0 `cron.Parse` (apiserver/server/api_converter.go `toModelJob`) ----------
# The v1 default parser: Second | Minute | Hour | Dom | Month | DowOptional | Descriptor, so 6 fields, or 5 with
# the day of week left out (a 5-field crontab line is read with every field shifted by one place).
BOUNDS = [
    (0, 59, {}),
    (0, 59, {}),
    (0, 23, {}),
    (1, 31, {}),
    (
        1,
        12,
        {
            m: i + 1
            for i, m in enumerate(
                ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
            )
        },
    ),
    (0, 6, {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}),
]
_DESCRIPTORS = {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
_GO_DURATION = re.compile(r"^[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+$|^0$")


def cron_problem(spec: str) -> str | None:
    """robfig/cron v1.2.0 `Parse`'s error for `spec`, or None when it parses (parser.go, spec.go)."""
    if spec.startswith("@"):
        if spec in _DESCRIPTORS:
            return None
        if spec.startswith("@every "):
            duration = spec[len("@every ") :]
            return None if _GO_DURATION.match(duration) else f"Failed to parse duration {spec}"
        return f"Unrecognized descriptor: {spec}"
    fields = spec.split()
    if not 5 <= len(fields) <= 6:
        return f"Expected 5 to 6 fields, found {len(fields)}: {spec}"
    for text, (low, high, names) in zip(fields, BOUNDS, strict=False):
        for expression in text.split(","):
            problem = _range_problem(expression, low, high, names)
            if problem:
                return problem
    return None


def _range_problem(expression: str, low: int, high: int, names: dict[str, int]) -> str | None:
    """robfig/cron v1.2.0 parser.go `getRange`."""
    range_and_step = expression.split("/")
    low_and_high = range_and_step[0].split("-")
    single = len(low_and_high) == 1
    try:
        if low_and_high[0] in ("*", "?"):
            start, end = low, high
        else:
            start = _value(low_and_high[0], names)
            end = start if single else (_value(low_and_high[1], names) if len(low_and_high) == 2 else None)
            if len(low_and_high) > 2:
                return f"Too many hyphens: {expression}"
        if len(range_and_step) == 2:
            step = _value(range_and_step[1], {})
            if single and low_and_high[0] not in ("*", "?"):
                end = high  # "N/step" means N-max/step
            if step == 0:
                return f"Step of range should be a positive number: {expression}"
        elif len(range_and_step) > 2:
            return f"Too many slashes: {expression}"
    except ValueError as error:
        return str(error)
    if start < low:
        return f"Beginning of range ({start}) below minimum ({low}): {expression}"
    if end > high:
        return f"End of range ({end}) above maximum ({high}): {expression}"
    if start > end:
        return f"Beginning of range ({start}) beyond end of range ({end}): {expression}"
    return None


def _value(text: str, names: dict[str, int]) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not text.isdigit():
        raise ValueError(f"Failed to parse int from {text}: strconv.Atoi: parsing {text!r}: invalid syntax")
    return int(text)


def workspace_problem(spec: Any, workspace_default: dict | None) -> str | None:
    """The run's workspace PVC as KFP builds it (backend/src/v2/compiler/argocompiler/argo.go `GetWorkspacePVC`,
    `convertStructToPVCSpec`): the admin default patched by the pipeline's pvcSpecPatch, whose only allowed
    fields are accessModes and storageClassName. A claim without accessModes is refused."""
    platform = spec.get("platform_spec") if isinstance(spec, dict) else None
    config = ((platform or {}).get("platforms", {}).get("kubernetes", {}) or {}).get("pipelineConfig") or {}
    workspace = config.get("workspace")
    if not workspace or "kubernetes" not in workspace:
        return None  # argo.go adds a workspace PVC only when the workspace has a kubernetes section
    patch = workspace["kubernetes"].get("pvcSpecPatch") or {}
    unknown = sorted(set(patch) - {"accessModes", "storageClassName"})
    if unknown:
        return f"InvalidInputError: unknown fields in PVC spec patch: {unknown}"
    claim = {**(workspace_default or {}), **patch}
    if not claim.get("accessModes"):
        return "InvalidInputError: workspace PVC spec must specify accessModes"
    # Kubernetes' PVC validation (pkg/apis/core/validation ValidatePersistentVolumeClaimSpec) then refuses others.
    modes = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
    if not set(claim["accessModes"]) <= modes:
        return f"InvalidInputError: spec.accessModes: Unsupported value: {claim['accessModes']}"
    return None
