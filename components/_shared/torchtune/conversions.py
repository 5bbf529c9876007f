"""Hugging Face <-> torchtune state-dict conversion per checkpoint layout, owned by this project.

torchtune 0.6.1 is the last release: what its converters get wrong stays wrong, so every run converts through this
table (used by checkpointer.HFCheckpointer). Each entry either delegates to torchtune's converter where that is
right (tests/components/_shared/torchtune/test_parity.py compares the logits with transformers'), or corrects it:

- GEMMA2: torchtune 0.6.1 maps HF's `pre_feedforward_layernorm` to `mlp_scale` and `post_feedforward_layernorm` to
  `mlp_norm`: the wrong way round (its TransformerSelfAttentionLayer applies `mlp_norm` before the MLP and
  `mlp_scale` after it, as HF applies pre- and post-feedforward norms). Fixed after 0.6.1 on torchtune's main
  (PR 2853); here the two keys are swapped back after (and before) torchtune's mapping.
- QWEN3 (Qwen3 dense, which 0.6.1 does not have): Qwen2's mapping (the same names, without q/k/v biases) plus
  each layer's q/k norms (`self_attn.q_norm.weight` <-> `attn.q_norm.scale`, families/qwen3.py); like Qwen2, no
  RoPE permutation (half-split RoPE on both sides).
- GEMMA3 (Gemma 3 text, which 0.6.1 does not have): its own name table (`_GEMMA3_LAYER`: Gemma 2's four
  norms each in its place, the q/k norms), no RoPE permutation (half-split RoPE on both sides, families/gemma3.py);
  the tied `lm_head.weight` some checkpoints carry is not loaded, as transformers does not load it.
- PEFT adapters: torchtune 0.6.1 permutes the q/k LoRA B rows into HF's RoPE order for every family, also for the
  Qwen2 layout whose weights it never permutes, and leaves a DoRA magnitude of q/k in torchtune's order. Here
  the adapter follows exactly what the family's weight conversion does (`rope_permuted`).

Torch and torchtune are imported inside the functions: the table itself is read without them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

StateDict = dict[str, Any]  # name -> torch.Tensor


@dataclass(frozen=True)
class Conversion:
    """How one checkpoint layout's weights are renamed (and reordered) between HF and torchtune."""

    model_type: str  # the checkpointer's `model_type` in a resolved YAML
    hf_to_tune: Callable[[StateDict, dict], StateDict]  # (HF state dict, config.json) -> torchtune state dict
    tune_to_hf: Callable[[StateDict, dict], StateDict]
    # q/k projection rows are reordered between HF's half-split RoPE and torchtune's interleaved RoPE
    rope_permuted: bool
    peft_adapter: bool = True  # the adapter can be written in PEFT's layout (HF's module names)


