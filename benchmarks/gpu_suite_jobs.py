"""The GPU reference suite's jobs, their model folders and data, and the expert's hand-written settings.

Jobs (real model shapes, random weights: nothing is downloaded): Llama-3.2-1B LoRA on 1 GPU, Llama-3.1-8B LoRA on
1 GPU, Llama-3.1-8B full on 8 GPUs, Qwen2.5-7B full on 2 nodes x 8 GPUs, Llama-3.1-8B QLoRA on 1 GPU. Each model
folder holds a config.json with the published dims, random bf16 safetensors of those shapes (made here, sharded
with an index, as a hub download would be) and the tiny kit's tokenizer of the family (tokenizer speed does not
enter the step time).

The expert's settings (`expert_settings`) are what a torchtune user writes by hand for the GPU, from a rule of
thumb that reads only the GPU's memory, the model's shape and the method — not our memory model:
- packed at a fixed 4096 tokens, compile on, AdamW as the base config ships it (fused);
- memory for activations = 85 % of the GPU's memory less the per-GPU training state: bf16 weights (2 bytes a
  parameter; QLoRA's NF4 ~0.6), and for full fine-tuning also bf16 gradients and AdamW's two bf16 moments
  (8 bytes a parameter), sharded over every GPU of the job (FSDP);
- activations a token: 34·hidden·layers bytes without activation checkpointing (bf16, flash attention), the
  logits 6·vocab (bf16 + the fp32 loss chunk); with checkpointing only the layer inputs 2·hidden·layers plus one
  layer's 34·hidden. Checkpointing is on only when one 4096-token pack does not fit without it;
- micro-batch = the packs of 4096 that fit, at most 16k tokens (an 80 GB GPU is busy beyond that);
- gradient accumulation = 64k tokens (16 packs) per optimizer step over all GPUs, at least 1.

Data: synthetic long-tailed instruct rows (benchmarks.common.long_tailed_rows) of about 300 tokens median, a few
up to ~4k, like instruction-tuning sets. The `cliff` variant (`--data cliff`) is two data sets whose 99th
percentile of row lengths makes the defaults' data-derived max_seq_len (seq_len.py: p99 rounded up to 256) land
on 2304 and 3072 — the lengths at which Llama-3.1-8B LoRA on one 80 GB GPU used to switch activation
checkpointing on (RESULTS.md 5e): 4 % of its rows are 60-220 tokens shorter than that length, the rest short.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import fresh_dir, long_tailed_rows

_LLAMA_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
# Published config.json dims (meta-llama/Llama-3.2-1B, meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B).
LLAMA_3_2_1B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {**_LLAMA_ROPE, "factor": 32.0}, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip
LLAMA_3_1_8B = {
    **LLAMA_3_2_1B, "hidden_size": 4096, "num_hidden_layers": 32, "head_dim": 128, "intermediate_size": 14336,
    "rope_scaling": {**_LLAMA_ROPE, "factor": 8.0}, "tie_word_embeddings": False,
}  # fmt: skip
QWEN_2_5_7B = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 131072,
    "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip


@dataclass(frozen=True)
class Job:
    name: str
    model: str  # folder name under models/
    family: str  # the tiny kit's tokenizer family
    hf_config: dict
    method: str
    nodes: int
    gpus: int  # per node
    expert: dict | None = None  # explicit expert settings (the tiny kit's); None: expert_settings' rule

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus


JOBS = (
    Job("llama3.2-1b-lora-1gpu", "llama3.2-1b", "llama3_2", LLAMA_3_2_1B, "lora", 1, 1),
    Job("llama3.1-8b-lora-1gpu", "llama3.1-8b", "llama3_2", LLAMA_3_1_8B, "lora", 1, 1),
    Job("llama3.1-8b-full-8gpu", "llama3.1-8b", "llama3_2", LLAMA_3_1_8B, "full", 1, 8),
    Job("qwen2.5-7b-full-2x8gpu", "qwen2.5-7b", "qwen2_5", QWEN_2_5_7B, "full", 2, 8),
    Job("llama3.1-8b-qlora-1gpu", "llama3.1-8b", "llama3_2", LLAMA_3_1_8B, "qlora", 1, 1),
)
# Without a GPU (the test suite's CPU smoke): the tiny kit's Llama-3.2-style model, every side on the CPU.
TINY_JOB = Job(
    "tiny-llama3_2-lora-cpu", "tiny", "llama3_2", {}, "lora", 1, 1,
    {"packed": True, "max_seq_len": 1024, "batch_size": 4, "gradient_accumulation_steps": 1,
     "enable_activation_checkpointing": False},
)  # fmt: skip

# --- the expert's rule (module docstring) ------------------------------------------------------------------------

EXPERT_SEQ_LEN = 4096
EXPERT_MEMORY_SHARE = 0.85
EXPERT_MAX_MICRO_BATCH_TOKENS = 16384
EXPERT_GLOBAL_BATCH_TOKENS = 65536
STATE_BYTES_PER_PARAMETER = {"lora": 2.0, "qlora": 0.6, "full": 8.0}


def num_parameters(hf_config: dict) -> int:
    return sum(math.prod(shape) for shape in _shapes(hf_config).values())


def expert_settings(job: Job, gpu_memory_gib: float) -> dict:
    """What an expert writes by hand for `job` on GPUs of `gpu_memory_gib` (the rule in the module docstring)."""
    if job.expert is not None:
        return dict(job.expert)
    c = job.hf_config
    hidden, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    state = STATE_BYTES_PER_PARAMETER[job.method] * num_parameters(c)
    if job.method == "full":
        state /= job.world_size
    free = EXPERT_MEMORY_SHARE * gpu_memory_gib * 2**30 - state
    per_token = 34 * hidden * layers + 6 * vocab
    checkpointing = free < per_token * EXPERT_SEQ_LEN
    if checkpointing:
        per_token = 2 * hidden * layers + 34 * hidden + 6 * vocab
    tokens = min(EXPERT_MAX_MICRO_BATCH_TOKENS, max(free, 0) / per_token)
    batch_size = max(1, int(tokens // EXPERT_SEQ_LEN))
    accumulation = max(1, EXPERT_GLOBAL_BATCH_TOKENS // (batch_size * EXPERT_SEQ_LEN * job.world_size))
    return {"packed": True, "max_seq_len": EXPERT_SEQ_LEN, "compile": True, "batch_size": batch_size,
            "gradient_accumulation_steps": accumulation, "enable_activation_checkpointing": checkpointing,
            "enable_activation_offloading": False}  # fmt: skip


# --- model folders ------------------------------------------------------------------------------------------------


def _shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a Llama / Qwen2 checkpoint with config.json `c`."""
    dim, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim, inter = c.get("head_dim") or dim // heads, c["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab_size"], dim)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * head_dim, dim), p + "self_attn.k_proj.weight": (kv * head_dim, dim),
            p + "self_attn.v_proj.weight": (kv * head_dim, dim), p + "self_attn.o_proj.weight": (dim, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, dim), p + "mlp.up_proj.weight": (inter, dim),
            p + "mlp.down_proj.weight": (dim, inter),
            p + "input_layernorm.weight": (dim,), p + "post_attention_layernorm.weight": (dim,),
        })  # fmt: skip
        if c["model_type"] == "qwen2":  # q/k/v biases
            shapes.update({p + "self_attn.q_proj.bias": (heads * head_dim,),
                           p + "self_attn.k_proj.bias": (kv * head_dim,), p + "self_attn.v_proj.bias": (kv * head_dim,)})  # fmt: skip
    shapes["model.norm.weight"] = (dim,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], dim)
    return shapes


