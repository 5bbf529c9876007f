"""The model registry stand-in answers the real `model-registry` client (0.3.18) as the server does, and
refuses what the server refuses, with its status codes and error bodies (shown with raw urllib requests)."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
import warnings

import pytest

from tests.support.model_registry_standin import ModelRegistryStandin

API = "/api/model_registry/v1"
METADATA = {"epochs": 3, "learning_rate": 2e-05, "base_model": "Qwen/Qwen2.5-0.5B", "merged": True}


@pytest.fixture
def connect(tmp_path, monkeypatch):
    """A function that builds a client for a stand-in. The client makes a new SSL context for every call, even
    over plain HTTP, and loading the system CA store costs ~50 ms each time: an empty store makes it free. One
    event loop per test runs its coroutines, so the client never applies its nest_asyncio patch."""
    (tmp_path / "ca.pem").touch()
    (tmp_path / "certs").mkdir()
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "certs"))
    monkeypatch.delenv("KF_PIPELINES_SA_TOKEN_PATH", raising=False)  # the client reads a token from there
    from model_registry import ModelRegistry  # imported here: its import configures the root logger

    loop = asyncio.new_event_loop()

    def make(registry: ModelRegistryStandin, token: str | None = None) -> ModelRegistry:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="User access token is missing")  # expected without one
            return ModelRegistry(
                registry.address, registry.port, author="pipeline", is_secure=False, user_token=token,
                async_runner=loop.run_until_complete,
            )  # fmt: skip

    yield make
    loop.close()


def call(
    registry: ModelRegistryStandin, method: str, path: str, body: object = None, token: str | None = None
):
    """One raw request: (status, the JSON body parsed, or the text)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(registry.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request) as response:
            status, raw, kind = response.status, response.read(), response.headers["Content-Type"]
    except urllib.error.HTTPError as err:
        status, raw, kind = err.code, err.read(), err.headers["Content-Type"]
    return status, json.loads(raw) if kind.startswith("application/json") else raw.decode()


def register(client, version: str, **kwargs):
    uri = f"s3://models/llama-ft/{version}"
    formats = {"model_format_name": "safetensors", "model_format_version": "1"}
    return client.register_model("llama-ft", uri, version=version, **formats, **kwargs)


def test_register_model_reads_back_through_the_client_getters(connect):
    with ModelRegistryStandin() as registry:
        client = connect(registry)
        rm = register(client, "v1", metadata=METADATA)
        assert (rm.id, rm.name, rm.owner, rm.state.value) == ("1", "llama-ft", "pipeline", "LIVE")
        assert client.get_registered_model("llama-ft").id == rm.id
        mv = client.get_model_version("llama-ft", "v1")
        assert (mv.id, mv.registered_model_id, mv.author, mv.state.value) == ("2", "1", "pipeline", "LIVE")
        assert mv.custom_properties == METADATA
        ma = client.get_model_artifact("llama-ft", "v1")
        assert (ma.name, ma.uri) == ("llama-ft", "s3://models/llama-ft/v1")
        assert (ma.model_format_name, ma.model_format_version) == ("safetensors", "1")

        # Stored as the server answers: ids and times are digit strings, an int a string, a double a number.
        props = registry.model_versions[mv.id]["customProperties"]
        assert props["epochs"] == {"int_value": "3", "metadataType": "MetadataIntValue"}
        assert props["learning_rate"] == {"double_value": 2e-05, "metadataType": "MetadataDoubleValue"}
        assert registry.model_versions[mv.id]["createTimeSinceEpoch"].isdigit()
        assert registry.artifacts[ma.id]["artifactType"] == "model-artifact"
        assert registry.attributions == {(mv.id, ma.id)}
        assert [(m, p.split("?")[0], s) for m, p, s in registry.requests[:6]] == [
            ("GET", f"{API}/registered_models", 200),  # the constructor's probe
            ("GET", f"{API}/registered_model", 404),
            ("POST", f"{API}/registered_models", 201),
            ("GET", f"{API}/model_version", 404),
            ("POST", f"{API}/model_versions", 201),
            ("POST", f"{API}/model_versions/{mv.id}/artifacts", 201),
        ]


