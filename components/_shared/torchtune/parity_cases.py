"""The proven table: per family, the layouts whose logits parity.py measures equal to transformers'.

Each family has one entry in CASES: a base config.json (the math-changing fields of one real checkpoint) and the
variants its other real checkpoints bring (another RoPE, a window, tied embeddings, a head_dim …). Only sizes
differ between a case and the real model: parity.tiny_config shrinks them and keeps every other field.

What a case proves is a *kind* of value per config.json field (model_layout.LAYOUT_FIELDS, and the
attention's grouping): how the family's builder meets it — carried to an argument, neutral, made a position
limit — and, where that matters, the value (a bool, a name, a relation such as head_dim ≠ hidden/heads; the
numbers a builder carries are one kind: the argument is passed whatever it is). A field of a model whose kind
no case of its family has is **unproven**: pre-flight and `kfp-finetune check-model` refuse it, naming it.

Adding a family's proof is one CASES entry. Read without torch (pre-flight runs on the component image);
`python -m kfp_finetune.components._shared.torchtune.parity_cases` prints docs/families.md (families_doc.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfp_finetune.components._shared.torchtune import installed
from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, Family
from kfp_finetune.components._shared.torchtune.model_layout import (
    CARRIED,
    LAYOUT_FIELDS,
    NEUTRAL,
    POSITION_LIMIT,
    REFUSED,
    how_met,
    layout_value,
)

ATTENTION = "num_key_value_heads"  # not a LAYOUT_FIELD (a dimension), but its grouping is a kind to prove


@dataclass(frozen=True)
class FamilyCases:
    """One family's parity cases: a real checkpoint's config.json and the variants its other checkpoints bring."""

    family: str  # the FAMILIES key
    base_source: str  # the checkpoint the base config follows
    base: dict[str, Any]
    variants: dict[str, dict[str, Any]] = field(
        default_factory=dict
    )  # source checkpoint -> fields it changes

    def cases(self) -> list[Case]:
        found = [Case(self.family, self.base_source, self.base)]
        found += [
            Case(self.family, source, {**self.base, **delta}) for source, delta in self.variants.items()
        ]
        return found


@dataclass(frozen=True)
class Case:
    family: str
    source: str  # the real checkpoint whose layout this is
    config: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.family}:{self.source}"


@dataclass(frozen=True)
class Flag:
    """One math-changing config.json field of a model and how its family's builder meets it."""

    key: str
    value: Any
    how: str  # model_layout's CARRIED / NEUTRAL / POSITION_LIMIT / REFUSED
    kind: str  # what a case must have to prove it

    def line(self) -> str:
        return f"{self.key} = {_shown(self.value)} ({self.kind})"


_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
_LLAMA2_7B = {
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "rope_scaling": None,
}
_LLAMA3_8B = {
    **_LLAMA2_7B,
    "intermediate_size": 14336,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rope_theta": 500000.0,
    "vocab_size": 128256,
}
_MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
_GEMMA_2B = {
    "model_type": "gemma",
    "hidden_size": 2048,
    "intermediate_size": 16384,
    "num_hidden_layers": 18,
    "num_attention_heads": 8,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "vocab_size": 256000,
    "hidden_act": "gelu",
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
    "tie_word_embeddings": True,
}
_GEMMA2_2B = {
    "model_type": "gemma2",
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "max_position_embeddings": 8192,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "vocab_size": 256000,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
    "tie_word_embeddings": True,
}
_PHI3_MINI = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "max_position_embeddings": 4096,
    "sliding_window": 2047,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "vocab_size": 32064,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
_QWEN2_7B = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "vocab_size": 152064,
    "hidden_act": "silu",
    "use_sliding_window": False,
    "sliding_window": 131072,
    "max_window_layers": 28,
    "tie_word_embeddings": False,
}
_QWEN_SMALL = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}
_QWEN3_8B = {
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
    "hidden_act": "silu",
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 36,
    "tie_word_embeddings": False,
}
# google/gemma-3-1b-pt's config.json (transformers 4.50 form: the layer pattern as sliding_window_pattern, the two
# RoPE bases as rope_theta and rope_local_base_freq).
_GEMMA3_1B = {
    "model_type": "gemma3_text",
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "query_pre_attn_scalar": 256,
    "max_position_embeddings": 32768,
    "sliding_window": 512,
    "sliding_window_pattern": 6,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": None,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "rms_norm_eps": 1e-6,
    "vocab_size": 262144,
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
}
_GEMMA3_LAYERS_1B = [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(26)]
_SMOLLM2_135M = {
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "rope_scaling": None,
    "vocab_size": 49152,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": True,
}
_MISTRAL_NEMO = {
    "model_type": "mistral",
    "hidden_size": 5120,
    "intermediate_size": 14336,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 128000,
    "sliding_window": None,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1000000.0,
    "vocab_size": 131072,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}

