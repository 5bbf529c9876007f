"""What `kfp-finetune upload`, `run` and `schedule` share: reaching KFP, pipeline packages, parameters, schedules.

Auth follows `kfp.Client`: `--host` (or KFP_HOST / KF_PIPELINES_ENDPOINT) with an optional bearer token read from
KFP_TOKEN only (a flag value would end up in shell history and `ps`). Without a host, kfp.Client reaches KFP with the
existing Kubernetes credentials: the pod's service account in a cluster, else the kubeconfig (through the API
server's service proxy). `--namespace` is the user's profile namespace in multi-user KFP.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.commands import values
from kfp_finetune.commands.values import UsageError
from kfp_finetune.components._shared.redact import redact_text

TOKEN_ENV = "KFP_TOKEN"
HOST_ENVS = ("KFP_HOST", "KF_PIPELINES_ENDPOINT")
UI_HOST_ENV = "KF_PIPELINES_UI_ENDPOINT"
PACKAGE_SUFFIXES = (".yaml", ".yml", ".zip", ".tar.gz", ".tgz")
DEFAULT_EXPERIMENT = "Default"


class BackendError(Exception):
    """A call to KFP or Kubernetes failed: the command prints the message and exits with 1."""


# --- connection ---------------------------------------------------------------------------------------------


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "KFP connection",
        f"a bearer token is read from ${TOKEN_ENV} only; without --host the Kubernetes credentials are used",
    )
    group.add_argument(
        "--host",
        help="KFP API endpoint, e.g. https://kubeflow.example.com/pipeline "
        "(default: $KFP_HOST, then $KF_PIPELINES_ENDPOINT)",
    )
    group.add_argument("--namespace", help="your profile namespace in multi-user KFP")
    group.add_argument("--kube-context", help="kubeconfig context used to reach KFP when --host is not given")
    group.add_argument("--ssl-ca-cert", help="CA bundle that signed the KFP endpoint's TLS certificate")
    group.add_argument("--insecure", action="store_true", help="do not verify the endpoint's TLS certificate")


def host_from(args: argparse.Namespace) -> str | None:
    return args.host or next((os.environ[name] for name in HOST_ENVS if os.environ.get(name)), None)


def connect(args: argparse.Namespace):
    """A `kfp.Client` for the connection arguments."""
    import kfp

    host = host_from(args)
    token = os.environ.get(TOKEN_ENV) or None
    options: dict[str, Any] = {
        "existing_token": token,
        "ssl_ca_cert": args.ssl_ca_cert,
        "kube_context": args.kube_context,
        "verify_ssl": False if args.insecure else None,
    }
    proxy = None if host or token else kubeconfig_token_proxy(args.kube_context)
    if proxy:
        host, options["credentials"], kube_configuration = proxy
        options["ssl_ca_cert"] = args.ssl_ca_cert or kube_configuration.ssl_ca_cert
        if not kube_configuration.verify_ssl:
            options["verify_ssl"] = False
    with quiet_client():
        return kfp.Client(
            host=host,
            # Without a host, kfp.Client also uses `namespace` as the namespace KFP is installed in (to build the
            # service-proxy URL), so the user's namespace is then passed to each call instead.
            namespace=(args.namespace or "kubeflow") if host else "kubeflow",
            **options,
        )


KFP_SERVICE_PROXY = "api/v1/namespaces/kubeflow/services/ml-pipeline:http/proxy"


def kubeconfig_token_proxy(context: str | None):
    """(KFP's URL through the API server's service proxy, token credentials, kube configuration), or None.

    kfp.Client builds that URL itself, but when the kubeconfig user has a token (static, OIDC or exec plugin) the
    kubernetes client's token-refresh hook resets the host to the bare API server before every request (kfp
    2.17.0 with kubernetes 30.1), so every call misses the proxy. We build the URL and refresh the token
    ourselves. Client-certificate users (no hook) and pods (in-cluster service) keep kfp's own path: None.
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None
    kube_configuration = client.Configuration()
    try:
        # KUBECONFIG is read now: the kubernetes client reads it only once, at import.
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None,
            context=context,
            client_configuration=kube_configuration,
        )
    except (ConfigException, OSError):
        return None  # kfp.Client reports it
    if "authorization" not in kube_configuration.api_key:
        return None
    from kfp.client import TokenCredentialsBase

    class KubeconfigToken(TokenCredentialsBase):
        """Puts the kubeconfig user's token, refreshed the kubernetes client's way, on each request."""

        def refresh_api_key_hook(self, kfp_configuration) -> None:
            if kube_configuration.refresh_api_key_hook is not None:
                kube_configuration.refresh_api_key_hook(kube_configuration)  # exec plugin, expired token
            # The kubeconfig token carries its "Bearer " prefix; kfp adds its own.
            token = kube_configuration.api_key["authorization"]
            kfp_configuration.api_key["authorization"] = token.removeprefix("Bearer ").strip()

    proxy_url = f"{kube_configuration.host.rstrip('/')}/{KFP_SERVICE_PROXY}"
    return proxy_url, KubeconfigToken(), kube_configuration