def test_a_second_version_updates_and_a_duplicate_version(connect):
    from model_registry.exceptions import StoreError
    from mr_openapi import ModelVersionState

    with ModelRegistryStandin() as registry:
        client = connect(registry)
        rm = register(client, "v1")
        register(client, "v2", metadata={"epochs": 5})
        assert [v.name for v in client.get_model_versions("llama-ft")] == ["v1", "v2"]
        assert len(registry.registered_models) == 1

        with pytest.raises(StoreError, match="already exists"):  # the client looks before it writes
            register(client, "v1")
        status, body = call(
            registry, "POST", f"{API}/model_versions", {"name": "v1", "registeredModelId": rm.id}
        )
        assert status == 409  # and the server refuses it too
        assert body == {"code": "Conflict", "message": "model version with name v1 already exists: conflict"}

        mv = client.get_model_version("llama-ft", "v2")
        mv.state, mv.description = ModelVersionState.ARCHIVED, "superseded"
        client.update(mv)
        ma = client.get_model_artifact("llama-ft", "v2")
        ma.storage_path = "llama-ft/v2"
        client.update(ma)
        again = client.get_model_version("llama-ft", "v2")
        assert (again.state.value, again.description) == ("ARCHIVED", "superseded")
        assert again.custom_properties == {"epochs": 5}  # an update that sends them keeps them
        assert client.get_model_artifact("llama-ft", "v2").storage_path == "llama-ft/v2"

        # A doc artifact beside the model artifact: the version lists both, or one type.
        doc = {"artifactType": "doc-artifact", "name": "card", "uri": "s3://models/llama-ft/v2/README.md"}
        artifacts = f"{API}/model_versions/{mv.id}/artifacts"
        assert call(registry, "POST", artifacts, doc)[0] == 201
        listed = call(registry, "GET", artifacts)[1]["items"]
        assert sorted(a["artifactType"] for a in listed) == ["doc-artifact", "model-artifact"]
        assert [
            a["name"] for a in call(registry, "GET", f"{artifacts}?artifactType=doc-artifact")[1]["items"]
        ] == ["card"]
        status, _ = call(registry, "GET", f"{API}/model_artifact?name=card&parentResourceId={mv.id}")
        assert status == 404  # a doc artifact is no model artifact


def test_with_a_token_only_requests_that_carry_it_get_through(connect):
    from mr_openapi.exceptions import UnauthorizedException

    with ModelRegistryStandin(token="sa-token", forbidden_token="other-sa-token") as registry:
        register(connect(registry, token="sa-token"), "v1")
        assert len(registry.model_versions) == 1
        with pytest.raises(UnauthorizedException):
            connect(registry)  # its first call, a list, is refused
        assert registry.requests[-1] == ("GET", f"{API}/registered_models?pageSize=1&sortOrder=ASC", 401)
        assert call(registry, "GET", f"{API}/registered_models", token="stale") == (401, "Unauthorized\n")
        status, text = call(registry, "GET", f"{API}/registered_models", token="other-sa-token")
        assert status == 403 and text.startswith("Forbidden (user=")


def with_prop(value: object) -> dict:
    return {"name": "x", "customProperties": {"p": value}}


INT = {"metadataType": "MetadataIntValue", "int_value": "3"}
FLOAT = {"metadataType": "MetadataFloatValue", "float_value": 1.0}  # no such member
STRUCT = {"metadataType": "MetadataStructValue", "struct_value": "no!"}  # not base64 of a JSON object
PROTO = {"metadataType": "MetadataProtoValue", "type": "t", "proto_value": ""}  # the DB layer cannot store it
UNKNOWN_FIELD = 'json: unknown field "ext_id"'  # clients/python/tests/regression_test.py expects this body
WRONG_TYPE = "json: cannot unmarshal number into Go struct field RegisteredModelCreate.name of type string"
NO_NAME = "required field 'name' is zero value."
CODES = {400: "Bad Request", 422: "Bad Request", 404: "Not Found", 409: "Conflict"}