FAMILY_CASES: dict[str, FamilyCases] = {
    c.family: c
    for c in [
        FamilyCases("llama2", "meta-llama/Llama-2-7b-hf", _LLAMA2_7B, {
            "meta-llama/Llama-2-70b-hf": {"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
                                          "intermediate_size": 28672},
        }),
        FamilyCases("code_llama2", "codellama/CodeLlama-7b-hf", {
            **_LLAMA2_7B, "vocab_size": 32016, "max_position_embeddings": 16384, "rope_theta": 1000000.0}, {
            "codellama/CodeLlama-34b-hf": {"hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
                                           "intermediate_size": 22016, "vocab_size": 32000},
        }),
        FamilyCases("llama3", "meta-llama/Meta-Llama-3-8B", _LLAMA3_8B),
        FamilyCases("llama3_1", "meta-llama/Llama-3.1-8B", {
            **_LLAMA3_8B, "max_position_embeddings": 131072, "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}}, {
            "meta-llama/Llama-3.1-405B (16 query heads per key/value head)": {
                "hidden_size": 16384, "num_attention_heads": 128, "intermediate_size": 53248},
        }),
        FamilyCases("llama3_2", "meta-llama/Llama-3.2-1B", {
            **_LLAMA3_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "head_dim": 64,
            "max_position_embeddings": 131072, "tie_word_embeddings": True,
            "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}}, {
            "meta-llama/Llama-3.2-3B": {"hidden_size": 3072, "num_attention_heads": 24, "head_dim": 128},
        }),
        FamilyCases("llama3_3", "meta-llama/Llama-3.3-70B-Instruct", {
            **_LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
            "num_attention_heads": 64, "max_position_embeddings": 131072,
            "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}}),
        FamilyCases("mistral", "mistralai/Mistral-7B-v0.1 (sliding window: a position limit)", _MISTRAL_7B, {
            "mistralai/Mistral-7B-v0.3": {"sliding_window": None, "rope_theta": 1000000.0, "vocab_size": 32768},
        }),
        FamilyCases("gemma", "google/gemma-2b (multi-query)", _GEMMA_2B, {
            "google/gemma-7b (head_dim above hidden/heads)": {"hidden_size": 3072, "intermediate_size": 24576,
                                                             "num_attention_heads": 16, "num_key_value_heads": 16},
            "a Gemma saved by transformers 5 (its name for the tanh GELU)": {"hidden_act": "gelu_pytorch_tanh",
                                                                              "hidden_activation": None},
        }),
        FamilyCases("gemma2", "google/gemma-2-2b", _GEMMA2_2B, {
            "google/gemma-2-9b (head_dim above hidden/heads)": {"hidden_size": 3584, "intermediate_size": 14336,
                                                               "num_attention_heads": 16, "num_key_value_heads": 8},
            "google/gemma-2-27b (query scale hidden/heads)": {"hidden_size": 4608, "intermediate_size": 36864,
                                                             "num_attention_heads": 32, "num_key_value_heads": 16,
                                                             "head_dim": 128, "query_pre_attn_scalar": 144},
        }),
        FamilyCases("phi3", "microsoft/Phi-3-mini-4k-instruct (sliding window: a position limit)", _PHI3_MINI, {
            "microsoft/Phi-3-medium-4k-instruct": {"hidden_size": 5120, "intermediate_size": 17920,
                                                   "num_attention_heads": 40, "num_key_value_heads": 10},
        }),
        FamilyCases("phi4", "microsoft/phi-4", {
            **_PHI3_MINI, "hidden_size": 5120, "intermediate_size": 17920, "num_hidden_layers": 40,
            "num_attention_heads": 40, "num_key_value_heads": 10, "max_position_embeddings": 16384,
            "sliding_window": None, "rope_theta": 250000.0,
            "vocab_size": 100352}),
        FamilyCases("qwen2", "Qwen/Qwen2-7B", _QWEN2_7B, {
            "Qwen/Qwen2-0.5B (tied embeddings)": {**_QWEN_SMALL, "max_window_layers": 24},
        }),
        FamilyCases("qwen2_5", "Qwen/Qwen2.5-7B", {**_QWEN2_7B, "max_window_layers": 28}, {
            "Qwen/Qwen2.5-0.5B (tied embeddings)": {**_QWEN_SMALL, "max_position_embeddings": 32768,
                                                    "sliding_window": 32768, "max_window_layers": 21},
        }),
        FamilyCases("qwen3", "Qwen/Qwen3-8B", _QWEN3_8B, {
            "Qwen/Qwen3-0.6B (tied embeddings, head_dim above hidden/heads)": {
                "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                "tie_word_embeddings": True, "max_window_layers": 28},
            "Qwen/Qwen3-32B (head_dim below hidden/heads)": {
                "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
                "max_window_layers": 64},
        }),
        FamilyCases("gemma3", "google/gemma-3-1b-pt (multi-query; 5 local layers, then 1 global)", _GEMMA3_1B, {
            "google/gemma-3-270m (head_dim above hidden/heads; layer_types listed)": {
                "hidden_size": 640, "intermediate_size": 2048, "num_hidden_layers": 18,
                "layer_types": [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(18)]},
            "google/medgemma-27b-text-it (Gemma 3 27B text: grouped-query, linear RoPE scaling, query scale 168)": {
                "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62, "num_attention_heads": 32,
                "num_key_value_heads": 16, "head_dim": 128, "query_pre_attn_scalar": 168, "sliding_window": 1024,
                "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
            "google/gemma-3-1b-pt saved by transformers 5 (rope_parameters per layer type)": {
                "sliding_window_pattern": None, "rope_theta": None, "rope_local_base_freq": None, "rope_scaling": None,
                "layer_types": _GEMMA3_LAYERS_1B, "rope_parameters": {
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}},
        }),
        FamilyCases("smollm2", "HuggingFaceTB/SmolLM2-135M (grouped-query)", _SMOLLM2_135M, {
            "HuggingFaceTB/SmolLM2-360M": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32,
                                           "num_attention_heads": 15, "num_key_value_heads": 5},
            "HuggingFaceTB/SmolLM2-1.7B (multi-head)": {"hidden_size": 2048, "intermediate_size": 8192,
                                                        "num_hidden_layers": 24, "num_attention_heads": 32,
                                                        "num_key_value_heads": 32, "rope_theta": 130000.0},
        }),
        FamilyCases("mistral_nemo", "mistralai/Mistral-Nemo-Base-2407 (head_dim below hidden/heads)", _MISTRAL_NEMO, {
            "mistralai/Mistral-Nemo-Instruct-2407": {"max_position_embeddings": 1024000},
        }),
    ]
}  # fmt: skip

CASES: tuple[Case, ...] = tuple(case for entry in FAMILY_CASES.values() for case in entry.cases())


def flags(family: Family, hf_config: dict) -> list[Flag]:
    """Every math-changing field of config.json for this family (the fields transformers' class for its
    model_type reads), with how the family's full builder meets it."""
    accepted = set(installed.parameters(family.builder))
    model_type = hf_config.get("model_type")
    found = [_attention_flag(hf_config)]
    for layout in LAYOUT_FIELDS:
        if model_type in layout.read_by:
            value = layout_value(layout, hf_config)
            how = how_met(layout, value, hf_config, family, accepted)
            found.append(Flag(layout.key, value, how, _kind(layout.key, value, how, hf_config)))
    return found


def proven_kinds(family: str) -> set[tuple[str, str]]:
    """(field, kind) pairs the family's cases prove."""
    entry = FAMILY_CASES.get(family)
    return {
        (flag.key, flag.kind)
        for case in (entry.cases() if entry else [])
        for flag in flags(FAMILIES[family], case.config)
    }


def unproven(family: Family, hf_config: dict) -> list[Flag]:
    """The flags of this config.json no parity case of its family proves (refused ones are refused already)."""
    proven = proven_kinds(family.name)
    return [f for f in flags(family, hf_config) if f.how != REFUSED and (f.key, f.kind) not in proven]


def _attention_flag(hf_config: dict) -> Flag:
    heads = hf_config.get("num_attention_heads")
    kv_heads = hf_config.get(ATTENTION) or heads
    if kv_heads == heads:
        kind = "multi-head"
    elif kv_heads == 1:
        kind = "multi-query"
    else:
        kind = "grouped-query"
    return Flag(ATTENTION, kv_heads, CARRIED, kind)


def _kind(key: str, value: Any, how: str, hf_config: dict) -> str:
    """What a case must share with a model to prove this field of it (module docstring). A neutral value is the
    builder's own computation whatever it is (null, false, a default number, a matching layer list), except
    a name (an activation, a RoPE type): each name is proven on its own."""
    if how in (POSITION_LIMIT, REFUSED):
        return how
    if how == NEUTRAL:
        return f"{how}: {value}" if isinstance(value, str) else how
    if key == "head_dim" and value is not None:
        heads, hidden = hf_config.get("num_attention_heads"), hf_config.get("hidden_size")
        return f"{how}: {'=' if heads and value * heads == hidden else '≠'} hidden_size / num_attention_heads"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return how  # any number: the argument carries it
    if key == "layer_types" and how == CARRIED:
        # The builder builds each layer by its type: any arrangement of the proven types is proven.
        return f"{how}: {' and '.join(sorted(set(value)))} layers"
    return f"{how}: {_shown(value)}"


def _shown(value: Any) -> str:
    """A value as config.json writes it (a per-layer list by its repeating unit)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return _layer_pattern(value)
    return str(value)


def _layer_pattern(values: list[str]) -> str:
    """['a', 'a', 'b', 'a', 'a', 'b', 'a'] -> '7 layers: a ×2, b, repeated'."""
    period = next(
        p for p in range(1, len(values) + 1) if all(v == values[i % p] for i, v in enumerate(values))
    )
    runs: list[list] = []
    for value in values[:period]:
        if runs and runs[-1][0] == value:
            runs[-1][1] += 1
        else:
            runs.append([value, 1])
    unit = ", ".join(value if count == 1 else f"{value} ×{count}" for value, count in runs)
    return f"{len(values)} layers: {unit}" + (", repeated" if period < len(values) else "")
