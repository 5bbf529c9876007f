"""Build a tiny, offline, deterministic HF-layout model that torchtune loads like the real family.

The weights come from the family's component builder (torchtune's, or ours on torchtune's modules for Qwen3,
Gemma 3 and Mistral-Nemo)
with tiny dimensions, re-initialised from a seeded generator and converted to HF key names through the
project's conversion table (conversions.CONVERSIONS, as every run converts), so the checkpointer (and the LoRA
builders) load them with strict key matching. `config.json` uses
the real HF field names and matches the weights; the tokenizer files are those of `tiny.tokenizer`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

FAMILIES = ("llama3_2", "qwen2_5", "qwen3", "gemma3", "smollm2", "mistral_nemo")
MAX_POSITION_EMBEDDINGS = 2048
INIT_STD = 0.02

# What differs between the families, as in the real Llama-3.2-1B, Qwen2.5-0.5B, Qwen3-0.6B, Gemma-3-1B, SmolLM2-135M
# and Mistral-Nemo-Base-2407 configs.
_FAMILY_CONFIG = {
    "llama3_2": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "checkpointer_model_type": "LLAMA3_2",
    },
    "qwen2_5": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "checkpointer_model_type": "QWEN2",
    },
    "qwen3": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "checkpointer_model_type": "QWEN3",
    },
    "gemma3": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "checkpointer_model_type": "GEMMA3",
    },
    "smollm2": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-05,
        "checkpointer_model_type": "LLAMA3_2",
    },
    "mistral_nemo": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-05,
        "checkpointer_model_type": "MISTRAL",
    },
}
# Gemma 3's local layers attend to this many positions (1B: 512 of 32768): fewer than a tiny chat example's
# ~25 tokens, so the window matters, more than the distance an answer letter copies from.
GEMMA3_SLIDING_WINDOW = 16

# Llama-3.2's RoPE scaling, which torchtune's Llama3ScaledRoPE implements (scale_factor=32).
LLAMA3_ROPE_SCALING = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}


def checkpointer_model_type(family: str) -> str:
    """The checkpointer's `model_type` for a family (its key in conversions.CONVERSIONS)."""
    return _FAMILY_CONFIG[family]["checkpointer_model_type"]


def build_torchtune_model(family: str, config: dict, lora: dict | None = None):
    """The torchtune model for an HF config, built exactly as fine-tuning builds it (the family's component
    builder, or its LoRA builder, with dims from the config)."""
    from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, builder_node, instantiate

    return instantiate(builder_node(FAMILIES[family], config, lora))


