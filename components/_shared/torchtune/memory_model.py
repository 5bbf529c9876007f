"""The memory model of a torchtune run: GiB per GPU for the weights, gradients, optimizer state and activations of
one micro-batch, from the model's config.json dims (`estimate_memory`), and one GPU's memory from its product
label. defaults.py chooses the micro-batch, activation checkpointing and offloading with it; the family size tests
check it against each family's published sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfp_finetune.components._shared.torchtune.model_inspection import ModelDir

GIB = 1024**3
DEFAULT_GPU_MEMORY_GIB = 80.0

#: `nvidia.com/gpu.product` label (GPU feature discovery) fragments -> memory in GiB, most specific first.
GPU_PRODUCTS = (
    ("H200", 141.0), ("GH200", 96.0), ("H100-NVL", 94.0), ("H100", 80.0), ("H800", 80.0), ("B200", 180.0),
    ("A100-SXM4-40GB", 40.0), ("A100-PCIE-40GB", 40.0), ("A100", 80.0), ("A800", 80.0), ("L40S", 48.0),
    ("L40", 48.0), ("A6000", 48.0), ("A40", 48.0), ("L4", 24.0), ("A10G", 24.0), ("A10", 24.0),
    ("V100-SXM2-32GB", 32.0), ("V100", 16.0), ("T4", 16.0),
)  # fmt: skip


def gpu_memory_from_product(product: str | None) -> float | None:
    """GiB of one GPU named by a `nvidia.com/gpu.product` label value (e.g. NVIDIA-H100-80GB-HBM3); None if unknown."""
    if not product:
        return None
    name = product.upper()
    for fragment, gib in GPU_PRODUCTS:
        if fragment in name:
            return gib
    return None


@dataclass
class MemoryEstimate:
    """GiB per GPU for one run, by component; `activations_*` for the micro-batch's tokens."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float  # without checkpointing
    activations_checkpointed: float
    activations_offloaded: float
    trained_parameters: int

    @property
    def fixed(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    def total(self, checkpointing: bool, offloading: bool = False) -> float:
        if offloading:
            return self.fixed + self.activations_offloaded
        return self.fixed + (self.activations_checkpointed if checkpointing else self.activations)

    def summary(self, checkpointing: bool, offloading: bool = False) -> str:
        act = self.total(checkpointing, offloading) - self.fixed
        return (
            f"params {self.parameters:.1f} + grads {self.gradients:.1f} + optimizer {self.optimizer:.1f} + "
            f"activations {act:.1f} = {self.total(checkpointing, offloading):.1f} GiB per GPU"
        )


def _dims(model: ModelDir) -> dict[str, int]:
    c = model.hf_config
    dim, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or dim // heads
    return {
        "dim": dim,
        "layers": c["num_hidden_layers"],
        "q": heads * head_dim,
        "kv": (c.get("num_key_value_heads") or heads) * head_dim,
        "hidden": c.get("intermediate_size", 4 * dim),
        "vocab": c["vocab_size"],
    }


def lora_parameters(model: ModelDir, lora: dict) -> int:
    """Adapter parameters: rank x (in + out) for every adapted projection."""
    d, rank = _dims(model), int(lora.get("lora_rank") or 8)
    shapes = {
        "q_proj": (d["dim"], d["q"]),
        "k_proj": (d["dim"], d["kv"]),
        "v_proj": (d["dim"], d["kv"]),
        "output_proj": (d["q"], d["dim"]),
    }
    per_layer = sum(rank * sum(shapes[m]) for m in lora.get("lora_attn_modules") or () if m in shapes)
    if lora.get("apply_lora_to_mlp"):
        per_layer += 3 * rank * (d["dim"] + d["hidden"])
    total = per_layer * d["layers"]
    if lora.get("apply_lora_to_output"):
        total += rank * (d["dim"] + d["vocab"])
    return total


def estimate_memory(
    model: ModelDir,
    method: str,
    lora: dict | None,
    dtype: str,
    optimizer: str,
    world: int,
    tokens: int,
    loss_chunks: int = 1,
) -> MemoryEstimate:
    """Parameters (QLoRA: 4-bit base linears), gradients and AdamW state (two fp32 moments; 8-bit optimizers one
    byte each) of the trained parameters, divided by the FSDP sharding over `world` GPUs; activations per token
    from the model's dims for `tokens` tokens per micro-batch.

    Activations per token and layer, in elements of `dtype` (SDPA / flash attention: no seq x seq scores):
    4 x dim (two norm outputs, two residual inputs) + 3 x q (q, attention output, output projection input)
    + 2 x kv (k, v) + 4 x intermediate (gate, up, activation, product), and 2 x (q + kv) more where q and k
    pass a norm per head (Qwen3, Gemma 3: the norms' inputs and outputs), 2 x dim more where the attention and
    MLP outputs pass a norm before the residual (Gemma 2, 3); q and kv are heads x head_dim, which need not
    be dim. With checkpointing only each layer's input (dim) is kept, plus one layer recomputed at a time;
    offloading moves the kept inputs to CPU. The logits add vocab x (2 bytes + 4 bytes for the fp32 loss) per
    token in every case; with torchtune's chunked cross-entropy (`loss_chunks` output chunks, 8 by default) only one
    chunk at a time is upcast to fp32: vocab x (2 + 4 / loss_chunks) bytes."""
    d = _dims(model)
    width = 4 if dtype == "fp32" else 2
    total = model.num_parameters
    linear = d["layers"] * (d["dim"] * (2 * d["q"] + 2 * d["kv"]) + 3 * d["dim"] * d["hidden"])
    # QLoRA: NF4 base linears (0.5 byte each), the rest in dtype.
    weight_bytes = linear * 0.5 + (total - linear) * width if method == "qlora" else total * width
    trained = total if method == "full" else lora_parameters(model, lora or {})
    if method != "full":
        weight_bytes += trained * width
    optimizer_bytes_per = 2 if "8bit" in optimizer.lower() else 8
    shard = max(world, 1)
    per_layer = 4 * d["dim"] + 3 * d["q"] + 2 * d["kv"] + 4 * d["hidden"]
    if model.family.qk_norms:
        per_layer += 2 * (d["q"] + d["kv"])
    if model.family.post_norms:
        per_layer += 2 * d["dim"]
    logits = d["vocab"] * (2 + 4 / max(loss_chunks, 1))
    act = tokens * (d["layers"] * per_layer * width + logits)
    act_ckpt = tokens * (d["layers"] * d["dim"] * width + per_layer * width + logits)
    act_offload = tokens * (per_layer * width + logits)
    return MemoryEstimate(
        parameters=weight_bytes / shard / GIB,
        gradients=trained * width / shard / GIB,
        optimizer=trained * optimizer_bytes_per / shard / GIB,
        activations=act / GIB,
        activations_checkpointed=act_ckpt / GIB,
        activations_offloaded=act_offload / GIB,
        trained_parameters=trained,
    )
