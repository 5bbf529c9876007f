"""A local Kubeflow Model Registry stand-in: the `model-registry` server's REST API (kubeflow/hub, formerly
kubeflow/model-registry) on 127.0.0.1 over HTTP, for tests that drive the real `model-registry` client.

The pinned client (model-registry 0.3.18) calls `/api/model_registry/v1/...`
(api/openapi/model-registry-v1.yaml); the server (cmd/proxy.go) mounts that v1 controller beside the v1alpha3
one on one core, so both prefixes are served, with the v1 schemas. Read at
red-hat-data-services/model-registry 7f15cb00, which carries kubeflow/hub's v1 API (the
kubeflow/model-registry snapshot at hand has only v1alpha3, with the same controller and errors).

As the server (paths in that repository): bodies are decoded with DisallowUnknownFields into pkg/openapi's Go
structs, and any decode error (unknown field, wrong JSON type, bad enum) answers 400 {"code": "Bad Request",
"message": ...} (internal/server/openapi/v1/api_model_registry_service.go, error.go: ParsingError); a required
field absent or empty answers 422 with code "Bad Request" (type_asserts.go: RequiredError); customProperties
the DB cannot store answer 400 (internal/converter/openapi_embedmd_converter_util.go
MapOpenAPICustomPropertiesEmbedMD); a non-int32 id answers 400, an unknown one 404
(internal/platform/apiutils/api_utils.go, internal/core/*.go); a duplicate name or externalId answers 409
(internal/core/*.go: gorm.ErrDuplicatedKey -> api.ErrConflict). Ids are int32 strings from one sequence per DB
table, times ms-since-epoch strings, lists are cut by keyset (internal/platform/db/scopes/paginate.go).
Stricter on purpose (never kinder): unknown fields are refused inside artifact bodies and MetadataValues too
(the server reads those oneOf members leniently; the spec says additionalProperties: false), names match case
sensitively, a MetadataValue needs its value field, a version needs an existing registered model (the server
stores an orphan), bad pageSize/orderBy/sortOrder/artifactType answer 400 (the server uses defaults), and list
filters it does not emulate (filterQuery, name, externalId) answer 501.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
import time
import urllib.parse
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Field kinds, named after the Go types the server decodes into (its error messages name them).
STR, STRS, NUM, INT, PROPS = "string", "[]string", "float64", "int64", "map[string]openapi.MetadataValue"
_ART_STATES = ("UNKNOWN", "PENDING", "LIVE", "MARKED_FOR_DELETION", "DELETED", "ABANDONED", "REFERENCE")
RM_STATE = ("RegisteredModelState", ("LIVE", "ARCHIVED"))  # v1 spec: RegisteredModelState
MV_STATE = ("ModelVersionState", ("LIVE", "ARCHIVED"))  # v1 spec: ModelVersionState
ART_STATE = ("ArtifactState", _ART_STATES)  # v1 spec: ArtifactState

# Request schemas: only the parts used, from api/openapi/model-registry-v1.yaml components.schemas, with
# the field sets of the Go structs in pkg/openapi/model_*.go that the server decodes into.
_UPDATE = {"customProperties": PROPS, "description": STR, "externalId": STR}  # BaseResourceUpdate
RM_UPDATE = {  # RegisteredModelUpdate = BaseResourceUpdate + BaseModel + owner, state
    **_UPDATE, "readme": STR, "maturity": STR, "language": STRS, "tasks": STRS, "provider": STR, "logo": STR,
    "license": STR, "licenseLink": STR, "libraryName": STR, "owner": STR, "state": RM_STATE,
}  # fmt: skip
RM_CREATE = {**RM_UPDATE, "name": STR}  # RegisteredModelCreate (required: name)
MV_UPDATE = {**_UPDATE, "state": MV_STATE, "author": STR}  # ModelVersionUpdate
MV_CREATE = {**MV_UPDATE, "name": STR, "registeredModelId": STR}  # ModelVersionCreate (required: both)
MA_UPDATE = {  # ModelArtifactUpdate
    **_UPDATE, "artifactType": STR, "modelFormatName": STR, "storageKey": STR, "storagePath": STR,
    "modelFormatVersion": STR, "serviceAccountName": STR, "modelSourceKind": STR, "modelSourceClass": STR,
    "modelSourceGroup": STR, "modelSourceId": STR, "modelSourceName": STR, "uri": STR, "state": ART_STATE,
}  # fmt: skip
_FULL = {"name": STR, "id": STR, "createTimeSinceEpoch": STR, "lastUpdateTimeSinceEpoch": STR}  # BaseResource
# The `Artifact` oneOf of the version artifacts upsert, discriminated by artifactType (v1 spec: Artifact; Go
# structs ModelArtifact, DocArtifact, Metric). Metric.step is a JSON number: Go has *int64 (the spec: string).
ARTIFACTS = {
    "model-artifact": ("ModelArtifact", {**MA_UPDATE, **_FULL}),
    "doc-artifact": ("DocArtifact", {**_UPDATE, "artifactType": STR, "uri": STR, "state": ART_STATE,
                                     **_FULL}),
    "metric": ("Metric", {**_UPDATE, "artifactType": STR, "value": NUM, "timestamp": STR, "step": INT,
                          "state": ART_STATE, **_FULL}),
}  # fmt: skip
# MetadataValue members by metadataType (v1 spec: Metadata*Value): value field, JSON kind, Go type. The spec
# also has MetadataProtoValue, but the DB mapping has no case for it (the server answers 400): left out.
METADATA = {
    "MetadataStringValue": ("string_value", "string", "string"),
    "MetadataIntValue": ("int_value", "string", "string"),  # an int32 written as a string
    "MetadataDoubleValue": ("double_value", "number", "float64"),
    "MetadataBoolValue": ("bool_value", "bool", "bool"),
    "MetadataStructValue": ("struct_value", "string", "string"),  # base64 of a JSON object
}
_JSON_KIND = {bool: "bool", int: "number", float: "number", str: "string", list: "array", dict: "object"}
_ORDER = {"ID": "id", "CREATE_TIME": "createTimeSinceEpoch", "LAST_UPDATE_TIME": "lastUpdateTimeSinceEpoch"}
_ART_TYPES = (*ARTIFACTS, "dataset-artifact", "parameter")  # v1 spec: ArtifactTypeQueryParam


class _Error(Exception):
    """An answer other than success: `body` is the server's Error JSON, or text from the proxy or router."""

    def __init__(self, status: int, message: str, *, text: bool = False):
        super().__init__(message)
        code = HTTPStatus(400 if status == 422 else status).phrase  # error.go: RequiredError says Bad Request
        self.status, self.body = status, (message if text else {"code": code, "message": message})


