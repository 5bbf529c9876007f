"""The transformers engine's fast defaults (DESIGN.md §7): what the training process chooses for the settings the
step left to it (`auto`), from the hardware it runs on and the model, each with its reason — printed in the step
log, recorded in `trl_config.json` and shown in the report. An explicit setting is never changed.

- batching: padding-free packing (TRL's best-fit-decreasing packs) where a GPU has flash attention, which keeps the
  packed rows apart; elsewhere rows of similar length share a micro-batch (the length-grouped sampler), so little
  of each batch is padding; image + text rows are neither packed nor grouped (TRL tokenizes them batch by batch);
- Liger's fused Triton kernels (RMSNorm, RoPE, SwiGLU, fused linear cross-entropy) where the image has liger-kernel
  and training runs on a GPU;
- the micro-batch (`choose_batch`, once max_seq_len is chosen): on a GPU whole sequences of about 8-16k tokens
  (_shared/micro_batch_rule.py) that fit without activation checkpointing, then fewer down to what keeps the
  model's matmuls busy, then with checkpointing; PLANNED_BATCH on the CPU and for image + text rows;
- activation checkpointing only when a memory model says the run does not fit the GPU without it;
- on several GPUs, DDP where one GPU holds a whole training replica (only the gradients cross between them), FSDP2
  where it does not (the weights, gradients and optimizer states sharded over every GPU of the run).

Imports torch only in `Hardware.here`.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.engines import CLASSIFICATION, IMAGE_TEXT
from kfp_finetune.components._shared.micro_batch_rule import busy_floor, busy_sequences
from kfp_finetune.components._shared.safetensors_header import read_tensor_entries

AUTO = "auto"
SWITCH_CHOICES = (AUTO, True, False)
GIB = 1024**3
#: Share of a GPU's memory a run may plan for: the CUDA context, the allocator's fragmentation and NCCL's buffers
#: take the rest.
USABLE_SHARE = 0.85
#: Activation bytes per token, layer and unit of hidden size kept for the backward pass in 16-bit precision with
#: fused attention (no score matrix kept): Korthikanti et al., "Reducing Activation Recomputation in Large
#: Transformer Models" (2022), 34·s·b·h per layer.
ACTIVATION_BYTES = 34
#: Bytes a parameter costs in training by method: full = fp32 weights, gradients and Adam's two moments; LoRA = the
#: frozen bf16 base (DoRA's too); QLoRA = 4-bit NF4 with its double-quantized scales (~4.5 bits). Adapters are a
#: rounding error.
BYTES_PER_PARAMETER = {"full": 16.0, "lora": 2.0, "dora": 2.0, "qlora": 0.56}
#: Logits and their gradient in fp32 per token and vocabulary entry, unless Liger's fused cross-entropy computes
#: the loss in chunks without them.
LOGIT_BYTES = 8
#: Rows per micro-batch where no GPU is to be filled (the CPU), where the rows' tokens are not known before
#: training (image + text rows), and what the run floor counts before the training process chooses
#: (run_length.py).
PLANNED_BATCH = 8


@dataclass(frozen=True)
class Choice:
    setting: str
    value: Any
    reason: str

    def line(self) -> str:
        return f"{self.setting}={json.dumps(self.value)}: {self.reason}"


@dataclass(frozen=True)
class Hardware:
    """What the training process sees: a CUDA GPU (and one GPU's memory), flash attention, Liger's kernels."""

    cuda: bool
    gpu_bytes: int | None = None
    flash_attention: bool = False
    liger: bool = False

    @classmethod
    def here(cls, device: str) -> Hardware:
        import torch

        cuda = device != "cpu" and torch.cuda.is_available()
        return cls(
            cuda=cuda,
            gpu_bytes=torch.cuda.get_device_properties(0).total_memory if cuda else None,
            flash_attention=importlib.util.find_spec("flash_attn") is not None,
            liger=importlib.util.find_spec("liger_kernel") is not None,
        )


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    hidden: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, model_dir: str | Path) -> ModelSize:
        """From the folder's config.json and its safetensors headers (the tensors' shapes; no weight is read)."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        text = config.get("text_config") or config
        parameters = sum(_tensor_elements(path) for path in Path(model_dir).glob("*.safetensors"))
        return cls(parameters, text["hidden_size"], text["num_hidden_layers"], text["vocab_size"])


def _tensor_elements(path: Path) -> int:
    """The elements of a safetensors file's tensors, from its header."""
    return sum(math.prod(entry["shape"]) for entry in read_tensor_entries(path).values())


def training_bytes(
    method: str, model: ModelSize, tokens: int, *, checkpointing: bool, liger: bool, shards: int = 1
) -> int:
    """The memory model: one device's bytes to train `tokens` tokens per micro-batch, the weights and their
    training state sharded over `shards` GPUs (FSDP2; 1: a whole replica)."""
    weights = model.parameters * BYTES_PER_PARAMETER[method] / shards
    layer = tokens * model.hidden * ACTIVATION_BYTES
    # Checkpointed: each layer's 16-bit input is kept, and one layer's activations are rebuilt at a time.
    activations = layer + tokens * model.hidden * 2 * model.layers if checkpointing else layer * model.layers
    logits = 0 if liger else tokens * model.vocab * LOGIT_BYTES
    return int(weights + activations + logits)