@contextlib.contextmanager
def quiet_client() -> Iterator[None]:
    """kfp.Client prints links on stdout and warns about versions; keep stdout for our own results."""
    with contextlib.redirect_stdout(sys.stderr), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


@contextlib.contextmanager
def backend_errors(host: str | None) -> Iterator[None]:
    """Turn the client's exceptions into BackendError with the server's message (never the request headers)."""
    import kfp_server_api
    import urllib3

    where = host or "the cluster's KFP service"
    try:
        yield
    except kfp_server_api.ApiException as error:
        raise BackendError(
            f"KFP answered {error.status} {error.reason or ''}: {server_message(error.body)}"
        ) from None
    except (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError) as error:
        raise BackendError(f"cannot reach KFP at {where}: {error}") from None


def server_message(body: Any) -> str:
    """The `message` of a grpc-gateway error body, else the body itself (shortened)."""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    try:
        parsed = json.loads(body or "")
    except ValueError:
        return str(body or "")[:500].strip()
    if isinstance(parsed, dict):
        return str(parsed.get("message") or parsed.get("error_message") or parsed.get("error") or parsed)
    return str(parsed)


def ui_link(args: argparse.Namespace, fragment: str) -> str | None:
    """A link into the KFP UI (`#/runs/details/<id>` …), when we know where the UI is."""
    base = os.environ.get(UI_HOST_ENV) or host_from(args)
    if not base:
        return None
    if not base.startswith(("http://", "https://")):
        base = "https://" + base
    return f"{base.rstrip('/')}/#/{fragment}"


# --- pipeline packages --------------------------------------------------------------------------------------


@dataclass
class Package:
    """A pipeline package on disk and its YAML documents (PipelineSpec, then PlatformSpec if any)."""

    path: Path
    documents: list[dict]  # empty for archives (.zip, .tar.gz), which we do not unpack

    @property
    def spec(self) -> dict | None:
        return self.documents[0] if self.documents else None

    @property
    def name(self) -> str | None:
        return ((self.spec or {}).get("pipelineInfo") or {}).get("name")

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    def stored_form(self) -> dict | None:
        """The spec as KFP returns it for a version: alone, or {pipeline_spec, platform_spec} with a platform spec."""
        if len(self.documents) < 2:
            return self.spec
        return {"pipeline_spec": self.documents[0], "platform_spec": self.documents[1]}


def builtin_pipelines() -> dict[str, Any]:
    from kfp_finetune.pipelines import PIPELINES

    return PIPELINES


def load_package(source: str, workdir: str | Path) -> Package:
    """`source` is one of our pipeline names (compiled now into `workdir`) or a pipeline package file."""
    path = Path(source)
    if source.endswith(PACKAGE_SUFFIXES) or path.exists():
        if not path.is_file():
            raise UsageError(f"no such pipeline file: {source}")
        if not source.endswith(PACKAGE_SUFFIXES):
            raise UsageError(f"{source}: a pipeline package ends with one of {', '.join(PACKAGE_SUFFIXES)}")
    else:
        pipelines = builtin_pipelines()
        if source not in pipelines:
            raise UsageError(
                f"unknown pipeline {source!r}: use one of {', '.join(sorted(pipelines))}, or a compiled YAML file"
            )
        from kfp import compiler

        # Compiling now (not reading compiled/) honours the compile-time settings in the environment
        # (component image, workspace size); with none set the bytes equal the golden compiled/<name>.yaml.
        path = Path(workdir) / f"{source}.yaml"
        compiler.Compiler().compile(pipelines[source], str(path))
    return Package(path, read_documents(path))


def read_documents(path: Path) -> list[dict]:
    import yaml

    if path.suffix not in (".yaml", ".yml"):
        return []
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the C loader is ~10x faster on big pipelines
    try:
        documents = [d for d in yaml.load_all(path.read_text(), Loader=loader) if d is not None]
    except yaml.YAMLError as error:
        raise UsageError(f"{path}: not valid YAML: {error}") from None
    if (
        not documents
        or not isinstance(documents[0], dict)
        or not {"root", "pipelineInfo"} <= set(documents[0])
    ):
        raise UsageError(f"{path}: not a compiled KFP pipeline (no pipelineInfo/root)")
    return documents


