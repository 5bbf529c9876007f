"""Where and in which precision evaluate runs: `device` auto follows the tuned model's training (issue 18).

A model trained on GPUs is evaluated on this step's GPU in the dtype it was trained in (bf16 by default); the
pipelines give the evaluate step a GPU when the fine-tune used GPUs (eval_gpus -1). Without a GPU here the step
runs on CPU in fp32 (torchtune's CPU path) and says why. Plain data in, plain data out: torch is asked only for
what it sees (`visible_hardware`), so the choice is tested without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError

#: torchtune's dtype names -> torch's.
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class Trained:
    """How the tuned model was trained, as its model metadata or resolved YAML records it ("" unknown)."""

    device: str = ""
    dtype: str = ""

    @classmethod
    def of(cls, model_metadata: dict, train_config: dict) -> Trained:
        """From the model artifact's metadata (TunedModel.device/.dtype), else the run's resolved YAML."""
        device = model_metadata.get("device") or train_config.get("device") or ""
        dtype = model_metadata.get("dtype") or train_config.get("dtype") or ""
        return cls(str(device), str(dtype))

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")


@dataclass(frozen=True)
class Placement:
    device: str  # cpu | cuda | cuda:N
    dtype: str  # bf16 | fp16 | fp32
    reason: str

    def torch(self) -> tuple[Any, Any]:
        import torch

        return torch.device(self.device), getattr(torch, TORCH_DTYPES[self.dtype])


def choose_placement(requested: str, trained: Trained, gpu_visible: bool, bf16_supported: bool) -> Placement:
    """The device and dtype for `requested` (auto | cpu | cuda[:N]) given the training and this step's GPU."""
    requested = requested or "auto"
    if requested == "cpu":
        return Placement("cpu", "fp32", "device=cpu: fp32 (torchtune's CPU path)")
    if requested.startswith("cuda") and not gpu_visible:
        raise ConfigError(
            "eval_device=cuda but this step sees no GPU: set eval_gpus to 1 or more, or use eval_device=cpu"
        )
    if requested == "auto" and not gpu_visible:
        if trained.on_gpu:
            return Placement("cpu", "fp32", "training used GPUs but this step sees none: evaluating on CPU "
                             "(slow for large models); give the evaluate step a GPU (eval_gpus)")  # fmt: skip
        return Placement("cpu", "fp32", "no GPU on this step: fp32 on CPU")
    device = "cuda" if requested == "auto" else requested
    if trained.on_gpu and trained.dtype in TORCH_DTYPES and (trained.dtype != "bf16" or bf16_supported):
        return Placement(
            device, trained.dtype, f"the model was trained on {trained.device} in {trained.dtype}"
        )
    dtype = "bf16" if bf16_supported else "fp32"
    return Placement(
        device, dtype, f"a GPU on this step: {dtype}" + ("" if bf16_supported else " (no bf16 here)")
    )


def visible_hardware() -> tuple[bool, bool]:
    """(a GPU is visible, it supports bf16), as torch sees them."""
    import torch

    visible = torch.cuda.is_available()
    return visible, bool(visible and torch.cuda.is_bf16_supported())


#: Sequences per forward pass on CPU (and the least on a GPU): the step's former fixed batch.
CPU_BATCH = 8
#: The most on a GPU: past this, a forward pass is long enough that larger batches gain little.
MAX_GPU_BATCH = 64
#: Kept free of the GPU's memory beyond the weights: the CUDA context, the allocator's fragmentation.
GPU_RESERVE_BYTES = 2 << 30


def eval_batch_size(
    requested: int, placement: Placement, hf_config: dict, weight_bytes: int, longest: int, gpu_bytes: int
) -> tuple[int, str]:
    """Sequences per forward pass, and why: `requested` when set (>= 1); -1 (auto) gives CPU_BATCH on CPU and,
    on a GPU, as many of the longest examples as half the memory beside the weights holds, within
    [CPU_BATCH, MAX_GPU_BATCH], a multiple of CPU_BATCH. Per sequence: the logits (half precision, then an fp32
    copy of the trained positions and its log-softmax: 10 bytes a vocabulary entry a token, the teacher-forced
    peak) and the generation's KV cache."""
    if requested >= 1:
        return requested, f"batch_size={requested}"
    if placement.device == "cpu":
        return CPU_BATCH, f"{CPU_BATCH} sequences a batch on CPU"
    vocab = int(hf_config.get("vocab_size") or 0)
    layers = int(hf_config.get("num_hidden_layers") or 0)
    heads = int(hf_config.get("num_attention_heads") or 1)
    kv_heads = int(hf_config.get("num_key_value_heads") or heads)
    head_dim = int(hf_config.get("head_dim") or int(hf_config.get("hidden_size") or 0) // heads)
    per_sequence = max(longest, 1) * (10 * vocab + 2 * layers * kv_heads * head_dim * 2)
    free = (gpu_bytes - weight_bytes - GPU_RESERVE_BYTES) / 2
    fits = int(free // per_sequence) if per_sequence and free > 0 else 0
    size = max(CPU_BATCH, min(MAX_GPU_BATCH, fits) // CPU_BATCH * CPU_BATCH)
    return size, (
        f"{size} sequences a batch: half the GPU memory beside the weights "
        f"({max(free, 0) / 2**30:.0f} GiB) holds {fits} of the longest ({longest} tokens)"
    )


def gpu_memory_bytes() -> int:
    """Total memory of the GPU the step uses (0 without one), as torch sees it."""
    import torch

    return (
        torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        if torch.cuda.is_available()
        else 0
    )
