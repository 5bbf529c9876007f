"""Pre-flight: everything a run needs that can be checked in seconds, checked before any download or training.

`run_preflight` runs every check and collects the problems; when there are any, it raises one PreflightError
listing them all (each names the pipeline parameter and the fix), so a user fixes everything in one go:

0. the run's settings (run_settings.py): every tune_ / eval_ / export_ parameter by the steps' own rules (the
   fine-tune step's own: backend, cleanup policy, timeout, GPU memory), the devices against the GPU counts, the
   trainer image reference; then the model's config.json and tokenizer
   files (never its weights) and the whole torchtune run resolved from them;
1. credentials: the variables the named Kubernetes Secrets put into the step's environment (HF_TOKEN for an hf://
   destination; AWS_* for s3://, unless another credential source is configured);
2. the export destination: the credentials may write there (storage.probe_destination: a probe object written
   and deleted on s3://, the token's rights on hf://, a file created and removed in a local folder);
3. hf:// and s3:// sources (model_uri, data_uri): they exist, hold files and are readable with the credentials
   in the environment (storage.probe_source: the listing, and one file's metadata where a listing does not prove
   read access: a gated hub repo, an S3 object);
4. the TrainingRuntime / ClusterTrainingRuntime exists, and so does the Kueue LocalQueue tune_queue_name names
   (backend trainjob; the local backend needs none; a Role that may not read them leaves it to the step).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kfp_finetune.components._shared import engines, model_registry, storage, tracking
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.launch_settings import network_problem, slow_network_fix
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.preflight import run_settings
from kfp_finetune.components.preflight.problems import Problem
from kfp_finetune.components.preflight.run_settings import RunSettings

log = get_logger(__name__)


class PreflightError(Exception):
    """One or more problems a run would hit later; the message lists them all on one line."""


@dataclass(frozen=True)
class Secrets:
    """The names of the Secrets the pipeline reads credentials from (for the messages)."""

    hf_token: str
    s3: str

    def hf_hint(self) -> str:
        return (
            f"HF_TOKEN comes from the Kubernetes Secret named by hf_token_secret ({self.hf_token!r}): create it "
            f"(kubectl create secret generic {self.hf_token or 'hf-token'} --from-literal=HF_TOKEN=<token>) or "
            "name another Secret"
        )

    def s3_hint(self) -> str:
        return (
            f"AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY come from the Kubernetes Secret named by s3_secret "
            f"({self.s3!r}): create it (kubectl create secret generic {self.s3 or 's3-credentials'} "
            "--from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...) or name another Secret"
        )


def _credentials(parameter: str, value: str) -> list[Problem]:
    """A URI with credentials in it is refused before anything uses it (KFP has printed it in this step's log)."""
    try:
        storage.refuse_credentials(**{parameter: value})
    except storage.CredentialsInParameter as error:
        return [Problem(parameter, error.problem)]
    return []


def _parsed(parameter: str, uri: str, problems: list[Problem]) -> storage.StorageUri | None:
    refused = _credentials(parameter, uri)
    problems += refused
    try:
        return None if refused else storage.parse_uri(uri)
    except ValueError as error:
        problems.append(Problem(parameter, str(error)))
        return None


def check_credentials(
    uris: dict[str, storage.StorageUri], destination: str, secrets: Secrets
) -> list[Problem]:
    """The credential variables the schemes in use need are in the environment (filled from the Secrets)."""
    import boto3

    problems = []
    s3_users = [name for name, uri in uris.items() if uri.scheme == "s3"]
    if s3_users and boto3.session.Session().get_credentials() is None:
        problems.append(
            Problem(", ".join(s3_users), f"no S3 credentials in the step's environment; {secrets.s3_hint()}")
        )
    if destination in uris and uris[destination].scheme == "hf" and not os.environ.get("HF_TOKEN"):
        problems.append(
            Problem(destination, f"pushing to the hub needs a write token in HF_TOKEN; {secrets.hf_hint()}")
        )
    return problems


def check_destination(parameter: str, uri: storage.StorageUri, endpoint_url: str | None) -> list[Problem]:
    try:
        storage.probe_destination(uri, endpoint_url=endpoint_url)
    except (storage.StorageError, ValueError) as error:
        return [Problem(parameter, str(error))]
    log.info("%s: %s is writable", parameter, uri.shown)
    return []


# Sources checked where they are: the remote ones. A local path may be a volume mounted only into the initializers.
REMOTE_SOURCES = ("hf", "s3", "oci")


def check_source(
    parameter: str, uri: storage.StorageUri, repo_type: str, secrets: Secrets, endpoint_url: str | None
) -> list[Problem]:
    """A remote source exists, holds files and is readable with the credentials in the environment
    (storage.probe_source): an hf:// repo's listing (one file's metadata when it is gated: the hub serves a gated
    repo's info to anyone and its files only to accepted tokens); an s3:// prefix's listing and one object's
    metadata, at the endpoint the parameters name."""
    try:
        listing = storage.probe_source(uri, repo_type=repo_type, endpoint_url=endpoint_url)
    except (storage.StorageError, ValueError) as error:
        if uri.scheme == "s3":
            hint = f" (credentials from the Secret named by s3_secret, {secrets.s3!r})"
        elif uri.scheme == "oci":
            hint = ""  # the registry's errors name oci_secret
        else:
            hint = "" if os.environ.get("HF_TOKEN") else f" ({secrets.hf_hint()})"
        return [Problem(parameter, f"{error}{hint}")]
    log.info("%s: %s is readable (%d files)", parameter, uri.shown, len(listing.files))
    return []


def check_model_registry(
    address: str, model_name: str, version: str, export_destination: str
) -> list[Problem]:
    """The Model Registry answers with the step's token, and the version to register is free."""
    if not model_name and export_destination:
        with contextlib.suppress(ValueError):
            model_name = storage.last_name(export_destination)
    try:
        problem = model_registry.probe(address, model_name, version)
    except ImportError:
        problem = (
            "registry_address",
            "this image has no Model Registry client: install kfp-finetune[registry]",
        )
    if problem is None:
        log.info("registry_address: %s answers with the token", address)
        return []
    return [Problem(*problem)]


def check_base_image(image: str) -> list[Problem]:
    """The ModelCar's base image can be read (its manifest and config), as the export will copy it."""
    try:
        storage.check_base_image(image)
    except (storage.StorageError, ValueError) as error:
        return [Problem("export_oci_base_image", str(error))]
    log.info("export_oci_base_image: %s is readable", image)
    return []


def runtime_name(tune_runtime: str, engine: str) -> str:
    """The runtime the fine-tune's TrainJob will name: `tune_runtime`, or for auto the chosen engine's."""
    if tune_runtime != engines.AUTO:
        return tune_runtime
    face = engines.face(engine)
    log.info("tune_runtime: auto, the %s engine's runtime %r", face.NAME, face.RUNTIME)
    return face.RUNTIME


def check_runtime(
    backend: str, name: str, kind: str, nodes: int = 1, gpus: int = 0, allow_slow_network: bool = False
) -> list[Problem]:
    """On a cluster (backend trainjob) the runtime the TrainJob names exists, and requests RDMA for several nodes
    (unless allowed)."""
    from kfp_finetune.components._shared.kube.client import (
        Backoff,
        current_namespace,
        load_api_client,
        read_training_runtime,
    )

    if backend != "trainjob":
        return []
    try:
        namespace = current_namespace()
        exists, runtime = read_training_runtime(
            load_api_client(), name, kind, namespace, backoff=Backoff(attempts=3)
        )
    except ValueError as error:
        return [Problem("tune_runtime", str(error))]
    except Exception as error:  # no cluster configuration, or an API server that cannot be reached
        return _unreachable(error)
    if exists is None:
        log.info("cannot read %s %r (forbidden): the fine-tune step will find out", kind, name)
    elif not exists:
        where = "" if kind == "ClusterTrainingRuntime" else f" in namespace {namespace}"
        return [Problem("tune_runtime", f"{kind} {name!r} not found{where}: install the kfp-finetune runtimes "
                                        "with `kubectl apply -k runtimes/`, or name an existing runtime")]  # fmt: skip
    else:
        log.info("tune_runtime: %s %r exists", kind, name)
        slow = network_problem(runtime, kind, name, nodes, gpus)
        if slow and not allow_slow_network:
            return [Problem("tune_num_nodes", f"{slow}: {slow_network_fix()}")]
        if slow:
            log.warning("%s; allowed by tune_allow_slow_network", slow)
    return []


def check_queue(name: str) -> list[Problem]:
    """The Kueue LocalQueue the TrainJob will wait in exists in the step's namespace (a 403: the step decides)."""
    from kfp_finetune.components._shared.kube.client import (
        Backoff,
        current_namespace,
        load_api_client,
        local_queue_exists,
        missing_local_queue,
    )

    try:
        namespace = current_namespace()
        exists = local_queue_exists(load_api_client(), name, namespace, backoff=Backoff(attempts=3))
    except Exception as error:  # as check_runtime
        return _unreachable(error)
    if exists is None:
        log.info("cannot read LocalQueue %r (forbidden): the fine-tune step will find out", name)
    elif not exists:
        return [Problem("tune_queue_name", missing_local_queue(name, namespace))]
    else:
        log.info("tune_queue_name: LocalQueue %r exists", name)
    return []


def _unreachable(error: Exception) -> list[Problem]:
    return [Problem("tune_backend", f"trainjob needs a Kubernetes cluster, which cannot be reached ({error}); "
                                    "run the pipeline on KFP, or set tune_backend=local")]  # fmt: skip


def check_settings(settings: RunSettings) -> tuple[list[Problem], Callable[[str, str | None], list[Problem]]]:
    """The settings' problems, and the model check to run once the model is known readable (the model alone
    when the settings are already wrong: the run cannot be resolved from them)."""
    config, problems = run_settings.check_training(settings)
    problems += run_settings.check_hardware(settings, config.device if config else None)
    problems += run_settings.check_evaluate_and_export(settings)
    problems += run_settings.check_launch(settings)
    problems += run_settings.check_image(settings)

    def check_model(model_uri: str, endpoint_url: str | None) -> list[Problem]:
        resolvable = None if problems else config
        return run_settings.check_model_and_run(settings, resolvable, model_uri, endpoint_url)

    return problems, check_model


def check_tracking_server(tracking_uri: str, experiment: str) -> list[Problem]:
    """The MLflow server takes a run in the experiment (a probe run, created and deleted)."""
    try:
        problem = tracking.probe(tracking_uri, experiment)
    except ConfigError as error:
        return [Problem("mlflow_tracking_uri", str(error))]
    return [Problem("mlflow_tracking_uri", problem)] if problem else []


def run_preflight(
    *,
    export_destination: str = "",
    model_uri: str = "",
    data_uri: str = "",
    s3_endpoint_url: str = "",
    hf_token_secret: str = "hf-token",
    s3_secret: str = "s3-credentials",
    tune_backend: str = "trainjob",
    tune_runtime: str = "auto",
    tune_runtime_kind: str = "ClusterTrainingRuntime",
    settings: dict[str, Any] | None = None,
    mlflow_tracking_uri: str = "",
    mlflow_experiment: str = "",
    export_oci_base_image: str = "",
    registry: tuple[str, str, str] = ("", "", ""),
) -> list[str]:
    """Run every check; return what was checked, or raise PreflightError listing every problem found.

    `settings`: the pipeline's tune_ / eval_ / export_ parameters by name; one not given keeps its default."""
    secrets = Secrets(hf_token_secret, s3_secret)
    problems: list[Problem] = []
    given = {"export_destination": export_destination, "model_uri": model_uri, "data_uri": data_uri}
    uris = {name: u for name, value in given.items() if value and (u := _parsed(name, value, problems))}
    problems += _credentials("s3_endpoint_url", s3_endpoint_url)
    checked_settings = RunSettings({**(settings or {}), "tune_backend": tune_backend})
    settings_problems, check_model = check_settings(checked_settings)
    problems += settings_problems
    problems += check_credentials(uris, "export_destination", secrets)
    blocked = {p for problem in problems for p in problem.parameter.split(", ")}  # no credentials: no probe
    # (what is checked, the parameter whose problem makes the check pointless, the check)
    checks: list[tuple[str, str, Callable[[], list[Problem]]]] = []
    if "export_destination" in uris:
        checks.append(("export_destination", "export_destination", lambda: check_destination(
            "export_destination", uris["export_destination"], s3_endpoint_url or None)))  # fmt: skip
        if uris["export_destination"].scheme == "oci" and export_oci_base_image:
            checks.append(("export_oci_base_image", "export_oci_base_image",
                           lambda: check_base_image(export_oci_base_image)))  # fmt: skip
    for name, repo_type in (("model_uri", "model"), ("data_uri", "dataset")):
        if name in uris and uris[name].scheme in REMOTE_SOURCES:
            checks.append((name, name, lambda name=name, repo_type=repo_type: check_source(
                name, uris[name], repo_type, secrets, s3_endpoint_url or None)))  # fmt: skip
    if registry[0]:
        checks.append(("registry_address", "registry_address", lambda: check_model_registry(
            *registry, export_destination)))  # fmt: skip
    if mlflow_tracking_uri:
        checks.append(("mlflow_tracking_uri", "mlflow_tracking_uri", lambda: check_tracking_server(
            mlflow_tracking_uri, mlflow_experiment)))  # fmt: skip
    if "model_uri" in uris:  # after the access check: a repo the token cannot read is not fetched from
        checks.append(("model", "model_uri", lambda: check_model(model_uri, s3_endpoint_url or None)))
    if tune_backend == "trainjob":  # the local backend needs no cluster
        given = settings or {}
        nodes, gpus = given.get("tune_num_nodes", 1), given.get("tune_gpus_per_node", 1)
        allow_slow = bool(given.get("tune_allow_slow_network"))
        checks.append(("tune_runtime", "tune_runtime", lambda: check_runtime(
            tune_backend, runtime_name(tune_runtime, checked_settings.engine), tune_runtime_kind, nodes, gpus,
            allow_slow)))  # after the model check, which chose the engine  # fmt: skip
        if queue := (settings or {}).get("tune_queue_name"):
            # Not again when the runtime's check found no cluster (its problem names tune_backend).
            checks.append(("tune_queue_name", "tune_queue_name", lambda: [] if "tune_backend" in blocked
                           else check_queue(queue)))  # fmt: skip
    done = []
    for name, needs, check in checks:
        if needs not in blocked:
            found = check()
            problems += found
            blocked |= {problem.parameter for problem in found}
            done.append(name)
    if problems:
        count = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise PreflightError(
            f"pre-flight found {count}, no weights were downloaded, nothing was trained: "
            + " | ".join(f"({i}) {p}" for i, p in enumerate(problems, 1))
        )
    log.info("pre-flight passed: %s", ", ".join(done))
    return done
