"""What the KFP driver makes of a task's parameterised resource fields and image, as upstream does it.

kubeflow/pipelines backend/src/v2/driver/driver.go `initPodSpecPatch` resolves a resource field such as
`resourceCount: "{{$.inputs.parameters['pipelinechannel--x']}}"` with resolve.go
`resolvePodSpecInputRuntimeParameter`: the named input's `structpb.Value.GetStringValue()`. A value that is not a
string (an integer parameter or output is a number value) reads as "", and an empty count sets no limit: the
pod (and, through the task config, the TrainJob's node pods) gets no GPU, and nothing says so. A missing input
is an error ("executorInput did not contain container Image input parameter"). The container's image is resolved
the same way (driver.go: `resolvePodSpecInputRuntimeParameter(container.Image, executorInput)`), so a task can run
on an image a previous step names.

`placeholder_sources` walks a compiled pipeline for every such field and where its value comes from, with the
KFP parameter type of that source, so a test can resolve the fields with the values a run would carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PLACEHOLDER = re.compile(r"^\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}$")
# driver.go initPodSpecPatch: the resource fields it resolves from parameters.
RESOURCE_FIELDS = (
    "resourceCpuLimit", "resourceCpuRequest", "resourceMemoryLimit", "resourceMemoryRequest",
)  # fmt: skip
_PYTHON_TYPE = {"STRING": str, "NUMBER_INTEGER": int, "NUMBER_DOUBLE": float, "BOOLEAN": bool}


def resolve_field(field: str, parameter_values: dict[str, object]) -> str:
    """resolvePodSpecInputRuntimeParameter: a constant as it is; a placeholder by the input's string value."""
    match = _PLACEHOLDER.match(field)
    if not match:
        return field
    if match.group(1) not in parameter_values:
        raise KeyError("executorInput did not contain container Image input parameter")
    value = parameter_values[match.group(1)]
    return value if isinstance(value, str) else ""  # GetStringValue() of a number/bool Value


def accelerator_limits(resources: dict, parameter_values: dict[str, object]) -> dict[str, str]:
    """The accelerator limit initPodSpecPatch puts on the pod: {} when type or count resolves empty."""
    accelerator = resources.get("accelerator") or {}
    kind = resolve_field(accelerator.get("resourceType", ""), parameter_values) or accelerator.get("type", "")
    count = resolve_field(accelerator.get("resourceCount", ""), parameter_values)
    if not count and accelerator.get("count"):
        count = str(accelerator["count"])
    return {kind: count} if kind and count else {}


@dataclass(frozen=True)
class PlaceholderSource:
    """One parameterised resource field (or the image) of a task and what feeds it at run time."""

    dag: str  # "root" or the component holding the task's DAG
    task: str
    field: str  # e.g. "accelerator.resourceCount", "image"
    input_name: str  # the task input the placeholder names
    source: str  # "dag input <name>" or "output <key> of <task>"
    parameter_type: str  # KFP parameter type of the source

    def runtime_value(self, value: object) -> object:
        """`value` as the driver holds it for this source's type (e.g. "1" -> 1 for NUMBER_INTEGER)."""
        return _PYTHON_TYPE[self.parameter_type](value)


def placeholder_sources(spec: dict) -> list[PlaceholderSource]:
    """Every parameterised resource field and image of every task of a compiled pipeline spec, with its source's
    type."""
    components = spec.get("components", {})
    executors = spec.get("deploymentSpec", {}).get("executors", {})
    dags = {"root": spec["root"], **{name: c for name, c in components.items() if "dag" in c}}
    found = []
    for dag_name, holder in dags.items():
        dag_inputs = holder.get("inputDefinitions", {}).get("parameters", {})
        tasks = holder["dag"]["tasks"]
        for task_name, task in tasks.items():
            executor = components[task["componentRef"]["name"]].get("executorLabel")
            container = executors.get(executor, {}).get("container", {}) if executor else {}
            resources = container.get("resources", {})
            fields = {"image": container.get("image"), **{f: resources.get(f) for f in RESOURCE_FIELDS}}
            for key in ("resourceType", "resourceCount"):
                fields[f"accelerator.{key}"] = (resources.get("accelerator") or {}).get(key)
            for field, value in fields.items():
                match = _PLACEHOLDER.match(value or "")
                if not match:
                    continue
                feed = task["inputs"]["parameters"][match.group(1)]
                if "componentInputParameter" in feed:
                    name = feed["componentInputParameter"]
                    source, kind = f"dag input {name}", dag_inputs[name]["parameterType"]
                else:
                    output = feed["taskOutputParameter"]
                    producer = components[tasks[output["producerTask"]]["componentRef"]["name"]]
                    kind = producer["outputDefinitions"]["parameters"][output["outputParameterKey"]][
                        "parameterType"
                    ]
                    source = f"output {output['outputParameterKey']} of {output['producerTask']}"
                found.append(PlaceholderSource(dag_name, task_name, field, match.group(1), source, kind))
    return found


def origin(spec: dict, source: PlaceholderSource) -> str:
    """Where a value reaching a task through nested DAGs (a dsl.If, a ParallelFor) comes from: a DAG input is fed
    by the task running that DAG in its parent, up to a task's output or a pipeline input ("root input <name>")."""
    if not source.source.startswith("dag input "):
        return source.source
    dag, name = source.dag, source.source.removeprefix("dag input ")
    dags = {"root": spec["root"], **{n: c for n, c in spec["components"].items() if "dag" in c}}
    while dag != "root":
        (parent, task), *_ = [
            (holder_name, task)
            for holder_name, holder in dags.items()
            for task in holder["dag"]["tasks"].values()
            if task["componentRef"]["name"] == dag
        ]
        feed = task["inputs"]["parameters"][name]
        if "taskOutputParameter" in feed:
            output = feed["taskOutputParameter"]
            return f"output {output['outputParameterKey']} of {output['producerTask']}"
        dag, name = parent, feed["componentInputParameter"]
    return f"root input {name}"
