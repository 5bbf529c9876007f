"""How a component step fails on an error the user must fix: one line, once, and at once.

A component body runs its implementation inside `usage_errors(...)` naming the error classes that carry a
complete message (bad input, missing data, a refused destination, a failed run with its reason). Such an error
ends the step with `error: <message>` on stderr and exit status 1, instead of the same message at the bottom of a
long traceback. Any other exception is a bug or an unforeseen failure and keeps its traceback.

The error types several components raise live here too, once: `ConfigError` (a bad setting or input, found
before anything runs) and its kind `ContractError` (an input artifact's metadata is not what the step needs:
see contract.py).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_STATUS = 1


class ConfigError(ValueError):
    """Bad input, reported before anything runs. The message names the parameter and how to fix it."""


class ContractError(ConfigError):
    """An input artifact's metadata lacks a key the step needs, or has one of the wrong type; the message names
    the input and the output to connect it to."""


@contextmanager
def usage_errors(*known: type[BaseException]) -> Iterator[None]:
    """Inside a component body: an exception of a `known` class fails the step with only its message."""
    try:
        yield
    except known as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_STATUS) from None