def pipeline_spec_of(stored: Any) -> dict | None:
    """The PipelineSpec inside a stored version's `pipeline_spec` (alone, or next to a platform_spec)."""
    if isinstance(stored, dict):
        if "root" in stored:
            return stored
        if isinstance(stored.get("pipeline_spec"), dict):
            return stored["pipeline_spec"]
    return None


# --- server-side lookups ------------------------------------------------------------------------------------


def name_filter(name: str) -> str:
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})


def find_pipeline_id(client, name: str, namespace: str | None) -> str | None:
    """The id of the pipeline called `name` in `namespace` (shared pipelines when None)."""
    found = client.list_pipelines(filter=name_filter(name), namespace=namespace, page_size=2).pipelines or []
    if len(found) > 1:
        raise UsageError(f"several pipelines are called {name!r}; KFP needs the name to be unique")
    return found[0].pipeline_id if found else None


def find_version(client, pipeline_id: str, version_name: str | None):
    """The version called `version_name` of the pipeline, or its newest when None; None when there is none."""
    if version_name:
        found = client.list_pipeline_versions(pipeline_id, filter=name_filter(version_name), page_size=1)
    else:
        found = client.list_pipeline_versions(pipeline_id, sort_by="created_at desc", page_size=1)
    versions = found.pipeline_versions or []
    return versions[0] if versions else None


# --- run parameters ----------------------------------------------------------------------------------------


def parse_params(pairs: list[str] | None, params_file: str | None = None) -> dict[str, Any]:
    """`--params-file` then `--param KEY=VALUE` pairs (which win): name -> value as given (typed later)."""
    given = values.load_params_file(params_file) if params_file else {}
    given.update(values.parse_pairs(pairs, "--param"))
    return given


typed_params = values.typed_params


# --- schedules ----------------------------------------------------------------------------------------------

# KFP parses cron with robfig/cron v1: six fields, seconds first (day-of-week may even be left out, so a
# five-field crontab line is silently read with every field shifted by one place).
CRON_FIELDS = (
    ("seconds", 0, 59, None),
    ("minutes", 0, 59, None),
    ("hours", 0, 23, None),
    ("day of month", 1, 31, None),
    ("month", 1, 12, ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]),
    ("day of week", 0, 6, ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]),
)
CRON_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")
CRON_HELP = (
    "KFP cron has 6 fields, seconds first: 'SEC MIN HOUR DAY-OF-MONTH MONTH DAY-OF-WEEK', "
    "e.g. '0 0 2 * * *' = 02:00:00 daily (scheduler time zone, usually UTC); or @daily, @hourly, '@every 6h'"
)


def validate_cron(expression: str) -> str:
    """Return the expression normalised (single spaces) if KFP's scheduler accepts it, else raise UsageError."""
    expression = " ".join(expression.split())
    if expression.startswith("@"):
        if expression in CRON_DESCRIPTORS:
            return expression
        every = expression.removeprefix("@every ")
        if every != expression and _GO_DURATION.match(every):
            return expression
        raise UsageError(f"--cron {expression!r}: unknown descriptor. {CRON_HELP}")
    fields = expression.split(" ")
    if len(fields) == 5:
        raise UsageError(
            f"--cron {expression!r} has 5 fields, but KFP's cron has 6 with seconds first (a 5-field line would "
            f"run at the wrong times). Did you mean '0 {expression}'? {CRON_HELP}"
        )
    if len(fields) != 6:
        raise UsageError(f"--cron {expression!r} has {len(fields)} fields. {CRON_HELP}")
    for field, (label, low, high, names) in zip(fields, CRON_FIELDS, strict=True):
        problem = _cron_field_problem(field, low, high, names)
        if problem:
            raise UsageError(f"--cron {expression!r}: {label} field {field!r}: {problem}. {CRON_HELP}")
    return expression


def _cron_field_problem(field: str, low: int, high: int, names: list[str] | None) -> str | None:
    def number(text: str) -> int:
        if names and text.upper() in names:
            return names.index(text.upper()) + low
        if not text.isdigit():
            raise ValueError(f"{text!r} is not a number{' or a name like ' + names[0] if names else ''}")
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low}-{high}")
        return value

    for part in field.split(","):
        span, _, step = part.partition("/")
        try:
            if step and (not step.isdigit() or int(step) == 0):
                return f"step {step!r} must be a positive number"
            if span in ("*", "?"):
                continue
            start, dash, end = span.partition("-")
            first = number(start)
            if dash and number(end) < first:
                return f"range {span!r} runs backwards"
        except ValueError as error:
            return str(error)
    return None


