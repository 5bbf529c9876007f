"""The one parser for every `KEY=VALUE` on the command line (`run`, `schedule`, `run-local`, `resolve-config`).

A value becomes the type its parameter declares (the KFP parameter types): an integer parameter given `0123` gets
123, a string parameter keeps `0123`, a boolean takes true/false, a list or a struct is JSON or YAML flow
(`[a, b]`, `{k: v}`). Where the type is not known (a torchtune override, a pipeline archive) the value is read as
YAML 1.2 core: `0123` is 123, `1e-4` a float, `yes` a string (never YAML 1.1's octal, sexagesimal or yes/no).
A URI value that carries credentials (a presigned query, `user:pass@`) is refused: KFP prints and stores every
parameter.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from kfp_finetune.components._shared.redact import CREDENTIALS_IN_PARAMETER, credentials_in

# KFP parameter type -> how we describe it in errors.
TYPES = {
    "STRING": "a string",
    "NUMBER_INTEGER": "an integer, e.g. 8",
    "NUMBER_DOUBLE": "a number, e.g. 0.5 or 1e-4",
    "BOOLEAN": "true or false",
    "LIST": "a JSON/YAML list, e.g. [a, b]",
    "STRUCT": "a JSON/YAML mapping, e.g. {key: value}",
}
_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")


class UsageError(Exception):
    """Bad input from the user: the command prints the message and exits with 2."""


class _CoreLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars (no octal `0123`, no `yes`, no dates)."""


_CoreLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[-1] in ("merge", "str", "value")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_CoreLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_CoreLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_CoreLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(_FLOAT.pattern + r"|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"),
    list("-+.0123456789"),
)
_CoreLoader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(~|null|Null|NULL|)$"), list("~nN"))
_CoreLoader.add_constructor(
    "tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node), 10)
)


def load_yaml(text: str) -> Any:
    """YAML read with the core schema (what every value and params file goes through)."""
    return yaml.load(text, Loader=_CoreLoader)  # noqa: S506 - a SafeLoader subclass


def split_pair(pair: str, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` -> (key, raw value text); the value may itself contain `=`."""
    key, sep, raw = pair.partition("=")
    if not sep or not key.strip():
        raise UsageError(f"{flag} expects KEY=VALUE, got {pair!r}")
    return key.strip(), raw


def parse_value(key: str, given: Any, declared: str | None, flag: str = "--param") -> Any:
    """`given` (the raw text from the command line, or a value read from a params file) as `declared` wants it.

    `declared` is a KFP parameter type (STRING, NUMBER_INTEGER, NUMBER_DOUBLE, BOOLEAN, LIST, STRUCT) or None
    when unknown. Raises UsageError naming the key, the declared type and the value.
    """
    if declared not in TYPES:
        return _untyped(given) if isinstance(given, str) else given
    if not isinstance(given, str):  # a list or mapping from a params file
        expected = {"LIST": list, "STRUCT": dict}.get(declared)
        if expected and isinstance(given, expected):
            return given
        raise _bad(key, given, declared, flag)
    text = given.strip()
    if declared == "STRING":
        return given
    if declared == "NUMBER_INTEGER" and _INT.match(text):
        return int(text, 10)
    if declared == "NUMBER_DOUBLE" and (_INT.match(text) or _FLOAT.match(text)):
        number = float(text)
        if math.isfinite(number):
            return number
    if declared == "BOOLEAN" and text.lower() in ("true", "false"):
        return text.lower() == "true"
    if declared in ("LIST", "STRUCT") and text:
        value = _untyped(text)
        if isinstance(value, list if declared == "LIST" else dict):
            return value
    raise _bad(key, given, declared, flag)


def _untyped(text: str) -> Any:
    if not text.strip():
        return ""
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text  # not YAML (`a: b: c`, `@x`): a string


def _bad(key: str, given: Any, declared: str, flag: str) -> UsageError:
    return UsageError(
        f"{flag} {key}: {key} is declared {declared}, so it needs {TYPES[declared]}; got {given!r}"
    )


def parse_pairs(pairs: list[str] | None, flag: str = "--param") -> dict[str, str]:
    """The `KEY=VALUE` pairs of a repeatable flag: key -> raw text (the last one wins)."""
    return dict(split_pair(pair, flag) for pair in pairs or [])


def load_params_file(path: str) -> dict[str, Any]:
    """A YAML mapping of parameters: key -> the scalar's text as written (typed later, like a command-line value),
    or the list / mapping read as YAML 1.2 core."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        as_text = yaml.load(text, Loader=yaml.BaseLoader) or {}  # every scalar as the text written
        loaded = load_yaml(text) or {}
    except OSError as error:
        raise UsageError(f"--params-file {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UsageError(
            f"--params-file {path}: not UTF-8 text (byte {error.start}): save it as UTF-8"
        ) from None
    except yaml.YAMLError as error:
        raise UsageError(f"--params-file {path}: not valid YAML: {_yaml_problem(error)}") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--params-file {path}: expected a mapping of parameter names to values")
    return {
        str(key): as_text[str(key)] if isinstance(as_text.get(str(key)), str) else value
        for key, value in loaded.items()
    }


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error on one line: where (line, column as an editor counts them) and what."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return " ".join(f"{where}{problem}".split())


def declared_types(spec: dict | None) -> dict[str, dict] | None:
    """The root input parameters of a PipelineSpec (name -> definition), or None without a spec (an archive)."""
    if spec is None:
        return None
    return ((spec.get("root") or {}).get("inputDefinitions") or {}).get("parameters") or {}


def typed_params(given: dict[str, Any], spec: dict | None, flag: str = "--param") -> dict[str, Any]:
    """Check names against the pipeline's inputs (unknown, missing required), type every value and refuse a URI
    that carries credentials.

    Without a spec (an archive) values are read untyped."""
    for name, value in given.items():
        what = credentials_in(value) if isinstance(value, str) else None
        if what:
            raise UsageError(f"{flag} {name}: {name} {CREDENTIALS_IN_PARAMETER.format(what=what)}")
    declared = declared_types(spec)
    if declared is None:
        return {name: parse_value(name, value, None, flag) for name, value in given.items()}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise UsageError(
            f"unknown parameter(s) {', '.join(unknown)}; the pipeline takes: {', '.join(sorted(declared)) or 'none'}"
        )
    missing = sorted(
        name
        for name, definition in declared.items()
        if name not in given and "defaultValue" not in definition and not definition.get("isOptional")
    )
    if missing:
        raise UsageError(f"missing required parameter(s): {', '.join(missing)} (pass {flag} NAME=VALUE)")
    return {
        name: parse_value(name, value, declared[name].get("parameterType"), flag)
        for name, value in given.items()
    }
