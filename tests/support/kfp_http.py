"""Request records, errors and listing helpers of the KFP stand-in (kfp_standin.py)."""

from __future__ import annotations

import email.parser
import email.policy
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.support.kfp_validation import pipeline_spec_problem, upload_name_problem


@dataclass
class RecordedRequest:
    method: str
    path: str  # without the proxy prefix and query string
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    json: Any = None
    # multipart field -> (filename, content)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    proxy_namespace: str | None = None  # set when the request came through the Kubernetes service proxy

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _order_key(item: dict) -> int:
    return item["_order"]


def public(item: dict) -> dict:
    return {key: value for key, value in item.items() if not key.startswith("_")}


def filtered(items: list[dict], request: RecordedRequest) -> list[dict]:
    raw_filter = request.param("filter")
    if raw_filter:
        for predicate in json.loads(raw_filter).get("predicates", []):
            if predicate.get("operation") not in ("EQUALS", 1):
                raise ApiError(400, f"stand-in: unsupported filter operation {predicate.get('operation')!r}")
            expected = predicate.get("stringValue", predicate.get("string_value"))
            items = [i for i in items if i.get(predicate.get("key")) == expected]
    sort_by = (request.param("sort_by") or "").split()
    if sort_by and sort_by[0] != "created_at":
        raise ApiError(400, f"stand-in: unsupported sort_by {request.param('sort_by')!r}")
    items = sorted(items, key=_order_key, reverse=sort_by[1:] == ["desc"])
    page_size = int(request.param("page_size") or 0)
    return items[:page_size] if page_size > 0 else items


def listing(key: str, items: list[dict], request: RecordedRequest) -> dict:
    if not items:
        return {"total_size": 0}  # grpc-gateway omits empty repeated fields
    return {key: [public(i) for i in items], "total_size": len(items)}


def parse_multipart(content_type: str, raw: bytes) -> dict[str, tuple[str, bytes]]:
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw
    )
    if not message.is_multipart():
        raise ValueError("not a multipart body")
    files = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        files[name] = (part.get_filename() or "", part.get_payload(decode=True) or b"")
    return files


def uploaded_file(request: RecordedRequest) -> tuple[str, bytes]:
    if "uploadfile" not in request.files:
        raise ApiError(400, "InvalidInputError: Failed to read pipeline from file: no uploadfile part")
    return request.files["uploadfile"]


def uploaded_spec(filename: str, content: bytes) -> Any:
    """What the server stores as the version's pipeline_spec: the spec, or spec + platform spec together."""
    if not filename.endswith((".yaml", ".yml")):
        return {"archive": filename}  # archives are not unpacked (see the module docstring)
    try:
        documents = [d for d in yaml.safe_load_all(content) if d is not None]
    except yaml.YAMLError as error:
        raise ApiError(400, f"InvalidInputError: Failed to parse the pipeline YAML: {error}") from None
    if (
        not documents
        or not isinstance(documents[0], dict)
        or not {"pipelineInfo", "root"} <= set(documents[0])
    ):
        raise ApiError(
            400, "InvalidInputError: the file is not a compiled KFP v2 pipeline (pipelineInfo, root)"
        )
    # template/v2_template.go `NewV2SpecTemplate`, then common/utils.go `ValidatePipelineName`: both 400
    problem = pipeline_spec_problem(documents[0]) or upload_name_problem(documents[0])
    if problem:
        raise ApiError(400, problem)
    if len(documents) == 1:
        return documents[0]
    return {"pipeline_spec": documents[0], "platform_spec": documents[1]}
