"""The runtimes of runtimes/ with kustomize Components applied, built in Python so the variants are checked where
no kustomize binary is installed.

Only what our components use is implemented: `patches` entries naming a JSON6902 file and a target by group,
kind and name, with the operations `add` and `test` (RFC 6902, as kustomize's patchjson6902 applies them through
github.com/evanphx/json-patch). Anything else raises, so a component using more fails the tests instead of
building differently from kustomize. Where kubectl is installed, tests/deploy/test_runtimes.py checks this build
against `kubectl kustomize`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

COMPONENT_API = ("kustomize.config.k8s.io/v1alpha1", "Component")
_TARGET_KEYS = {"group", "version", "kind", "name"}


def build_with_components(base: Path, components: list[Path]) -> list[dict]:
    """The documents of `base`'s kustomization (plain resource files) with each component applied in order."""
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    documents = [
        doc
        for name in kustomization["resources"]
        for doc in yaml.safe_load_all((base / name).read_text())
        if doc
    ]
    for component in components:
        documents = apply_component(documents, component)
    return documents


def apply_component(documents: list[dict], component: Path) -> list[dict]:
    spec = yaml.safe_load((component / "kustomization.yaml").read_text())
    if (spec.get("apiVersion"), spec.get("kind")) != COMPONENT_API:
        raise ValueError(f"{component}: not a kustomize Component")
    if set(spec) - {"apiVersion", "kind", "patches"}:
        raise NotImplementedError(f"{component}: only `patches` is implemented here")
    documents = copy.deepcopy(documents)
    for patch in spec["patches"]:
        if set(patch) != {"path", "target"} or set(patch["target"]) - _TARGET_KEYS:
            raise NotImplementedError(f"{component}: not a JSON6902 file with a target: {patch}")
        operations = yaml.safe_load((component / patch["path"]).read_text())
        matched = [doc for doc in documents if _matches(doc, patch["target"])]
        if not matched:
            raise ValueError(f"{component}: no resource matches {patch['target']}")
        for doc in matched:
            for operation in operations:
                _apply(doc, operation)
    return documents


def _matches(doc: dict, target: dict) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    actual = {"group": group, "version": version, "kind": doc["kind"], "name": doc["metadata"]["name"]}
    return all(actual[key] == wanted for key, wanted in target.items())


def _apply(doc: dict, operation: dict) -> None:
    *parents, last = [part.replace("~1", "/").replace("~0", "~") for part in operation["path"].split("/")[1:]]
    container = doc
    try:
        for part in parents:
            container = container[int(part)] if isinstance(container, list) else container[part]
    except (KeyError, IndexError):
        raise ValueError(f"{operation['op']} {operation['path']}: no such parent location") from None
    if operation["op"] == "test":
        actual = container[int(last)] if isinstance(container, list) else container.get(last)
        if actual != operation["value"]:
            raise ValueError(f"test failed at {operation['path']}: {actual!r} != {operation['value']!r}")
    elif operation["op"] == "add":
        value = copy.deepcopy(operation["value"])
        if isinstance(container, list):
            container.insert(len(container) if last == "-" else int(last), value)
        else:
            container[last] = value
    else:
        raise NotImplementedError(f"JSON6902 op {operation['op']!r}")
