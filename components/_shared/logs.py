"""Step-log output. KFP shows a component's stdout/stderr as the step log, so progress goes there, flushed."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def get_logger(name: str) -> logging.Logger:
    """A logger writing to stderr with timestamps; configures the `kfp_finetune` root once."""
    root = logging.getLogger("kfp_finetune")
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        root.propagate = False
    return logging.getLogger(name if name.startswith("kfp_finetune") else f"kfp_finetune.{name}")
