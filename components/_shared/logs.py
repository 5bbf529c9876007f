"""Step-log output. KFP shows a component's stdout/stderr as the step log, so progress goes there, flushed.

Every log record of the process (ours and the libraries': the hub client's retry warnings name the signed CDN URL
they requested) and the traceback of an uncaught exception show URLs redacted (redact.py): the step log is
stored and shown in the UI.
"""

from __future__ import annotations

import logging
import sys
import traceback

from kfp_finetune.components._shared.redact import redact_text

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _RedactedTraceback(logging.Formatter):
    def formatException(self, ei) -> str:  # noqa: N802 (logging's name)
        return redact_text(super().formatException(ei))


def _redacting(factory):
    """A LogRecord factory whose records carry their message already formatted and redacted, so every handler
    (KFP's, pytest's, ours) sees only the redacted text."""

    def make_record(*args, **kwargs) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: logging reports it when a handler formats the record
            return record
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return record

    make_record.redacts = True
    return make_record


def _print_redacted(kind, value, tb) -> None:
    sys.stderr.write(redact_text("".join(traceback.format_exception(kind, value, tb))))


def install_redaction() -> None:
    """Redact every log record and uncaught traceback of this process from now on (once; idempotent)."""
    if not getattr(logging.getLogRecordFactory(), "redacts", False):
        logging.setLogRecordFactory(_redacting(logging.getLogRecordFactory()))
    if sys.excepthook is sys.__excepthook__:  # leave a debugger's or a test runner's hook alone
        sys.excepthook = _print_redacted


def get_logger(name: str) -> logging.Logger:
    """A logger writing to stderr with timestamps; configures the `kfp_finetune` root once."""
    install_redaction()
    root = logging.getLogger("kfp_finetune")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_RedactedTraceback(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
    return logging.getLogger(name if name.startswith("kfp_finetune") else f"kfp_finetune.{name}")
