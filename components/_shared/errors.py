"""How a component step fails on an error the user must fix: one line, once, and at once.

A component body runs its implementation inside `usage_errors(...)` naming the error classes that carry a
complete message (bad input, missing data, a refused destination, a failed run with its reason). Such an error
ends the step with `error: <message>` on stderr and exit status 1, instead of the same message at the bottom of a
long traceback. Any other exception is a bug or an unforeseen failure and keeps its traceback.

The error types several components raise live here too, once: `ConfigError` (a bad setting or input, found
before anything runs) and its kinds `SettingError` (one setting's value, with the setting's name apart) and
`ContractError` (an input artifact's metadata is not what the step needs: see contract.py).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from kfp_finetune.components._shared.redact import redact_text

EXIT_STATUS = 1


class ConfigError(ValueError):
    """Bad input, reported before anything runs. The message names the parameter and how to fix it."""


class SettingError(ConfigError):
    """A setting's value is refused. `setting` is its name where it was checked (a typed field such as
    `learning_rate`), `problem` the rest of the message, so a caller that knows the name the user set (the
    pipeline parameter `tune_learning_rate`) can say it that way (`named`)."""

    def __init__(self, setting: str, problem: str):
        super().__init__(f"{setting} {problem}")
        self.setting = setting
        self.problem = problem

    def named(self, name: str) -> str:
        return f"{name} {self.problem}"


def one_of(name: str, value: object, allowed: tuple[str, ...]) -> list[SettingError]:
    """[] when `value` is one of `allowed` (a closed vocabulary), else the problem, with the nearest allowed value
    for a typo."""
    if value in allowed:
        return []
    nearest = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
    hint = f": did you mean {nearest[0]!r}?" if nearest else ""
    return [SettingError(name, f"must be one of {', '.join(allowed)} (got {value!r}){hint}")]


class ContractError(ConfigError):
    """An input artifact's metadata lacks a key the step needs, or has one of the wrong type; the message names
    the input and the output to connect it to."""


@contextmanager
def usage_errors(*known: type[BaseException]) -> Iterator[None]:
    """Inside a component body: an exception of a `known` class fails the step with only its message (a URL in
    it redacted: it may quote a client's error)."""
    try:
        yield
    except known as error:
        print(f"error: {redact_text(error)}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None