def _shard_plan(c: dict, shard_bytes: int = 4 << 30) -> dict[str, str]:
    """Tensor name -> shard file (bf16, about `shard_bytes` each), as in a hub model's index."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in _shapes(c).items():
        nbytes = 2 * math.prod(shape)
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    n = len(groups)
    return {name: f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i, g in enumerate(groups) for name in g}


def model_folder(root: Path, job: Job, weights: bool) -> Path:
    """The job's model folder: config.json, the family's tokenizer, the shard index and its shards. Without
    `weights` (the plan) the shards are empty files in a separate folder: resolving reads no weights."""
    from kfp_finetune.tiny.tokenizer import write_tokenizer

    out = root / ("models" if weights else "plan-models") / job.model
    if (out / ".complete").is_file():
        return out
    fresh_dir(out)
    tokens = write_tokenizer(out, job.family)
    config = dict(job.hf_config)
    specials = tokens.special_tokens
    if job.family == "llama3_2":
        config.update(bos_token_id=specials["<|begin_of_text|>"], eos_token_id=specials["<|eot_id|>"])
    else:
        config.update(bos_token_id=specials["<|endoftext|>"], eos_token_id=specials["<|im_end|>"])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    plan = _shard_plan(config)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": plan}, indent=2)
    )
    if weights:
        _write_random_shards(out, config, plan)
    else:
        for shard in set(plan.values()):
            (out / shard).touch()
    (out / ".complete").touch()
    return out


def _write_random_shards(out: Path, config: dict, plan: dict[str, str]) -> None:
    import torch
    from safetensors.torch import save_file

    shapes = _shapes(config)
    device = (
        "cuda" if torch.cuda.is_available() else "cpu"
    )  # 8B normal samples: seconds on a GPU, minutes here
    generator = torch.Generator(device).manual_seed(0)
    for shard in sorted(set(plan.values())):
        tensors = {}
        for name in (n for n, s in plan.items() if s == shard):
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                t = torch.empty(shapes[name], dtype=torch.float32, device=device)
                tensors[name] = t.normal_(0.0, 0.02, generator=generator).to(torch.bfloat16).cpu()
        save_file(tensors, str(out / shard), metadata={"format": "pt"})


# --- data ---------------------------------------------------------------------------------------------------------

DATA_VARIANTS = ("long-tailed", "cliff")
CLIFF_LENGTHS = (2304, 3072)
CLIFF_LONG_EVERY = 25  # 4 % of the rows long: the 99th percentile is one of them
# The tiny kit's Llama and Qwen tokenizers on benchmarks.common's letter-pair words (measured: 1.966 each).
TOKENS_PER_WORD = 1.97


def suite_data(workdir: Path, rows: int) -> Path:
    """The long-tailed rows (JSONL)."""
    return _write_rows(workdir / "data" / f"long-tailed-{rows}.jsonl", _long_tailed(rows))


def data_sets(workdir: Path, rows: int, variant: str = "long-tailed") -> dict[str, Path]:
    """The variant's data sets, label -> JSONL ("" for the one long-tailed set; "cliff-<length>" per cliff)."""
    if variant == "long-tailed":
        return {"": suite_data(workdir, rows)}
    if variant == "cliff":
        return {
            f"cliff-{length}": _write_rows(
                workdir / "data" / f"cliff-{length}-{rows}.jsonl", cliff_rows(rows, length)
            )
            for length in CLIFF_LENGTHS
        }
    raise ValueError(f"--data must be one of {', '.join(DATA_VARIANTS)} (got {variant!r})")


def _long_tailed(rows: int):
    return long_tailed_rows(rows, seed=0, median_words=150.0, sigma=0.8, cap=2000)


def cliff_rows(rows: int, length: int, seed: int = 0):
    """Rows whose 99th percentile of tokens (template included) is 60-220 below `length`: every CLIFF_LONG_EVERY-th
    row that long, the others long-tailed and at most ~1200 tokens."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    short = long_tailed_rows(rows, seed=seed, median_words=150.0, sigma=0.8, cap=600)
    for i, row in enumerate(short):
        if i % CLIFF_LONG_EVERY:
            yield row
            continue
        words = (
            int(rng.uniform(length - 220, length - 60) / TOKENS_PER_WORD) - 12
        )  # the template's ~20 tokens
        text = [rng.choice(letters) + rng.choice(letters) for _ in range(words)]
        yield {"input": "Echo: " + " ".join(text[:8]), "output": " ".join(text[8:])}


def _write_rows(out: Path, rows) -> Path:
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with tmp.open("w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        tmp.replace(out)
    return out