def test_raw_requests_are_refused_as_the_server_refuses_them():
    with ModelRegistryStandin() as registry:
        models, versions = f"{API}/registered_models", f"{API}/model_versions"
        rm = call(registry, "POST", models, {"name": "m"})[1]
        version = {"name": "v1", "registeredModelId": rm["id"]}
        mv = call(registry, "POST", f"{models}/{rm['id']}/versions", version)[1]
        artifacts = f"{versions}/{mv['id']}/artifacts"
        cases = [  # (method, path, body, status, message or None)
            ("POST", models, {"name": "x", "ext_id": 123}, 400, UNKNOWN_FIELD),
            ("POST", models, {"name": 5}, 400, WRONG_TYPE),
            ("POST", models, {"name": "x", "state": "GONE"}, 400, "GONE is not a valid RegisteredModelState"),
            ("POST", models, {"description": "no name"}, 422, NO_NAME),  # 422, body code "Bad Request"
            ("POST", versions, {"registeredModelId": rm["id"]}, 422, NO_NAME),
            ("POST", models, with_prop({**INT, "int_value": 3}), 400, None),  # an int_value is a string
            ("POST", models, with_prop({**INT, "int_value": "three"}), 400, None),
            ("POST", models, with_prop({**INT, "int_value": "9999999999"}), 400, None),  # not an int32
            ("POST", models, with_prop({**INT, "string_value": "x"}), 400, None),
            ("POST", models, with_prop({"string_value": "no metadataType"}), 400, None),
            ("POST", models, with_prop(FLOAT), 400, None),
            ("POST", models, with_prop(STRUCT), 400, None),
            ("POST", models, with_prop(PROTO), 400, None),
            ("POST", models, with_prop("plain"), 400, None),
            ("POST", models, b"{not json", 400, None),
            ("POST", models, {"name": "m"}, 409, "registered model with name m already exists: conflict"),
            ("PATCH", f"{models}/{rm['id']}", {"name": "renamed"}, 400, 'json: unknown field "name"'),
            ("POST", artifacts, {"artifactType": "model-artifact", "format": "onnx"}, 400,
             'json: unknown field "format"'),
            ("POST", artifacts, {"artifactType": "dataset", "uri": "s3://x"}, 400, None),
            ("POST", f"{versions}/999/artifacts", {"artifactType": "model-artifact"}, 404, None),
            ("GET", f"{models}/999", None, 404, "no registered model found for id 999: not found"),
            ("GET", f"{models}/abc", None, 400, None),
            ("GET", f"{versions}/999", None, 404, "no model version found for id 999: not found"),
            ("GET", f"{API}/model_artifacts/999", None, 404, None),
            ("GET", f"{API}/registered_model?name=nope", None, 404, None),
            ("GET", f"{API}/registered_model", None, 400, None),
            ("GET", f"{API}/model_version?name=v1", None, 400, None),  # a name needs its parentResourceId
        ]  # fmt: skip
        for method, path, body, status, message in cases:
            got, answer = call(registry, method, path, body)
            assert got == status, (method, path, body, answer)
            code = CODES[status]  # error.go: http.StatusText, "Bad Request" for a 422 too
            assert answer["code"] == code and (message is None or answer["message"] == message), answer
        assert (len(registry.registered_models), len(registry.model_versions), len(registry.artifacts)) == (
            1,
            1,
            0,
        )
        assert call(registry, "GET", f"{API}/nothing_here") == (404, "404 page not found\n")
        assert call(registry, "DELETE", f"{models}/{rm['id']}")[0] == 405

        # Well-formed values of every stored kind are taken and answered as sent, under the older prefix too.
        props = {
            "epochs": {"metadataType": "MetadataIntValue", "int_value": "-3"},
            "loss": {"metadataType": "MetadataDoubleValue", "double_value": 0.25},
            "base": {"metadataType": "MetadataStringValue", "string_value": "qwen"},
            "merged": {"metadataType": "MetadataBoolValue", "bool_value": False},
            "shape": {
                "metadataType": "MetadataStructValue",
                "struct_value": base64.b64encode(b'{"n": 1}').decode(),
            },
        }
        alpha = "/api/model_registry/v1alpha3/registered_models"
        status, made = call(registry, "POST", alpha, {"name": "y", "customProperties": props})
        assert status == 201 and made["customProperties"] == props and made["state"] == "LIVE"


def test_lists_are_paged_as_the_server_pages_them(connect):
    models = f"{API}/registered_models"
    with ModelRegistryStandin() as registry:
        for name in ("a", "b", "c"):
            assert call(registry, "POST", models, {"name": name})[0] == 201
        first = call(registry, "GET", f"{models}?pageSize=2")[1]
        assert [m["name"] for m in first["items"]] == ["a", "b"] and (first["size"], first["pageSize"]) == (
            2,
            2,
        )
        rest = call(registry, "GET", f"{models}?pageSize=2&nextPageToken={first['nextPageToken']}")[1]
        assert [m["name"] for m in rest["items"]] == ["c"] and rest["nextPageToken"] == ""
        every = call(registry, "GET", f"{models}?orderBy=CREATE_TIME&sortOrder=DESC")[1]
        assert [m["name"] for m in every["items"]] == ["c", "b", "a"] and every["pageSize"] == 0
        assert call(registry, "GET", f"{models}?nextPageToken=bogus")[0] == 400
        assert call(registry, "GET", f"{models}?orderBy=NAME")[0] == 400
        assert call(registry, "GET", f"{models}?filterQuery=name%3D%27a%27")[0] == 501  # not emulated
        # The client's pager follows the tokens until it sees the first page again.
        assert [m.name for m in connect(registry).get_registered_models().page_size(2)] == ["a", "b", "c"]