def rfc3339(value: str | None, flag: str) -> str | None:
    """An ISO 8601 date/time as the RFC 3339 UTC string KFP expects; naive times are taken as UTC."""
    if value is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{flag} {value!r}: expected an ISO 8601 time such as 2026-01-31T02:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- run / schedule: what to run ----------------------------------------------------------------------------


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """What to run: a local package (sent inline) or an uploaded pipeline version; plus its parameters."""
    parser.add_argument(
        "source",
        nargs="?",
        help="one of our pipelines (e.g. finetune-pipeline, compiled now) or a compiled YAML file, sent with the "
        "run; or leave it out and name an uploaded pipeline with --pipeline",
    )
    parser.add_argument("--pipeline", help="an uploaded pipeline's name (see `kfp-finetune upload`)")
    parser.add_argument("--version", help="version name of --pipeline (default: its newest version)")
    parser.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="a pipeline parameter; the value is read as YAML (3, 0.5, true, [a, b], {k: v}); repeatable",
    )
    parser.add_argument("--params-file", help="YAML mapping of parameters (--param wins over it)")
    parser.add_argument(
        "--experiment",
        default=DEFAULT_EXPERIMENT,
        help=f"experiment (created if missing; default: {DEFAULT_EXPERIMENT})",
    )
    parser.add_argument("--service-account", help="Kubernetes service account the run's pods use")
    parser.add_argument("--pipeline-root", help="where the run stores artifacts (default: KFP's)")


@dataclass
class Target:
    """A resolved run target: either an inline package or an uploaded pipeline version."""

    display_name: str
    spec: dict | None
    package_path: str | None = None
    pipeline_id: str | None = None
    version_id: str | None = None

    def job_arguments(self) -> dict[str, Any]:
        if self.package_path:
            return {"pipeline_package_path": self.package_path}
        return {"pipeline_id": self.pipeline_id, "version_id": self.version_id}


def check_source_arguments(args: argparse.Namespace) -> None:
    if bool(args.source) == bool(args.pipeline):
        raise UsageError("give either a pipeline (name or YAML file) or --pipeline NAME of an uploaded one")
    if args.version and not args.pipeline:
        raise UsageError("--version needs --pipeline")


def prepare(args: argparse.Namespace, workdir: str):
    """(client, target, typed parameters) for `run` and `schedule`.

    A local package and its parameters are checked before connecting, so typos fail fast and offline.
    """
    check_source_arguments(args)
    params = parse_params(args.param, args.params_file)
    if args.source:
        package = load_package(args.source, workdir)
        target = Target(package.name or package.path.stem, package.spec, package_path=str(package.path))
        values = typed_params(params, target.spec)
        return connect(args), target, values
    client = connect(args)
    with quiet_client():
        target = uploaded_target(client, args)
    return client, target, typed_params(params, target.spec)


def uploaded_target(client, args: argparse.Namespace) -> Target:
    """Look the uploaded pipeline (and version) up on the server."""
    pipeline_id = find_pipeline_id(client, args.pipeline, args.namespace)
    if pipeline_id is None:
        where = f" in namespace {args.namespace}" if args.namespace else ""
        raise UsageError(
            f"no uploaded pipeline called {args.pipeline!r}{where}; upload it with `kfp-finetune upload`"
        )
    version = find_version(client, pipeline_id, args.version)
    if version is None:
        raise UsageError(f"pipeline {args.pipeline!r} has no version {args.version or ''}".rstrip())
    return Target(
        args.pipeline,
        pipeline_spec_of(version.pipeline_spec),
        pipeline_id=pipeline_id,
        version_id=version.pipeline_version_id,
    )


def experiment_id(client, args: argparse.Namespace) -> str:
    """The id of `--experiment`, created when missing (kfp.Client.create_experiment gets or creates)."""
    return client.create_experiment(args.experiment, namespace=args.namespace).experiment_id


def run_command(args: argparse.Namespace, body) -> int:
    """Run `body(workdir)` with the usual exit codes: 0 ok, 2 bad input, 1 failed call."""
    try:
        with tempfile.TemporaryDirectory(prefix="kfp-finetune-") as workdir, backend_errors(host_from(args)):
            return body(workdir)
    except UsageError as error:
        print(f"error: {redact_text(error)}", file=sys.stderr)
        return 2
    except BackendError as error:  # a server's or client's message may quote a URL with credentials
        print(f"error: {redact_text(error)}", file=sys.stderr)
        return 1