def choose(settings: Any, hardware: Hardware, model: ModelSize | None = None, world: int = 1) -> list[Choice]:
    """The choices for `settings`' auto settings (SftSettings: packing, liger_kernel, fsdp, gradient_checkpointing)
    for a run of `world` processes. `model` is read only for the memory model (a GPU, checkpointing or sharding
    left to us: `needs_model`)."""
    chosen = []
    classifier = settings.task == CLASSIFICATION
    if settings.packing == AUTO:
        chosen += _IMAGE_ROWS if settings.task == IMAGE_TEXT else _batching(hardware, classifier)
    liger = settings.liger_kernel
    if liger == AUTO:
        found = _liger(hardware, classifier)
        liger = found.value
        chosen.append(found)
    sharded = settings.fsdp
    if settings.fsdp == AUTO and world > 1:
        found = _sharding(settings, hardware, model, world, bool(liger))
        sharded = found.value
        chosen.append(found)
    if settings.gradient_checkpointing == AUTO:
        chosen.append(_checkpointing(settings, hardware, model, liger, world if sharded is True else 1))
    return chosen


def needs_model(settings: Any, hardware: Hardware, world: int) -> bool:
    """Whether `choose` reads the model's size: its memory model decides checkpointing or sharding on a GPU."""
    left = settings.gradient_checkpointing == AUTO or (settings.fsdp == AUTO and world > 1)
    return hardware.cuda and bool(hardware.gpu_bytes) and left


def _batching(hardware: Hardware, classifier: bool = False) -> list[Choice]:
    if classifier:
        return [
            Choice(
                "packing",
                False,
                "a classifier reads one padded row per example (packs are causal-LM sequences)",
            ),
            _GROUPED,
        ]
    if hardware.cuda and hardware.flash_attention:
        return [Choice("packing", True, "padding-free packs (TRL's best-fit decreasing), flash attention keeping "
                                        "the packed rows apart: no token of a batch is padding")]  # fmt: skip
    missing = "no GPU" if not hardware.cuda else "flash attention (flash-attn) is not installed"
    return [
        Choice(
            "packing", False, f"packing rows needs flash attention on a GPU to keep them apart ({missing})"
        ),
        _GROUPED,
    ]


# TRL tokenizes image + text rows in its collator, batch by batch (their lengths are unknown before): neither
# packs nor length-grouped batches.
_IMAGE_ROWS = [
    Choice("packing", False, "image + text rows train whole, each with its images (TRL packs no vision rows)")
]

_GROUPED = Choice(
    "train_sampling_strategy",
    "group_by_length",
    "rows of similar length share a micro-batch, so little of it is padding",
)


def _liger(hardware: Hardware, classifier: bool = False) -> Choice:
    if classifier:
        return Choice(
            "liger_kernel", False, "Liger's kernels patch causal LMs (their loss and decoder layers)"
        )
    if not hardware.cuda:
        return Choice(
            "liger_kernel", False, "Liger's kernels are Triton GPU kernels: training runs on the CPU"
        )
    if not hardware.liger:
        return Choice("liger_kernel", False, "liger-kernel is not installed in this image")
    return Choice("liger_kernel", True, "Liger's fused kernels: the loss without materialized logits, fused "
                                        "RMSNorm / RoPE / SwiGLU (less memory, more tokens/s)")  # fmt: skip


def choose_batch(settings: Any, hardware: Hardware, model: ModelSize | None, world: int = 1) -> Choice:
    """The micro-batch (rows, or packs, per device) where batch_size is auto, once max_seq_len is chosen; `model`
    is read on a GPU only. Rows of one micro-batch are padded to its longest (length-grouped) or packed to
    max_seq_len, so memory is planned for whole sequences."""
    if not hardware.cuda or not hardware.gpu_bytes:
        return Choice("batch_size", PLANNED_BATCH, "training runs on the CPU: no GPU to keep busy")
    if settings.task == IMAGE_TEXT:
        return Choice("batch_size", PLANNED_BATCH, "image + text rows: their tokens, images included, are known "
                                                   "only batch by batch")  # fmt: skip
    seq = settings.max_seq_len
    floor = busy_floor(model.hidden)
    busy = busy_sequences(seq)
    smaller = [n for n in range(busy[-1] - 1, 0, -1) if n * seq >= floor]
    plans = [(n, False) for n in busy + smaller] + [(n, True) for n in busy] + [(1, True)]
    if isinstance(settings.gradient_checkpointing, bool):
        plans = [plan for plan in plans if plan[1] is settings.gradient_checkpointing]
    liger = settings.liger_kernel if isinstance(settings.liger_kernel, bool) else _liger(hardware).value
    shards = world if _sharded(replace(settings, batch_size=1), hardware, model, world, liger) else 1
    budget = hardware.gpu_bytes * USABLE_SHARE

    def need(plan: tuple[int, bool]) -> int:
        rows, checkpointing = plan
        return training_bytes(settings.method, model, rows * seq, checkpointing=checkpointing, liger=liger,
                              shards=shards)  # fmt: skip

    rows, checkpointing = next((plan for plan in plans if need(plan) <= budget), plans[-1])
    tokens = rows * seq
    sizes = f"{need((rows, checkpointing)) / GIB:.1f} GiB of {budget / GIB:.1f} GiB usable"
    if need((rows, checkpointing)) > budget:
        why = f"the least there is, and still OVER the GPU ({sizes}): expect out-of-memory, lower tune_max_seq_len"
    elif checkpointing and settings.gradient_checkpointing == AUTO:
        why = f"with activation checkpointing: without, even {floor} tokens would not fit ({sizes})"
    elif rows in busy:
        why = f"8-16k tokens keep the GPU busy ({sizes})"
    else:
        why = f"the most that fits without activation checkpointing, which would cost ~30 % of each step ({sizes})"
    return Choice(
        "batch_size", rows, f"{rows} x {seq} tokens = {tokens} tokens per micro-batch at most: {why}"
    )


