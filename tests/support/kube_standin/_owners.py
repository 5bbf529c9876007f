"""ownerReferences as the API server validates them and the garbage collector honours them, and the JSON merge
patch that changes them.

Upstream (kubernetes):
  * apimachinery pkg/api/validation/objectmeta.go (ValidateOwnerReferences): apiVersion, kind, name and uid are
    required, at most one reference may be the controller.
  * pkg/controller/garbagecollector/garbagecollector.go (attemptToDeleteItem, classifyReferences): an object whose
    owners are all absent is deleted (Background); an owner counts as absent when no object of its kind and uid
    exists *in the dependent's namespace* (a namespaced dependent cannot be owned across namespaces, so such a
    reference is treated as absent); an owner of a kind the collector cannot resolve is left alone.
  * apimachinery pkg/util/jsonmergepatch / RFC 7386 (the ``application/merge-patch+json`` PATCH of a custom
    resource): objects merge key by key, ``null`` deletes, anything else (lists included) replaces.
"""

from __future__ import annotations

import copy
from typing import Any

from ._common import PLURAL_OF_KIND
from ._store import Store

REQUIRED = ("apiVersion", "kind", "name", "uid")


def owner_reference_errors(meta: dict) -> list[tuple[str, str]]:
    """(field, message) for each invalid owner reference, as the 422 Invalid lists them."""
    errors = []
    references = meta.get("ownerReferences") or []
    for reference in references:
        for key in REQUIRED:
            if not (reference or {}).get(key):
                errors.append(
                    (f"metadata.ownerReferences.{key}", f'Invalid value: "": {key} must not be empty')
                )
    if sum(bool((r or {}).get("controller")) for r in references) > 1:
        errors.append(
            ("metadata.ownerReferences", "Invalid value: only one reference can have Controller set to true")
        )
    return errors


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: ``patch`` applied to a copy of ``target``."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = json_merge_patch(merged.get(key), value)
    return merged


def owner_absent(store: Store, namespace: str, reference: dict) -> bool | None:
    """True when the owner does not exist in ``namespace`` (by kind and uid), None for a kind not served here."""
    plural = PLURAL_OF_KIND.get(reference.get("kind", ""))
    if plural is None:
        return None
    found = store.find(plural, namespace, reference.get("name", ""))
    return found is None or found["metadata"].get("uid") != reference.get("uid")


def orphans(store: Store, namespace: str) -> list[dict]:
    """The TrainJobs of ``namespace`` that have owners and whose owners are all absent."""
    found = []
    for job in store.list_objects("trainjobs", namespace):
        references = job["metadata"].get("ownerReferences") or []
        if references and all(owner_absent(store, namespace, r) for r in references):
            found.append(job)
    return found