def _bad(message: str) -> _Error:
    return _Error(400, message)


def _kind(value: object) -> str:
    return _JSON_KIND.get(type(value), "null")


def _type_error(value: object, owner: str, field: str, go_type: str) -> _Error:
    where = f"Go struct field {owner}.{field} of type {go_type}"
    return _bad(f"json: cannot unmarshal {_kind(value)} into {where}")


def _is_int32(text: str) -> bool:
    """Whether strconv.ParseInt(text, 10, 32) reads it."""
    return bool(re.fullmatch(r"[+-]?[0-9]+", text)) and -(2**31) <= int(text) < 2**31


def _int32(text: str, label: str) -> str:
    """An id as the server reads it (ValidateIDAsInt32: "007" is 7), else 400."""
    if not _is_int32(text):
        raise _bad(f'invalid {label} ID: strconv.ParseInt: parsing "{text}": invalid syntax: bad request')
    return str(int(text))


def _metadata(key: str, value: object) -> dict:
    """One customProperties value, as pkg/openapi/model_metadata_value.go decodes it and
    MapOpenAPICustomPropertiesEmbedMD stores it."""
    if not isinstance(value, dict):
        raise _bad("failed to unmarshal JSON into map for the discriminator lookup")
    mtype = value.get("metadataType")
    if mtype not in METADATA:
        raise _bad(f"bad request: metadataType not found for {key}: bad request")
    field, kind, go_type = METADATA[mtype]
    prefix = f"failed to unmarshal MetadataValue as {mtype}: "
    if extra := sorted(set(value) - {"metadataType", field}):
        raise _bad(f'{prefix}json: unknown field "{extra[0]}"')
    if _kind(value.get(field)) != kind:
        raise _bad(prefix + str(_type_error(value.get(field), mtype, field, go_type)))
    v = value[field]
    if mtype == "MetadataIntValue" and not _is_int32(v):
        raise _bad(f"bad request: unable to decode as int64 invalid numeric string {v!r} for key {key}")
    if mtype == "MetadataStructValue":
        try:
            if not isinstance(json.loads(base64.b64decode(v, validate=True)), dict):
                raise ValueError("not a JSON object")
        except (ValueError, binascii.Error):
            raise _bad(f"bad request: unable to decode struct_value for key {key}: bad request") from None
    return {field: v, "metadataType": mtype}


