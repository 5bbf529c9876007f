"""The fine-tune step's own settings (where and how it trains, not what torchtune does): their vocabularies and
checks, here so that pre-flight checks the pipeline's tune_backend, tune_cleanup_policy, tune_timeout_seconds and
tune_gpu_memory_gib with the rules the step applies, before anything is downloaded."""

from __future__ import annotations

import math

from kfp_finetune.components._shared.errors import SettingError, one_of

BACKENDS = ("trainjob", "local")
CLEANUP_POLICIES = ("on-success", "always", "never")


def problems(
    *, backend: str, cleanup_policy: str, timeout_seconds: int, gpu_memory_gib: float
) -> list[SettingError]:
    """Each problem named by the step's parameter (backend, cleanup_policy, timeout_seconds, gpu_memory_gib)."""
    found = [
        *one_of("backend", backend, BACKENDS),
        *one_of("cleanup_policy", cleanup_policy, CLEANUP_POLICIES),
    ]
    if timeout_seconds < 0:
        found.append(SettingError("timeout_seconds", f"must be 0 (no limit) or more (got {timeout_seconds})"))
    if gpu_memory_gib != -1 and not (math.isfinite(gpu_memory_gib) and gpu_memory_gib > 0):
        found.append(
            SettingError(
                "gpu_memory_gib", f"must be the GiB of one GPU, e.g. 80, or -1 (got {gpu_memory_gib})"
            )
        )
    return found