def _micro_batch_tokens(settings: Any) -> int:
    """Tokens per micro-batch at most (0 before the training process chose max_seq_len and the micro-batch)."""
    if AUTO in (settings.max_seq_len, settings.batch_size):
        return 0
    return settings.batch_size * settings.max_seq_len


def _sharded(settings: Any, hardware: Hardware, model: ModelSize | None, world: int, liger: bool) -> bool:
    """Whether the run's weights are sharded over its `world` processes (FSDP2): as set, else as `_sharding`."""
    if isinstance(settings.fsdp, bool):
        return settings.fsdp and world > 1
    return world > 1 and _sharding(settings, hardware, model, world, liger).value


def _sharding(settings: Any, hardware: Hardware, model: ModelSize | None, world: int, liger: bool) -> Choice:
    if not hardware.cuda or not hardware.gpu_bytes:
        return Choice("fsdp", False, f"training runs on the CPU: the {world} processes train data-parallel "
                                     "(accelerate shards GPU runs only)")  # fmt: skip
    if settings.method == "qlora":
        return Choice("fsdp", False, f"QLoRA's 4-bit base is small and its quantized weights are not sharded "
                                     f"here: the {world} GPUs train data-parallel (DDP)")  # fmt: skip
    tokens = _micro_batch_tokens(settings)
    # The leanest replica: activations recomputed unless the user turned that off.
    checkpointing = settings.gradient_checkpointing is not False
    budget = hardware.gpu_bytes * USABLE_SHARE
    replica = training_bytes(settings.method, model, tokens, checkpointing=checkpointing, liger=liger)
    sizes = f"{replica / GIB:.1f} GiB{f' for {tokens} tokens per micro-batch' if tokens else ''}"
    if replica <= budget:
        return Choice("fsdp", False, f"one GPU holds a whole replica ({sizes}, of {budget / GIB:.1f} GiB "
                                     f"usable): the {world} GPUs train data-parallel (DDP), only the gradients "
                                     "cross between them, not FSDP2's gathered weights")  # fmt: skip
    shard = training_bytes(
        settings.method, model, tokens, checkpointing=checkpointing, liger=liger, shards=world
    )
    return Choice("fsdp", True, f"a whole replica needs {sizes}, more than the {budget / GIB:.1f} GiB usable: "
                                f"FSDP2 shards the weights, gradients and optimizer states over the {world} GPUs "
                                f"({shard / GIB:.1f} GiB each)")  # fmt: skip


def _checkpointing(
    settings: Any, hardware: Hardware, model: ModelSize | None, liger: bool, shards: int = 1
) -> Choice:
    if not hardware.cuda or not hardware.gpu_bytes:
        return Choice("gradient_checkpointing", False, "training runs on the CPU: no GPU memory to save, and "
                                                       "recomputing activations would only slow it")  # fmt: skip
    # A check before the training process chose max_seq_len from the rows (seq_len.py) and the micro-batch.
    tokens = _micro_batch_tokens(settings)
    if not tokens:
        return Choice("gradient_checkpointing", True,
                      "until max_seq_len and the micro-batch are chosen from the rows: TRL's default")  # fmt: skip
    budget = hardware.gpu_bytes * USABLE_SHARE
    need = training_bytes(
        settings.method, model, tokens, checkpointing=False, liger=bool(liger), shards=shards
    )
    sharded = f", sharded over {shards} GPUs" if shards > 1 else ""
    sizes = (
        f"{need / GIB:.1f} GiB for {tokens} tokens per micro-batch{sharded}, of {budget / GIB:.1f} GiB usable"
    )
    if need <= budget:
        return Choice("gradient_checkpointing", False, f"fits without recomputing activations ({sizes})")
    return Choice(
        "gradient_checkpointing", True, f"activations recomputed in the backward pass: without, {sizes}"
    )