def _hf_config(family: str, dim: int, num_layers: int, num_heads: int, num_kv_heads: int, tokens) -> dict:
    specials = tokens.special_tokens
    if family == "llama3_2":
        vocab_size = tokens.num_tokens  # Llama-3.x: exactly the tokenizer's size
        # Like Llama-3.2-Instruct: stop on end-of-text, end-of-message or end-of-turn.
        bos_id = specials["<|begin_of_text|>"]
        eos_id = [specials["<|end_of_text|>"], specials["<|eom_id|>"], specials["<|eot_id|>"]]
    elif family == "gemma3":
        vocab_size = tokens.num_tokens  # Gemma-3-1B: exactly the tokenizer's size
        # Like Gemma 3's generation_config.json: stop on <eos> or <end_of_turn>.
        bos_id, eos_id = specials["<bos>"], [specials["<eos>"], specials["<end_of_turn>"]]
    elif family == "smollm2":  # exactly the tokenizer's size; SmolLM2-Instruct's ids
        vocab_size, bos_id, eos_id = tokens.num_tokens, specials["<|im_start|>"], specials["<|im_end|>"]
    elif family == "mistral_nemo":  # exactly the tokenizer's size (Tekken: 2**17)
        vocab_size, bos_id, eos_id = tokens.num_tokens, specials["<s>"], specials["</s>"]
    else:
        vocab_size = -(-tokens.num_tokens // 64) * 64  # Qwen2.5, Qwen3: embedding padded to a multiple of 64
        bos_id, eos_id = specials["<|endoftext|>"], specials["<|im_end|>"]
    fam = _FAMILY_CONFIG[family]
    config = {
        "architectures": fam["architectures"],
        "attention_bias": family == "qwen2_5",  # Qwen2 has q/k/v biases, Llama none
        "attention_dropout": 0.0,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "hidden_size": dim,
        "initializer_range": INIT_STD,
        "intermediate_size": 4 * dim,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "model_type": fam["model_type"],
        "num_attention_heads": num_heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": num_kv_heads,
        "rms_norm_eps": fam["rms_norm_eps"],
        "rope_theta": fam["rope_theta"],
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab_size,
    }
    if family == "llama3_2":
        config.update(head_dim=dim // num_heads, mlp_bias=False, rope_scaling=LLAMA3_ROPE_SCALING)
    elif family == "smollm2":  # Llama layers with tied embeddings and plain RoPE
        config.update(head_dim=dim // num_heads, mlp_bias=False, rope_scaling=None)
    elif family == "mistral_nemo":
        # Mistral-Nemo's head_dim is its own, below hidden / heads (128 with 5120 / 32): here half of it, so a model
        # that computed it from the other two would not load. Untied output weights; no sliding window.
        config.update(head_dim=dim // num_heads // 2, sliding_window=None, tie_word_embeddings=False)
    elif family == "qwen2_5":
        config.update(
            max_window_layers=num_layers,
            sliding_window=MAX_POSITION_EMBEDDINGS,
            use_sliding_window=False,
        )
    elif family == "gemma3":
        # Gemma-3-1B's fields; its head_dim (256, not 1152 / 4) is here twice hidden / heads, its query scale
        # head_dim; local and global layers alternate (the 1B model: five local, then one global).
        del config["hidden_act"]
        config.update(
            head_dim=2 * dim // num_heads,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=2 * dim // num_heads,
            sliding_window=GEMMA3_SLIDING_WINDOW,
            layer_types=[
                "full_attention" if (i + 1) % 2 == 0 else "sliding_attention" for i in range(num_layers)
            ],
            rope_local_base_freq=10000.0,
            rope_scaling=None,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            pad_token_id=tokens.special_tokens["<pad>"],
        )
    else:
        # Qwen3's head_dim is its own setting (0.6B: 128, not 1024 / 16): here twice hidden / heads, so a model that
        # computed it from the other two would not load.
        config.update(
            head_dim=2 * dim // num_heads,
            max_window_layers=num_layers,
            sliding_window=None,
            use_sliding_window=False,
        )
    return dict(sorted(config.items()))


def _seeded_state_dict(family: str, config: dict, seed: int) -> dict:
    """The builder's state dict with every weight drawn from one seeded generator.

    Linear weights are N(0, 0.02), norms 1, biases 0; Qwen3's q/k norms U(0.5, 1.5), so that applying them on the
    wrong side of RoPE changes the logits (families/qwen3.py). Gemma's norms scale by 1 + weight: there the
    weights are 0, and Gemma 3's q/k norms U(-0.5, 0.5). Token embeddings are N(0, 1/sqrt(hidden_size)):
    they are tied to the output layer, and with 0.02 a frozen output layer (LoRA) caps every logit near
    0.02 * hidden_size, so no prediction can become confident; 1/sqrt(hidden_size) gives unit-variance
    initial logits and leaves room to learn. (Measured: full fine-tune exact match 1.0 vs 0.76 at 0.02.)
    """
    import torch

    model = build_torchtune_model(family, config)
    generator = torch.Generator().manual_seed(seed)
    norm_offset = 1.0 if family == "gemma3" else 0.0  # Gemma's norms scale by 1 + weight
    state_dict = {}
    for name, tensor in model.state_dict().items():
        if name.endswith((".q_norm.scale", ".k_norm.scale")):
            value = torch.empty_like(tensor).uniform_(0.5, 1.5, generator=generator) - norm_offset
        elif name.endswith(".scale"):  # RMSNorm weights
            value = torch.ones_like(tensor) - norm_offset
        elif name.endswith(".bias"):
            value = torch.zeros_like(tensor)
        elif name == "tok_embeddings.weight":
            std = config["hidden_size"] ** -0.5
            value = torch.empty_like(tensor).normal_(0.0, std, generator=generator)
        else:
            value = torch.empty_like(tensor).normal_(0.0, INIT_STD, generator=generator)
        state_dict[name] = value.to(torch.float32).contiguous()
    return state_dict


def _to_hf(family: str, config: dict, state_dict: dict) -> dict:
    from kfp_finetune.components._shared.torchtune.conversions import conversion

    return conversion(checkpointer_model_type(family)).tune_to_hf(state_dict, config)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def build_tiny_model(
    out_dir: str | Path,
    family: str = "llama3_2",
    dim: int = 64,
    seed: int = 0,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
) -> Path:
    """Write a tiny HF-layout model of `family` into `out_dir` and return the directory.

    Same arguments give byte-identical files. The tokenizer files depend only on the family.
    """
    from safetensors.torch import save_file

    from kfp_finetune.tiny.tokenizer import write_tokenizer

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")
    if dim % num_heads or num_heads % num_kv_heads:
        raise ValueError("dim must be divisible by num_heads, and num_heads by num_kv_heads")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokens = write_tokenizer(out, family)
    config = _hf_config(family, dim, num_layers, num_heads, num_kv_heads, tokens)
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "do_sample": False, "eos_token_id": config["eos_token_id"]},
    )
    hf_state_dict = _to_hf(family, config, _seeded_state_dict(family, config, seed))
    weights = out / "model.safetensors"
    save_file(hf_state_dict, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # safetensors creates it owner-only; other users (pods) read it like the rest
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", help="output directory")
    parser.add_argument("--family", choices=FAMILIES, default="llama3_2")
    parser.add_argument("--dim", type=int, default=64, help="hidden size (256 or more for QLoRA)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)


def run(args: argparse.Namespace) -> int:
    out = build_tiny_model(
        args.out,
        family=args.family,
        dim=args.dim,
        seed=args.seed,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
    )
    print(out)
    return 0
