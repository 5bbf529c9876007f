"""Kubeflow Model Registry: its address checked, its Python client (`model-registry`) connected, and what it
answers turned into messages that name the parameter to change. register-model writes through it; pre-flight
checks, before any GPU time, that the registry answers with the token and that the version is still free.

Credentials: a bearer token from MODEL_REGISTRY_TOKEN (the Secret named by registry_secret); without one the
client reads the pod's service-account token (KF_PIPELINES_SA_TOKEN_PATH, else Kubernetes' default path), which is
what a registry behind kube-rbac-proxy takes. The token never appears in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import urllib.parse
import warnings
from collections.abc import Iterator
from typing import Any

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.redact import credentials_in

TOKEN_ENV = "MODEL_REGISTRY_TOKEN"
_FIX_TOKEN = (
    "give the step a token the registry accepts: a Secret named by registry_secret with MODEL_REGISTRY_TOKEN, or a "
    "service account the registry grants access"
)


class RegistryError(RuntimeError):
    """The Model Registry refused or could not be reached; the message names the fix."""


def check_address(address: str) -> str:
    """`address` (http[s]://host[:port]) as the client takes it; SettingError naming registry_address otherwise."""
    parsed = urllib.parse.urlparse(address.strip())
    if credentials_in(address):
        raise SettingError(
            "registry_address", "carries credentials: give the token through registry_secret instead"
        )
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path.strip("/"):
        raise SettingError(
            "registry_address",
            f"must be the Model Registry's http(s)://host[:port] (e.g. https://model-registry.kubeflow.svc:8443), "
            f"not {address!r}",
        )
    return address.strip().rstrip("/")


def connect(address: str, author: str) -> Any:
    """The client, connected (its constructor reads one page of registered models: the token is checked)."""
    from model_registry import ModelRegistry

    address = check_address(address)
    token = os.environ.get(TOKEN_ENV) or None
    with mapped(address), warnings.catch_warnings():
        # Without a token of ours the client warns before it falls back to the service-account token.
        warnings.filterwarnings("ignore", message="User access token is missing")
        return ModelRegistry(
            address, author=author, user_token=token, log_level=logging.ERROR, async_runner=_run_coroutine
        )


def _run_coroutine(coroutine: Any) -> Any:
    """The client's calls, on one event loop of ours: without a runner it patches asyncio process-wide
    (nest_asyncio) to run them."""
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP.run_until_complete(coroutine)


_LOOP: asyncio.AbstractEventLoop | None = None


@contextlib.contextmanager
def mapped(address: str, what: str = "reach") -> Iterator[None]:
    """The client's errors as RegistryError messages that name the address and the fix."""
    from model_registry.exceptions import StoreError
    from mr_openapi.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        raise RegistryError(_answer(address, what, exc.status, exc.body or exc.reason)) from None
    except StoreError as exc:
        if "token" in str(exc):
            raise RegistryError(
                f"the Model Registry at {address} needs a token for https: {_FIX_TOKEN}."
            ) from None
        raise RegistryError(f"the Model Registry at {address} refused to {what}: {exc}") from None
    except OSError as exc:  # aiohttp's connection errors are OSErrors
        raise RegistryError(
            f"cannot reach the Model Registry at {address} ({type(exc).__name__}: {exc}): check registry_address."
        ) from None


def _answer(address: str, what: str, status: int | None, body: Any) -> str:
    if status in (401, 403):
        return f"the Model Registry at {address} refused the token (HTTP {status}) to {what}: {_FIX_TOKEN}."
    shown = str(body or "")[:300]
    return f"the Model Registry at {address} answered HTTP {status} to {what}: {shown}"


def existing_version(client: Any, model_name: str, version: str) -> Any:
    """The registered version `version` of `model_name`, or None (also when the model is not registered)."""
    if client.get_registered_model(model_name) is None:
        return None
    return client.get_model_version(model_name, version)


def probe(address: str, model_name: str, version: str) -> tuple[str, str] | None:
    """Pre-flight: None when the registry answers with the token and `version` of `model_name` is free, else the
    parameter to change and the problem for people."""
    try:
        client = connect(address, author="kfp-finetune pre-flight")
        with mapped(address, "read registered models"):
            taken = existing_version(client, model_name, version) if model_name and version else None
    except SettingError as exc:
        return exc.setting, str(exc)
    except RegistryError as exc:
        return "registry_address", str(exc)
    if taken:
        return "registry_version", (
            f"model {model_name!r} already has a version {version!r} in the Model Registry at {address}: set "
            "registry_version to a new one (each run registers one version)"
        )
    return None