def _decode(body: bytes, type_name: str, schema: dict) -> dict:
    """A request body as json.Decoder with DisallowUnknownFields reads it into the Go struct `type_name`."""
    if not body.strip():
        raise _bad("EOF")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise _bad(f"invalid character in JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _bad(f"json: cannot unmarshal {_kind(doc)} into Go value of type openapi.{type_name}")
    out = {}
    for field, value in doc.items():
        if field not in schema:
            raise _bad(f'json: unknown field "{field}"')
        if value is None:  # encoding/json leaves a field it reads null from at its zero value
            continue
        kind = schema[field]
        if isinstance(kind, tuple):  # an enum: its UnmarshalJSON refuses values outside the list
            if not isinstance(value, str):
                raise _type_error(value, type_name, field, kind[0])
            if value not in kind[1]:
                raise _bad(f"{value} is not a valid {kind[0]}")
        elif kind == PROPS:
            if not isinstance(value, dict):
                raise _type_error(value, type_name, field, PROPS)
            value = {k: _metadata(k, v) for k, v in value.items()}
        elif kind == STRS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise _type_error(value, type_name, field, STRS)
        elif _kind(value) != ("string" if kind == STR else "number") or (
            kind == INT and type(value) is float
        ):
            raise _type_error(value, type_name, field, kind)
        out[field] = value
    return out


def _require(doc: dict, *fields: str) -> None:
    for field in fields:  # type_asserts.go: IsZeroValue -> RequiredError -> 422
        if not doc.get(field):
            raise _Error(422, f"required field '{field}' is zero value.")


def _page(rows: list[dict], q: dict[str, str]) -> dict:
    """One page as internal/platform/db/scopes/paginate.go cuts it: ordered by orderBy (default ID) then id,
    ASC unless sortOrder=DESC; nextPageToken is base64("<id>:<order value>") of the page's last row."""
    size, order, sort = q.get("pageSize", ""), q.get("orderBy") or "ID", q.get("sortOrder") or "ASC"
    if size and not re.fullmatch(r"[1-9][0-9]{0,8}", size):
        raise _bad(f"invalid numeric string: strconv.ParseInt: parsing {size!r}: invalid syntax: bad request")
    if order not in _ORDER or sort not in ("ASC", "DESC"):
        raise _bad(f"invalid orderBy {order!r} or sortOrder {sort!r}: bad request")
    if unemulated := [k for k in ("filterQuery", "name", "externalId") if q.get(k)]:
        raise _Error(501, f"{unemulated[0]} is not emulated by the model registry stand-in")

    def key(row: dict) -> tuple[int, int]:
        return int(row[_ORDER[order]]), int(row["id"])

    rows = sorted(rows, key=key, reverse=sort == "DESC")
    if token := q.get("nextPageToken"):
        try:
            row_id, value = base64.b64decode(token, validate=True).decode().split(":", 1)
            cursor = (int(value), int(row_id))
        except (ValueError, binascii.Error):
            raise _bad("invalid nextPageToken: invalid cursor format: bad request") from None
        rows = [r for r in rows if (key(r) > cursor if sort == "ASC" else key(r) < cursor)]
    limit = int(size or 0)
    page = rows[:limit] if limit else rows
    last = page[-1] if limit and len(rows) > limit else None
    nxt = base64.b64encode(f"{last['id']}:{key(last)[0]}".encode()).decode() if last else ""
    return {"items": page, "nextPageToken": nxt, "pageSize": limit, "size": len(page)}


class ModelRegistryStandin:
    """Run with `with ModelRegistryStandin() as registry:`; point the client at `registry.address`, `.port`.

    `token`: requests must carry `Authorization: Bearer <token>`. The server has no auth of its own;
    deployments put kube-rbac-proxy in front of it (opendatahub-io/model-registry-operator
    internal/controller/config/templates/kube-rbac-proxy/), which answers 401 "Unauthorized" (text) without a
    token or for one the cluster does not know (TokenReview), and 403 "Forbidden (...)" for a known token
    without `get` on the registry's Service (brancz/kube-rbac-proxy pkg/filters/auth.go): `forbidden_token`.
    """

    def __init__(self, token: str | None = None, *, forbidden_token: str | None = None) -> None:
        self.token, self.forbidden_token = token, forbidden_token
        self.registered_models: dict[str, dict] = {}  # id -> the JSON the server answers with
        self.model_versions: dict[str, dict] = {}
        self.artifacts: dict[str, dict] = {}
        self.attributions: set[tuple[str, str]] = set()  # (version id, artifact id): the Attribution table
        self.requests: list[tuple[str, str, int]] = []  # (method, path with query, status), in order
        self._owner: dict[str, str] = {}  # artifact id -> the version it was made in (its stored name prefix)
        self._ids = {"context": 0, "artifact": 0}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        # a short poll: shutdown() waits for the serving loop's next look at its flag
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self.address = "http://127.0.0.1"
        self.port: int = self._server.server_address[1]
        self.url = f"{self.address}:{self.port}"

    def __enter__(self) -> ModelRegistryStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, method: str, target: str, authorization: str | None, body: bytes) -> tuple[int, object]:
        """Status and body for one request (one at a time: the state is small), recorded in `requests`."""
        with self._lock:
            try:
                status, doc = self._route(method, target, authorization, body)
            except _Error as err:
                status, doc = err.status, err.body
            self.requests.append((method, target, status))
        return status, doc

    def _route(self, method: str, target: str, authorization: str | None, body: bytes) -> tuple[int, object]:
        if self.token is not None:  # the proxy answers before the server sees anything
            scheme, _, token = (authorization or "").partition(" ")
            if scheme.lower() != "bearer" or token not in (self.token, self.forbidden_token):
                raise _Error(401, "Unauthorized\n", text=True)
            if token == self.forbidden_token:
                who = "user=system:serviceaccount:ns:sa, verb=get, resource=services, subresource="
                raise _Error(403, f"Forbidden ({who})\n", text=True)
        url = urllib.parse.urlsplit(target)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        api = re.fullmatch(r"/api/model_registry/(?:v1|v1alpha3)(/.*)", url.path)
        for pattern, methods in _ROUTES if api else ():
            if found := re.fullmatch(pattern, api.group(1)):
                if method not in methods:
                    raise _Error(405, "", text=True)  # chi: 405, empty body
                return getattr(self, methods[method])(*found.groups(), q=query, body=body)
        raise _Error(404, "404 page not found\n", text=True)  # chi's NotFound

    # --- storage, as internal/platform/db/repository/generic_repository.go Save does it ---------------------

    def _put(self, table: dict, doc: dict, old: dict | None, label: str, key=None) -> dict:
        """Insert `doc` (new id, both times) or merge it into `old` (new update time); 409 on a UNIQUE key:
        the same `key(row)` (a name in its scope) in `table`, or the same externalId in the same DB table."""
        now = str(time.time_ns() // 1_000_000)
        if old is None:
            kind = "artifact" if table is self.artifacts else "context"
            self._ids[kind] += 1
            doc = {**doc, "id": str(self._ids[kind]), "createTimeSinceEpoch": now}
        doc = {**(old or {}), **doc, "lastUpdateTimeSinceEpoch": now}
        peers = [*self.registered_models.values(), *self.model_versions.values()]  # one Context table
        peers = [o for o in (table.values() if table is self.artifacts else peers) if o["id"] != doc["id"]]
        ext = doc.get("externalId")
        for o in peers:  # ids are unique across the Context table, so `o["id"] in table` tells the kind
            if ext and o.get("externalId") == ext or key and o["id"] in table and key(o) == key(doc):
                raise _Error(409, f"{label} with name {doc.get('name')} already exists: conflict")
        if not doc.get("customProperties"):
            doc.pop("customProperties", None)  # Go: a map with omitempty
        table[doc["id"]] = doc
        return doc

    def _get(self, table: dict, row_id: str, label: str) -> dict:
        row_id = _int32(row_id, label)
        if row_id not in table:
            raise _Error(404, f"no {label} found for id {row_id}: not found")
        return table[row_id]

    @staticmethod
    def _find(rows, q: dict, what: str, parent_of=None) -> dict:
        """The one row a Find call names: by name (in parentResourceId where the call has a parent), else by
        externalId; none or several answer 404 (internal/core/*.go Get*ByParams)."""
        name, parent, ext = q.get("name"), q.get("parentResourceId"), q.get("externalId")
        if (not name or parent_of and not parent) and not ext:
            needed = "(name and parentResourceId)" if parent_of else "name"
            raise _bad(f"invalid parameters call, supply either {needed}, or externalId: bad request")
        # FindRegisteredModel takes no parentResourceId; the others match it against the row's parent
        parent = _int32(parent, "parent resource") if parent and parent_of else None
        named = (lambda r: r["name"] == name) if name else (lambda r: r.get("externalId") == ext)
        hits = [r for r in rows if named(r) and parent in (None, parent_of and parent_of(r))]
        if len(hits) != 1:
            found = "multiple" if hits else "no"
            raise _Error(404, f"{found} {what} found for name={name}, externalId={ext}: not found")
        return hits[0]

    # --- registered models: internal/core/registered_model.go -----------------------------------------------

    def create_model(self, q: dict, body: bytes) -> tuple[int, dict]:
        doc = _decode(body, "RegisteredModelCreate", RM_CREATE)
        _require(doc, "name")
        doc = {"state": "LIVE", **doc}  # NewRegisteredModelCreateWithDefaults
        return 201, self._put(self.registered_models, doc, None, "registered model", key=lambda r: r["name"])

    def get_model(self, rm_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        return 200, self._get(self.registered_models, rm_id, "registered model")

    def update_model(self, rm_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        old = self._get(self.registered_models, rm_id, "registered model")
        # the fields given replace the stored ones; customProperties as a whole
        doc = _decode(body, "RegisteredModelUpdate", RM_UPDATE)
        return 200, self._put(self.registered_models, doc, old, "registered model")

    def find_model(self, q: dict, body: bytes) -> tuple[int, dict]:
        return 200, self._find(self.registered_models.values(), q, "registered models")

    def list_models(self, q: dict, body: bytes) -> tuple[int, dict]:
        return 200, _page(list(self.registered_models.values()), q)

    # --- model versions: internal/core/model_version.go -----------------------------------------------------

    def _create_version(self, doc: dict, rm_id: str) -> tuple[int, dict]:
        rm_id = self._get(self.registered_models, rm_id, "registered model")["id"]  # stricter: no orphans
        doc = {"state": "LIVE", **doc, "registeredModelId": rm_id}  # NewModelVersion(Create)WithDefaults
        key = lambda r: (r["registeredModelId"], r["name"])  # noqa: E731 (stored as "<model id>:<name>")
        return 201, self._put(self.model_versions, doc, None, "model version", key)

    def create_version(self, q: dict, body: bytes) -> tuple[int, dict]:
        doc = _decode(body, "ModelVersionCreate", MV_CREATE)
        _require(doc, "name", "registeredModelId")
        return self._create_version(doc, doc["registeredModelId"])

    def create_model_version(self, rm_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        doc = _decode(body, "ModelVersion", MV_CREATE)
        _require(doc, "name", "registeredModelId")  # AssertModelVersionRequired, though the path has the id
        return self._create_version(doc, rm_id)

    def get_version(self, mv_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        return 200, self._get(self.model_versions, mv_id, "model version")

    def update_version(self, mv_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        old = self._get(self.model_versions, mv_id, "model version")
        doc = _decode(body, "ModelVersionUpdate", MV_UPDATE)
        return 200, self._put(self.model_versions, doc, old, "model version")

    def find_version(self, q: dict, body: bytes) -> tuple[int, dict]:
        versions = self.model_versions.values()
        return 200, self._find(versions, q, "model versions", lambda v: v["registeredModelId"])

    def list_model_versions(self, rm_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        rm_id = _int32(rm_id, "registered model")  # an unknown model lists nothing, as upstream
        rows = [v for v in self.model_versions.values() if v["registeredModelId"] == rm_id]
        return 200, _page(rows, q)

    # --- artifacts: internal/core/artifact.go ---------------------------------------------------------------

    def upsert_version_artifact(self, mv_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        mv_id = self._get(self.model_versions, mv_id, "model version")["id"]  # UpsertModelVersionArtifact
        try:
            kind = json.loads(body).get("artifactType")
        except (ValueError, AttributeError):
            why = "failed to unmarshal JSON into map for the discriminator lookup" if body.strip() else "EOF"
            raise _bad(why) from None
        if kind not in ARTIFACTS:
            kinds = "ModelArtifact, DocArtifact, DataSet, Metric, or Parameter"
            raise _bad(f"invalid artifact type, must be either {kinds}: bad request")
        doc = _decode(body, *ARTIFACTS[kind])
        for server_set in ("createTimeSinceEpoch", "lastUpdateTimeSinceEpoch"):  # Save sets them
            doc.pop(server_set, None)
        label = kind.removesuffix("-artifact") + " artifact"
        if art_id := doc.pop("id", None):  # an update of a stored artifact, which this version then lists too
            old = self.artifacts.get(_int32(art_id, "artifact"))
            if old is None or old["artifactType"] != kind:
                raise _bad(f"mismatched types, artifact with id {art_id} is not a {label}: bad request")
            doc.pop("name", None)  # not editable once set
            self.attributions.add((mv_id, old["id"]))
            return 200, self._put(self.artifacts, doc, old, label)
        doc = {"name": str(uuid.uuid4()), **doc}  # ensureArtifactName
        key = lambda a: (a["artifactType"], self._owner.get(a["id"], mv_id), a["name"])  # noqa: E731
        row = self._put(self.artifacts, doc, None, label, key)  # stored as "<version id>:<name>", per type
        self._owner[row["id"]] = mv_id
        self.attributions.add((mv_id, row["id"]))
        return 201, row

    def list_version_artifacts(self, mv_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        mv_id, kind = _int32(mv_id, "parent resource"), q.get("artifactType")
        if kind and kind not in _ART_TYPES:
            raise _bad(f"invalid artifactType {kind!r}: bad request")
        rows = [self.artifacts[a] for v, a in self.attributions if v == mv_id]
        return 200, _page([a for a in rows if kind in (None, "", a["artifactType"])], q)

    def get_model_artifact(self, art_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        row = self.artifacts.get(_int32(art_id, "model artifact"))
        if row is None or row["artifactType"] != "model-artifact":
            raise _Error(404, f"no model artifact found for id {art_id}: not found")
        return 200, row

    def update_model_artifact(self, art_id: str, q: dict, body: bytes) -> tuple[int, dict]:
        old = self.get_model_artifact(art_id, q, b"")[1]
        doc = _decode(body, "ModelArtifactUpdate", MA_UPDATE)
        if doc.get("artifactType", "model-artifact") != "model-artifact":  # stricter: the type cannot change
            raise _bad(f"artifact with id {art_id} is a model artifact: bad request")
        return 200, self._put(self.artifacts, doc, old, "model artifact")

    def find_model_artifact(self, q: dict, body: bytes) -> tuple[int, dict]:
        row = self._find(self.artifacts.values(), q, "model artifacts", lambda a: self._owner.get(a["id"]))
        if row["artifactType"] != "model-artifact":  # GetModelArtifactByParams
            raise _Error(404, f"artifact with name={row['name']} is not a model artifact: not found")
        return 200, row


_ID = r"([^/]+)"
_ROUTES = [  # the v1 routes used here (internal/server/openapi/v1/api_model_registry_service.go Routes)
    ("/registered_models", {"GET": "list_models", "POST": "create_model"}),
    (f"/registered_models/{_ID}", {"GET": "get_model", "PATCH": "update_model"}),
    (f"/registered_models/{_ID}/versions", {"GET": "list_model_versions", "POST": "create_model_version"}),
    ("/registered_model", {"GET": "find_model"}),
    ("/model_versions", {"POST": "create_version"}),
    (f"/model_versions/{_ID}", {"GET": "get_version", "PATCH": "update_version"}),
    (
        f"/model_versions/{_ID}/artifacts",
        {"GET": "list_version_artifacts", "POST": "upsert_version_artifact"},
    ),
    ("/model_version", {"GET": "find_version"}),
    (f"/model_artifacts/{_ID}", {"GET": "get_model_artifact", "PATCH": "update_model_artifact"}),
    ("/model_artifact", {"GET": "find_model_artifact"}),
]


def _make_handler(registry: ModelRegistryStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # the client keeps connections alive

        def log_message(self, *args) -> None:  # keep test output quiet
            pass

        def do_GET(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, doc = registry._answer(self.command, self.path, self.headers.get("Authorization"), body)
            text = isinstance(doc, str)  # the proxy's and the router's plain-text answers
            data = (doc if text else json.dumps(doc)).encode()
            self.send_response(status)
            self.send_header("Content-Type", f"{'text/plain' if text else 'application/json'}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

    return Handler