def _shape(config: dict) -> dict:
    return {
        "num_heads": config["num_attention_heads"],
        "num_kv_heads": config.get("num_key_value_heads") or config["num_attention_heads"],
        "dim": config["hidden_size"],
    }


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def _llama_hf_to_tune(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.convert_weights import hf_to_tune

    return hf_to_tune(state_dict, head_dim=config.get("head_dim"), **_shape(config))


def _llama_tune_to_hf(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.convert_weights import tune_to_hf

    return tune_to_hf(state_dict, head_dim=config.get("head_dim"), **_shape(config))


def _qwen2_hf_to_tune(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.qwen2._convert_weights import qwen2_hf_to_tune

    return qwen2_hf_to_tune(
        state_dict, tie_word_embeddings=bool(config.get("tie_word_embeddings")), **_shape(config)
    )


def _qwen2_tune_to_hf(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.qwen2._convert_weights import qwen2_tune_to_hf

    return qwen2_tune_to_hf(
        state_dict, tie_word_embeddings=bool(config.get("tie_word_embeddings")), **_shape(config)
    )


def _phi3_hf_to_tune(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.phi3._convert_weights import phi3_hf_to_tune

    return phi3_hf_to_tune(state_dict, **_shape(config))


def _phi3_tune_to_hf(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.phi3._convert_weights import phi3_tune_to_hf

    return phi3_tune_to_hf(state_dict)


# Qwen3's q/k norms, which torchtune 0.6.1's Qwen2 mapping does not know: HF name <-> torchtune name.
_QWEN3_QK_NORM_HF = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(q_norm|k_norm)\.weight$")
_QWEN3_QK_NORM_TUNE = re.compile(r"^layers\.(\d+)\.attn\.(q_norm|k_norm)\.scale$")


def _qwen3_hf_to_tune(state_dict: StateDict, config: dict) -> StateDict:
    norms = {key: _QWEN3_QK_NORM_HF.match(key) for key in state_dict}
    converted = _qwen2_hf_to_tune({k: v for k, v in state_dict.items() if not norms[k]}, config)
    converted.update({f"layers.{m[1]}.attn.{m[2]}.scale": state_dict[k] for k, m in norms.items() if m})
    return converted


def _qwen3_tune_to_hf(state_dict: StateDict, config: dict) -> StateDict:
    norms = {key: _QWEN3_QK_NORM_TUNE.match(key) for key in state_dict}
    converted = _qwen2_tune_to_hf({k: v for k, v in state_dict.items() if not norms[k]}, config)
    converted.update(
        {f"model.layers.{m[1]}.self_attn.{m[2]}.weight": state_dict[k] for k, m in norms.items() if m}
    )
    return converted


# torchtune 0.6.1's Gemma 2 mapping crosses these two (module docstring).
_GEMMA2_CROSSED = re.compile(r"^(layers\.\d+\.)(mlp_norm|mlp_scale)(\.scale)$")
_GEMMA2_OTHER = {"mlp_norm": "mlp_scale", "mlp_scale": "mlp_norm"}


def _swap_gemma2_feedforward_norms(state_dict: StateDict) -> StateDict:
    swapped = {}
    for key, value in state_dict.items():
        match = _GEMMA2_CROSSED.match(key)
        if match:
            key = f"{match[1]}{_GEMMA2_OTHER[match[2]]}{match[3]}"
        swapped[key] = value
    return swapped


def _gemma2_hf_to_tune(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.gemma2._convert_weights import gemma2_hf_to_tune

    converted = gemma2_hf_to_tune(state_dict, head_dim=config.get("head_dim"), **_shape(config))
    return _swap_gemma2_feedforward_norms(converted)


def _gemma2_tune_to_hf(state_dict: StateDict, config: dict) -> StateDict:
    from torchtune.models.gemma2._convert_weights import gemma2_tune_to_hf

    swapped = _swap_gemma2_feedforward_norms(state_dict)
    return gemma2_tune_to_hf(swapped, head_dim=config.get("head_dim"), **_shape(config))


# Gemma 3 (text), which 0.6.1 does not have: HF name <-> torchtune name (families/gemma3.py), one layer's keys
# after `model.layers.N.` / `layers.N.`; its RoPE is half-split on both sides, so nothing is reordered.
_GEMMA3_LAYER = {
    "input_layernorm.weight": "sa_norm.scale",
    "post_attention_layernorm.weight": "sa_scale.scale",
    "pre_feedforward_layernorm.weight": "mlp_norm.scale",
    "post_feedforward_layernorm.weight": "mlp_scale.scale",
    "self_attn.q_proj.weight": "attn.q_proj.weight",
    "self_attn.k_proj.weight": "attn.k_proj.weight",
    "self_attn.v_proj.weight": "attn.v_proj.weight",
    "self_attn.o_proj.weight": "attn.output_proj.weight",
    "self_attn.q_norm.weight": "attn.q_norm.scale",
    "self_attn.k_norm.weight": "attn.k_norm.scale",
    "mlp.gate_proj.weight": "mlp.w1.weight",
    "mlp.down_proj.weight": "mlp.w2.weight",
    "mlp.up_proj.weight": "mlp.w3.weight",
}
_GEMMA3_TOP = {"model.embed_tokens.weight": "tok_embeddings.weight", "model.norm.weight": "norm.scale"}
_GEMMA3_HF_KEY = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
_GEMMA3_TUNE_KEY = re.compile(r"^layers\.(\d+)\.(.+)$")
# The output layer is the embedding (tie_word_embeddings): a checkpoint may still carry lm_head.weight, which
# transformers ties (ignores) on load, and so does the torchtune model.
_GEMMA3_TIED = "lm_head.weight"


def _renamed(state_dict: StateDict, top: dict, layer_key: re.Pattern, layer: dict, prefix: str) -> StateDict:
    """Keys renamed by `top` or, per layer, by `layer` (`layer_key` matches the source's layer keys, `prefix`
    begins the target's); a key neither names is an error (it would be dropped silently)."""
    converted = {}
    for key, value in state_dict.items():
        match = layer_key.match(key)
        if key in top:
            converted[top[key]] = value
        elif match and match[2] in layer:
            converted[f"{prefix}{match[1]}.{layer[match[2]]}"] = value
        else:
            raise ValueError(f"unexpected weight {key!r} for the Gemma 3 layout")
    return converted


def _gemma3_hf_to_tune(state_dict: StateDict, config: dict) -> StateDict:
    weights = {key: value for key, value in state_dict.items() if key != _GEMMA3_TIED}
    return _renamed(weights, _GEMMA3_TOP, _GEMMA3_HF_KEY, _GEMMA3_LAYER, "layers.")


def _gemma3_tune_to_hf(state_dict: StateDict, config: dict) -> StateDict:
    top = {tune: hf for hf, tune in _GEMMA3_TOP.items()}
    layer = {tune: hf for hf, tune in _GEMMA3_LAYER.items()}
    return _renamed(state_dict, top, _GEMMA3_TUNE_KEY, layer, "model.layers.")


_LLAMA = dict(hf_to_tune=_llama_hf_to_tune, tune_to_hf=_llama_tune_to_hf, rope_permuted=True)
CONVERSIONS: dict[str, Conversion] = {
    c.model_type: c
    for c in [
        Conversion("LLAMA2", **_LLAMA),
        Conversion("LLAMA3", **_LLAMA),
        Conversion("LLAMA3_2", **_LLAMA),
        Conversion("MISTRAL", **_LLAMA),
        Conversion("GEMMA", **_LLAMA),
        Conversion("GEMMA2", _gemma2_hf_to_tune, _gemma2_tune_to_hf, rope_permuted=True),
        Conversion("QWEN2", _qwen2_hf_to_tune, _qwen2_tune_to_hf, rope_permuted=False),
        Conversion("QWEN3", _qwen3_hf_to_tune, _qwen3_tune_to_hf, rope_permuted=False),
        Conversion("GEMMA3", _gemma3_hf_to_tune, _gemma3_tune_to_hf, rope_permuted=False),
        # torchtune writes no PEFT adapter for Phi (HF fuses qkv and gate/up: no module matches a LoRA'd one).
        Conversion("PHI3_MINI", _phi3_hf_to_tune, _phi3_tune_to_hf, rope_permuted=False, peft_adapter=False),
        Conversion("PHI4", _phi3_hf_to_tune, _phi3_tune_to_hf, rope_permuted=False, peft_adapter=False),
    ]
}


def conversion(model_type: str) -> Conversion:
    try:
        return CONVERSIONS[model_type]
    except KeyError:
        raise ValueError(
            f"no weight conversion for the checkpoint layout {model_type!r}; known layouts: {', '.join(CONVERSIONS)}"
        ) from None


# --- PEFT adapters ----------------------------------------------------------------------------------------------

# torchtune module path -> HF module path (the layouts whose adapters PEFT can load share these names).
_PEFT_MODULES = {
    "attn.q_proj": "self_attn.q_proj",
    "attn.k_proj": "self_attn.k_proj",
    "attn.v_proj": "self_attn.v_proj",
    "attn.output_proj": "self_attn.o_proj",
    "mlp.w1": "mlp.gate_proj",
    "mlp.w2": "mlp.down_proj",
    "mlp.w3": "mlp.up_proj",
}
_PEFT_PARAMS = {
    "lora_a.weight": "lora_A.weight",
    "lora_b.weight": "lora_B.weight",
    "magnitude": "lora_magnitude_vector",
}
_ADAPTER_KEY = re.compile(r"^layers\.(\d+)\.(attn\.\w+|mlp\.\w+)\.(lora_a\.weight|lora_b\.weight|magnitude)$")
_OUTPUT_ADAPTER_KEY = re.compile(r"^output\.(lora_a\.weight|lora_b\.weight|magnitude)$")
# Rows of these follow the projection's output rows, so they are reordered as its weight is.
_ROW_PARAMS = ("lora_b.weight", "magnitude")


def tune_to_peft_adapter(state_dict: StateDict, config: dict, layout: Conversion) -> StateDict:
    """A torchtune LoRA/DoRA adapter state dict in PEFT's names and HF's row order (PEFT loads it onto the HF
    model that `layout.tune_to_hf` writes)."""
    converted = {}
    for key, value in state_dict.items():
        match = _ADAPTER_KEY.match(key)
        if match:
            layer, module, param = match.groups()
            if module not in _PEFT_MODULES:
                raise ValueError(f"adapter weight {key!r} belongs to no module PEFT knows")
            hf_key = f"model.layers.{layer}.{_PEFT_MODULES[module]}.{_PEFT_PARAMS[param]}"
            if layout.rope_permuted and param in _ROW_PARAMS and module in ("attn.q_proj", "attn.k_proj"):
                heads = _shape(config)["num_heads" if module == "attn.q_proj" else "num_kv_heads"]
                value = _to_hf_rope_rows(value, heads, _head_dim(config))
        else:
            match = _OUTPUT_ADAPTER_KEY.match(key)
            if not match:
                raise ValueError(f"adapter weight {key!r} has no PEFT name")
            hf_key = f"lm_head.{_PEFT_PARAMS[match[1]]}"
        converted[f"base_model.model.{hf_key}"] = value
    return converted


def _to_hf_rope_rows(t: Any, heads: int, head_dim: int) -> Any:
    """Rows in torchtune's interleaved RoPE order -> HF's half-split order (what tune_to_hf does to q/k)."""
    trailing = t.shape[1:]
    return t.reshape(heads, head_dim // 2, 2, *trailing).transpose(1, 2).reshape(heads * head_dim, *trailing)
