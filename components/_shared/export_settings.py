"""The export step's format and dtype vocabularies and their checks, here so that pre-flight checks the
pipeline's export_ parameters with the same rules before anything is downloaded (a component imports only
_shared)."""

from __future__ import annotations

from kfp_finetune.components._shared.errors import SettingError

FORMATS = ("merged", "adapter", "both")
# Accepted spellings -> (torch dtype name, HF config torch_dtype).
DTYPES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
}


def format_problem(fmt: str) -> SettingError | None:
    if fmt in FORMATS:
        return None
    return SettingError("format", f"must be one of {', '.join(FORMATS)} (got {fmt!r})")


def dtype_problem(dtype: str) -> SettingError | None:
    if not (dtype or "").strip() or dtype.strip().lower() in DTYPES:
        return None
    return SettingError(
        "dtype", f"must be bf16, fp16 or fp32, or empty to keep the trained weights' (got {dtype!r})"
    )
