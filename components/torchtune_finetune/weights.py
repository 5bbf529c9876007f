"""Did training change the model? Read from the safetensors files themselves, without torch (the TrainJob launcher
has none): a safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's dtype,
shape and byte range, then the raw little-endian bytes.

A LoRA / QLoRA / DoRA adapter starts with every lora_B matrix zero (torchtune's LoRALinear, as in the LoRA paper),
so while they are all zero the adapter adds nothing: the tuned model is the base. A full fine-tune changed the
model when its merged weights differ from the base's. Either check stops at the first tensor that settles it, so a
run that learned reads a few tensors, not the whole model.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components.torchtune_finetune.outputs import ADAPTER_WEIGHTS, FinalCheckpoint

# Bytes per element of the floating-point dtypes (safetensors names); the sign is the top bit of the last byte.
_FLOAT_WIDTHS = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2}
# What a run changes when it learns, and where an unchanged one usually comes from (pipeline parameters).
UNCHANGED_CAUSES = (
    "usual causes: every step at learning rate 0 (tune_learning_rate, tune_lr_scheduler, tune_num_warmup_steps), "
    "too few optimizer steps (tune_epochs, tune_batch_size, tune_gradient_accumulation_steps, "
    "tune_max_steps_per_epoch), or no trained tokens (tune_train_on_input, tune_max_seq_len)"
)


class WeightsUnchanged(RuntimeError):
    """Training ended with the weights it started from: the step hands on no model (one line with the causes)."""

    def __init__(self, what: str, steps: int, lrs: list[float]):
        lr = f", learning rates logged {min(lrs):.3g}..{max(lrs):.3g}" if lrs else ""
        super().__init__(
            f"training did not change the model: {what} ({steps} optimizer step(s) logged{lr}); {UNCHANGED_CAUSES}"
        )


@dataclass(frozen=True)
class Tensor:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte offsets in the file
    end: int

    def read(self) -> bytes:
        with open(self.path, "rb") as file:
            file.seek(self.start)
            return file.read(self.end - self.start)


def tensors(folder: str | os.PathLike) -> Iterator[tuple[str, Tensor]]:
    """(name, tensor) for every tensor of every *.safetensors file in `folder`, in file and byte order."""
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as file:
            (length,) = struct.unpack("<Q", file.read(8))
            header = json.loads(file.read(length))
        data = 8 + length
        entries = sorted(
            ((name, info) for name, info in header.items() if name != "__metadata__"),
            key=lambda item: item[1]["data_offsets"][0],
        )
        for name, info in entries:
            start, end = info["data_offsets"]
            yield name, Tensor(path, info["dtype"], tuple(info["shape"]), data + start, data + end)


def is_zero(tensor: Tensor) -> bool:
    """Every element is 0 (+0.0 or -0.0 for floats)."""
    data = tensor.read()
    width = _FLOAT_WIDTHS.get(tensor.dtype)
    if width is None:
        return data.count(0) == len(data)
    low_bytes_zero = all(data[k::width].count(0) == len(data[k::width]) for k in range(width - 1))
    return low_bytes_zero and not data[width - 1 :: width].translate(None, b"\x00\x80")


def _as_float32(tensor: Tensor) -> bytes | None:
    """The tensor's values as little-endian float32 bytes (exact for BF16 and F16); None for other dtypes."""
    data = tensor.read()
    if tensor.dtype == "F32":
        return data
    if tensor.dtype == "BF16":  # bfloat16 is the top half of a float32
        out = bytearray(len(data) * 2)
        out[2::4], out[3::4] = data[0::2], data[1::2]
        return bytes(out)
    if tensor.dtype == "F16":
        count = len(data) // 2
        return struct.pack(f"<{count}f", *struct.unpack(f"<{count}e", data))
    return None


def same_values(a: Tensor, b: Tensor) -> bool:
    """Equal shapes and values (compared as float32 where the dtypes differ, e.g. fp32 training of a bf16 base)."""
    if a.shape != b.shape:
        return False
    if a.dtype == b.dtype:
        return a.read() == b.read()
    left, right = _as_float32(a), _as_float32(b)
    return left is not None and left == right


def same_weights(merged_dir: str | os.PathLike, base_dir: str | os.PathLike) -> int:
    """How many tensors the merged model shares with the base, all with equal values; 0 when one differs (or none
    is shared: nothing shows they are the same)."""
    base = dict(tensors(base_dir))
    shared = 0
    for name, tensor in tensors(merged_dir):
        if name in base:
            if not same_values(tensor, base[name]):
                return 0
            shared += 1
    return shared


def unchanged(checkpoint: FinalCheckpoint, *, method: str, base_dir: str | os.PathLike) -> str:
    """What shows that training left the model as it was ("" when it changed, or nothing shows it did not)."""
    if method != "full" and checkpoint.adapter_dir is not None:
        lora_b = [t for name, t in tensors(checkpoint.adapter_dir) if "lora_b" in name.lower()]
        if lora_b and all(is_zero(t) for t in lora_b):
            return (f"all {len(lora_b)} lora_B matrices in {checkpoint.adapter_dir / ADAPTER_WEIGHTS} are zero, "
                    "so the adapter adds nothing to the base")  # fmt: skip
        return ""
    if checkpoint.merged_dir is not None:
        shared = same_weights(checkpoint.merged_dir, base_dir)
        if shared:
            return f"the {shared} tensors of {checkpoint.merged_dir} equal the base model's"
    return ""
