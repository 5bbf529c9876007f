"""Processed tokens/s and MFU (model FLOPs utilisation) of a run, beside torchtune's trained-token rate.

torchtune's `tokens_per_second_per_gpu` counts only the tokens trained on (labels not masked): prompt tokens with
`train_on_input=False` and padding are left out, although the GPU computes them all. What the hardware does is
the *processed* rate: for packed data every micro-batch is `batch_size x max_seq_len` tokens, so one optimizer
step processes `batch_size x max_seq_len x gradient_accumulation_steps` tokens per GPU (x devices in all), divided
by the step time (`seconds_per_step`, which our metric logger adds to each line). Without packing, micro-batches
are padded to their longest row and not logged: the processed rate is then torchtune's trained-token rate, a
lower bound (said where it is shown).

MFU = achieved model FLOP/s per GPU / the GPU's dense bf16 peak. The trainer records the GPU's name in the run
folder (`device.json`, written by entrypoint.py before `tune run`); an unknown GPU, a CPU run or an fp32 run gets
no MFU, with the reason.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared.metrics_file import StepMetrics

#: Written by entrypoint.py into the run folder before training: {"name": torch.cuda.get_device_name(), ...}.
DEVICE_FILE = "device.json"
#: Added by our metric logger to every logged line after the first: wall seconds per optimizer step since the
#: previous logged line.
STEP_SECONDS = "seconds_per_step"

# Dense (no sparsity) bf16 tensor-core peak per GPU, TFLOP/s, from NVIDIA's product datasheets (the figures there
# "with sparsity" halved). Matched in order against torch.cuda.get_device_name(), most specific first.
PEAK_BF16_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"GH200", "GH200", 989.0),
    (r"H200 NVL", "H200 NVL", 835.0),
    (r"H200", "H200 SXM", 989.0),
    (r"H100 NVL", "H100 NVL", 835.0),
    (r"H100 PCIe", "H100 PCIe", 756.0),
    (r"H100", "H100 SXM", 989.0),  # "NVIDIA H100 80GB HBM3"
    (r"H800", "H800 SXM", 989.0),
    (r"B200", "B200", 2250.0),
    (r"A100", "A100", 312.0),  # SXM and PCIe alike
    (r"A800", "A800", 312.0),
    (r"L40S", "L40S", 362.0),
    (r"L40\b", "L40", 181.0),
    (r"\bL4\b", "L4", 121.0),
    (r"A10G", "A10G", 125.0),  # AWS' A10 variant: no datasheet of its own; the A10's figure
    (r"\bA10\b", "A10", 125.0),
    (r"RTX 4090", "GeForce RTX 4090", 165.0),
)


def peak_tflops(device_name: str) -> tuple[str, float] | None:
    """(product, dense bf16 TFLOP/s) for a CUDA device name, or None when the GPU is not in the table."""
    for pattern, product, tflops in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return product, tflops
    return None


def record_device(run_dir: str | Path) -> dict:
    """What the trainer runs on, written to `run_dir/device.json` (called where torch runs, before training)."""
    import torch

    if torch.cuda.is_available():
        device = {"name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count(), "cuda": True}
    else:
        device = {"name": "cpu", "count": 1, "cuda": False}
    path = Path(run_dir) / DEVICE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(device))
    tmp.replace(path)
    return device


def read_device(run_dir: str | Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / DEVICE_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_packed(config: dict) -> bool:
    datasets = config.get("dataset")
    nodes = datasets if isinstance(datasets, list) else [datasets or {}]
    return any(isinstance(node, dict) and node.get("packed") for node in nodes)


def trainable_parameters(hf_config: dict, model_node: dict) -> int:
    """LoRA (and DoRA/QLoRA) adapter parameters for the model node's rank and modules, from the model's dims."""
    rank = model_node.get("lora_rank")
    if not rank:
        return 0
    dim, layers = hf_config["hidden_size"], hf_config["num_hidden_layers"]
    heads = hf_config["num_attention_heads"]
    kv_heads = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config.get("head_dim") or dim // heads
    inter = hf_config.get("intermediate_size", 4 * dim)
    shapes = {  # (in, out) of each torchtune projection
        "q_proj": (dim, heads * head_dim),
        "k_proj": (dim, kv_heads * head_dim),
        "v_proj": (dim, kv_heads * head_dim),
        "output_proj": (heads * head_dim, dim),
    }
    linears = [shapes[m] for m in model_node.get("lora_attn_modules", []) if m in shapes]
    if model_node.get("apply_lora_to_mlp"):
        linears += [(dim, inter), (dim, inter), (inter, dim)]
    per_layer = sum(rank * (n_in + n_out) for n_in, n_out in linears)
    output = rank * (dim + hf_config["vocab_size"]) if model_node.get("apply_lora_to_output") else 0
    return layers * per_layer + output


def flops_per_token(hf_config: dict, model_node: dict, num_parameters: int, seq_len: int | None) -> float:
    """Training FLOPs per processed token (forward + backward), from the model's dims.

    Matmul parameters N: all weights except the input embedding (a lookup, no FLOPs; a tied embedding is the
    output projection and counts). Full fine-tune: 6N (forward 2N, backward 4N). LoRA family (LoRA, QLoRA, DoRA):
    4N + 6N_trainable: forward 2N; backward 2N for the input gradients through every frozen weight (adapters sit
    in every layer, so the gradient flows through all of them) and no weight gradients for frozen weights; the
    adapters add 2N_trainable forward and 4N_trainable backward. (The rougher 2N + 4N_trainable leaves out the
    backward through the frozen weights; QLoRA's dequantization is not counted: it is not model FLOPs.)
    Attention scores and values add 12 x layers x dim x seq_len per token (PaLM's convention, causal mask not
    halved).
    """
    dim, layers = hf_config["hidden_size"], hf_config["num_hidden_layers"]
    embedding = 0 if hf_config.get("tie_word_embeddings") else hf_config["vocab_size"] * dim
    n = num_parameters - embedding
    trainable = trainable_parameters(hf_config, model_node)
    dense = 4 * n + 6 * trainable if model_node.get("lora_rank") else 6 * n
    return float(dense + 12 * layers * dim * (seq_len or 0))


@dataclass(frozen=True)
class Throughput:
    """A run's speed: torchtune's trained-token rate, the processed rate and MFU (None: not known, see notes)."""

    trained_tokens_per_second: float | None  # per GPU, torchtune's tokens_per_second_per_gpu
    processed_tokens_per_second: float | None  # per GPU
    processed_note: str
    world_size: int
    flops_per_token: float | None
    device: str
    peak_tflops: float | None
    mfu: float | None
    mfu_note: str

    def metrics(self) -> dict[str, float]:
        values = {
            "processed_tokens_per_second": self.processed_tokens_per_second,
            "mfu": self.mfu,
            "peak_tflops": self.peak_tflops,
        }
        return {k: float(v) for k, v in values.items() if v is not None}

    def rows(self) -> list[tuple[str, str]]:
        """Report rows: each value with how it was obtained, or why it is missing."""
        trained = self.trained_tokens_per_second
        processed = self.processed_tokens_per_second
        return [
            ("trained tokens/s per GPU (torchtune)", f"{trained:,.1f}" if trained is not None else "not logged"),
            ("processed tokens/s per GPU", (f"{processed:,.1f} " if processed is not None else "") + f"({self.processed_note})"),
            ("processed tokens/s in all", f"{processed * self.world_size:,.1f} on {self.world_size} GPU(s)" if processed is not None else "not known"),
            ("model FLOPs per processed token", f"{self.flops_per_token:.4g}" if self.flops_per_token else "not known"),
            ("device", self.device + (f" ({self.peak_tflops:g} TFLOP/s dense bf16 peak)" if self.peak_tflops else "")),
            ("MFU", f"{self.mfu:.1%} ({self.mfu_note})" if self.mfu is not None else f"not reported: {self.mfu_note}"),
        ]  # fmt: skip

    def log_line(self) -> str:
        return "throughput: " + " | ".join(f"{name} {value}" for name, value in self.rows())


def _median_step_seconds(steps: list[StepMetrics]) -> float | None:
    # The first logged interval holds compilation and warm-up; an epoch end adds a checkpoint: the median is robust.
    times = [s.values[STEP_SECONDS] for s in steps[1:] if s.values.get(STEP_SECONDS, 0) > 0]
    return statistics.median(times) if times else None


def attention_context(token_lengths: list[int] | None, max_seq_len: int | None) -> float | None:
    """The mean number of tokens a token attends over when attention stays within each row (packs mask it per
    document): sum(l^2) / sum(l) over the rows' lengths cut at max_seq_len. None without lengths."""
    cut = [min(n, max_seq_len) if max_seq_len else n for n in token_lengths or [] if n > 0]
    return sum(n * n for n in cut) / sum(cut) if cut else None


def measure(
    config: dict,
    hf_config: dict,
    num_parameters: int,
    steps: list[StepMetrics],
    device: dict | None,
    world_size: int = 1,
    token_lengths: list[int] | None = None,
) -> Throughput:
    """The throughput of a finished run from its resolved config, its logged steps and its device.json.

    Attention is charged over each row's own tokens (`token_lengths`: the data's, as dataset-initialize recorded or
    the step sampled them), not over the whole pack: a pack's document mask computes no scores across rows, and
    charging max_seq_len overstated MFU by 11-21 % for an 8B model at 2048-4096 tokens. Without lengths it is
    charged over max_seq_len and the MFU note says so (an upper bound)."""
    speeds = [s.tokens_per_second for s in steps if s.tokens_per_second is not None]
    trained = sum(speeds) / len(speeds) if speeds else None
    seq_len = (config.get("tokenizer") or {}).get("max_seq_len")
    step_seconds = _median_step_seconds(steps)
    processed: float | None
    if is_packed(config) and seq_len:
        per_step = config.get("batch_size", 1) * seq_len * config.get("gradient_accumulation_steps", 1)
        processed = per_step / step_seconds if step_seconds else None
        note = (
            f"packed: {per_step:,} tokens per optimizer step per GPU (batch_size x max_seq_len x accumulation)"
            + ("" if step_seconds else "; no step time logged")
        )
    else:
        processed = trained
        note = (
            "unpacked: torchtune's trained-token rate, a lower bound (masked and padding tokens not counted)"
        )
    model_node = config.get("model") or {}
    context = attention_context(token_lengths, seq_len)
    flops = flops_per_token(hf_config, model_node, num_parameters, round(context) if context else seq_len)
    name = (device or {}).get("name") or "unknown"
    peak = peak_tflops(name) if (device or {}).get("cuda") else None
    mfu, why = None, ""
    if not device:
        why = f"the trainer recorded no {DEVICE_FILE}"
    elif not device.get("cuda"):
        why = "trained on CPU"
    elif peak is None:
        why = f"{name!r} is not in the table of GPU peaks (throughput.PEAK_BF16_TFLOPS)"
    elif config.get("dtype") not in ("bf16", "fp16"):
        why = f"dtype {config.get('dtype')}: the peak is for bf16 tensor cores"
    elif processed is None:
        why = "no processed token rate"
    else:
        mfu = processed * flops / (peak[1] * 1e12)
        why = (
            f"attention over each row's tokens (mean context {context:,.0f} of max_seq_len {seq_len})"
            if context
            else "attention charged over max_seq_len (no token lengths known): an upper bound"
        )
    return Throughput(
        trained_tokens_per_second=trained,
        processed_tokens_per_second=processed,
        processed_note=note,
        world_size=world_size,
        flops_per_token=flops,
        device=name if peak is None else f"{name} = {peak[0]}",
        peak_tflops=peak[1] if peak else None,
        mfu=mfu,
        mfu_note=why,
    )
