"""The process-wide state training starts from, kept as it was while the node entrypoint's checks run.

The node pod's entrypoint checks the resolved config with torch (torch_checks.py: torchtune's validation, the
prompts tokenized, a tiny random model built and compared with transformers), then runs `tune run` in the same
process, so torch is imported once. Whatever the checks leave behind would be training's starting state: the global
random generators they draw from (building a model initialises its weights from them), the default dtype and device,
grad mode, deterministic-algorithm and anomaly flags, matmul precision and cuDNN flags, the thread count, the
environment, the SIGTERM/SIGINT handlers (the recipe checkpoints on SIGTERM with its own), graphs in dynamo's caches
and the tiny model's memory. `kept()` saves the state before the checks and puts it back after them.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import signal
import sys
from collections.abc import Iterator
from typing import Any

#: The signals whose handlers training relies on (recipe.py's checkpoint on SIGTERM; Ctrl-C in a local run).
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def snapshot() -> dict[str, Any]:
    """The state, by name."""
    import numpy
    import torch

    state = {
        "python random": random.getstate(),
        "numpy random": numpy.random.get_state(),
        "torch random": torch.random.get_rng_state(),
        "default dtype": torch.get_default_dtype(),
        "default device": torch.get_default_device(),
        "grad enabled": torch.is_grad_enabled(),
        "deterministic algorithms": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "anomaly detection": (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "cudnn": (
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.allow_tf32,
        ),
        "threads": torch.get_num_threads(),
        "environment": dict(os.environ),
        "signal handlers": {number: signal.getsignal(number) for number in SIGNALS},
    }
    # Reading CUDA's generators would initialise CUDA: only when something already did.
    if torch.cuda.is_initialized():
        state["cuda random"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    """Put `state` (from `snapshot`) back, and free what the checks left in memory."""
    import numpy
    import torch

    random.setstate(state["python random"])
    numpy.random.set_state(state["numpy random"])
    torch.random.set_rng_state(state["torch random"])
    if "cuda random" in state:
        torch.cuda.set_rng_state_all(state["cuda random"])
    torch.set_default_dtype(state["default dtype"])
    if torch.get_default_device() != state["default device"]:
        # A default device is a mode every torch call goes through: none for the CPU, as torch starts.
        device = state["default device"]
        torch.set_default_device(None if device.type == "cpu" else device)
    torch.set_grad_enabled(state["grad enabled"])
    mode, warn_only = state["deterministic algorithms"]
    torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    torch.autograd.set_detect_anomaly(*state["anomaly detection"])
    torch.set_float32_matmul_precision(state["float32 matmul precision"])
    (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.backends.cudnn.allow_tf32) = (
        state["cudnn"]
    )
    if torch.get_num_threads() != state["threads"]:
        torch.set_num_threads(state["threads"])
    if dict(os.environ) != state["environment"]:
        for name in set(os.environ) - set(state["environment"]):
            del os.environ[name]
        os.environ.update(state["environment"])
    for number, handler in state["signal handlers"].items():
        if handler is not None:  # None: installed from C, which Python cannot put back
            signal.signal(number, handler)
    if "torch._dynamo" in sys.modules:  # what a check compiled must not be found by training's compile
        torch._dynamo.reset()
    gc.collect()  # the tiny model and its tensors
    # Only what a check allocated: emptying an untouched device's cache must not be what makes its context here.
    if torch.cuda.is_initialized() and torch.cuda.memory_reserved():
        torch.cuda.empty_cache()


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Run the block, then put the process-wide state back as it was before it (also when it raises)."""
    state = snapshot()
    try:
        yield
    finally:
        restore(state)
