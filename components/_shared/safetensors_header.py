"""A safetensors file's header, read without its tensors: an 8-byte little-endian length, then JSON
{name: {dtype, shape, data_offsets}} and an optional "__metadata__" entry (the safetensors format)."""

from __future__ import annotations

import json
import os

METADATA = "__metadata__"


def read_tensor_entries(path: str | os.PathLike) -> dict[str, dict]:
    """{tensor name: {dtype, shape, data_offsets}} of the file, its metadata entry left out."""
    with open(path, "rb") as file:
        header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
    return {name: entry for name, entry in header.items() if name != METADATA}
