"""Which config.json fields change what a model computes, and how each reaches torchtune 0.6.1 — or is refused.

torchtune's component builders take the dimensions and a few switches; everything else about the layout is
fixed in their code (plain RoPE, head_dim = hidden_size / num_attention_heads, no biases, SiLU, separate or
tied output weights per family). A config.json field that changes the math is therefore, per family:

- carried: the family's builder (full or LoRA) takes an argument for it, and it is passed with transformers'
  default filled in where config.json omits it (a builder's own default may differ: llama3 RoPE base 500000,
  gemma2 sliding window 4096, llama3_2 tied embeddings);
- neutral: its value is what the builder computes anyway (attention_bias false, sliding_window null);
- a position limit: a sliding window the builder cannot apply, shorter than max_position_embeddings, becomes
  the model's max_seq_len (within the window full causal attention is the same computation);
- refused, with the field, its value, the file and what to do.

Only fields that transformers' own class for the model_type reads are checked: one that transformers ignores
(`attention_bias` on a mistral) changes nothing there either. Families served neither by torchtune 0.6.1 nor
by this project's builders on its modules (torchtune/families/) are refused by model_type with the supported
families and the nearest choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kfp_finetune.components._shared.errors import ConfigError

if TYPE_CHECKING:
    from kfp_finetune.components._shared.torchtune.model_inspection import Family

SUPPORTED_FAMILIES = (
    "llama (Llama 2, Code Llama, Llama 3, 3.1, 3.2 text, 3.3, SmolLM2), mistral (Mistral 7B, Mistral-Nemo), gemma, "
    "gemma2, phi3 (Phi-3 4k-context, Phi-4), qwen2 (Qwen2, Qwen2.5), qwen3 (Qwen3 dense, 0.6B-32B), "
    "gemma3_text (Gemma 3 text-only: 270M, 1B, text fine-tunes such as MedGemma 27B text)"
)
_ENGINE_2 = (
    "mixture-of-experts and multimodal models need the second (transformers) training engine: tune_engine=auto "
    "chooses it where the installed transformers builds the model"
)

# torchtune/models/llama3_1/_position_embeddings.py: Llama3ScaledRoPE's defaults, which the llama3_1 / llama3_2
# builders keep (they pass only scale_factor).
_LLAMA3_ROPE = {"low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}
# transformers' rope_theta when config.json has none, and RotaryPositionalEmbeddings' base; Gemma 3's global
# layers' default (Gemma3TextConfig.default_theta), its local layers' being the general one.
_ROPE_BASE = 10000.0
_ROPE_BASES = {"gemma3_text": 1_000_000.0}
_GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")  # both the tanh approximation, as torchtune's nn.GELU("tanh")
_ALL = frozenset({"llama", "mistral", "gemma", "gemma2", "phi3", "qwen2", "qwen3", "gemma3_text"})
_GEMMAS = frozenset({"gemma", "gemma2", "gemma3_text"})
SLIDING, FULL = "sliding_attention", "full_attention"  # layer_types values


@dataclass(frozen=True)
class Unsupported:
    name: str
    why: str  # why it is not served: what torchtune 0.6.1 (or this project) lacks
    nearest: str  # the nearest supported choice, or "" where there is none


UNSUPPORTED: dict[str, Unsupported] = {
    u_type: u
    for u_type, u in [
        ("qwen3_moe", Unsupported("Qwen3-MoE", "torchtune 0.6.1 has no mixture-of-experts layers", "Qwen3 dense (e.g. Qwen/Qwen3-8B)")),
        ("qwen2_moe", Unsupported("Qwen2-MoE", "torchtune 0.6.1 has no mixture-of-experts layers", "Qwen2.5 (dense)")),
        ("mixtral", Unsupported("Mixtral", "torchtune 0.6.1 has no mixture-of-experts layers", "Mistral 7B")),
        ("llama4", Unsupported("Llama 4", "torchtune 0.6.1 has no mixture-of-experts layers",
                               "Llama 3.1 / 3.3 (e.g. meta-llama/Llama-3.1-8B-Instruct)")),
        ("mllama", Unsupported("Llama 3.2 Vision", "the torchtune engine tunes text-only models",
                               "Llama 3.2 text (meta-llama/Llama-3.2-1B or -3B)")),
        ("gemma3", Unsupported(
            "Gemma 3 multimodal (4B, 12B, 27B)",
            "the torchtune engine tunes text-only checkpoints, and this folder holds a vision tower beside its language model "
            "(weights under language_model.): a tuned copy would be written as a text model the folder's "
            "config.json does not describe",
            "Gemma 3 text (model_type gemma3_text: google/gemma-3-1b-it, google/gemma-3-270m-it, "
            "google/medgemma-27b-text-it), or this model's language model saved on its own as a Gemma3ForCausalLM "
            "(the README shows how)")),
        ("granite", Unsupported("Granite", "torchtune 0.6.1 has no family with Granite's embedding, residual and logit multipliers", "")),
        ("granitemoe", Unsupported("Granite-MoE", "torchtune 0.6.1 has no mixture-of-experts layers", "")),
        ("olmo2", Unsupported("OLMo 2", "torchtune 0.6.1 has no family with OLMo 2's post-norms and q/k norms", "")),
        ("smollm3", Unsupported("SmolLM3", "torchtune 0.6.1 has no family with SmolLM3's RoPE-free layers", "")),
        ("gpt_oss", Unsupported("gpt-oss", "torchtune 0.6.1 has no mixture-of-experts layers", "")),
        ("phi4mm", Unsupported("Phi-4-multimodal", "the torchtune engine tunes text-only models",
                               "Phi-4 (microsoft/phi-4) or Phi-3 4k")),
        ("phi3_v", Unsupported("Phi-3-vision", "the torchtune engine tunes text-only models", "Phi-3 4k (microsoft/Phi-3-mini-4k-instruct)")),
        ("qwen2_vl", Unsupported("Qwen2-VL", "the torchtune engine tunes text-only models", "Qwen2.5 (text)")),
        ("qwen2_5_vl", Unsupported("Qwen2.5-VL", "the torchtune engine tunes text-only models", "Qwen2.5 (text)")),
    ]
}  # fmt: skip


def refuse_model_type(model_type: Any, config_file: str) -> ConfigError:
    """The error for a model_type no torchtune 0.6.1 family serves: the supported families, the nearest one."""
    known = UNSUPPORTED.get(model_type)
    if known is None:
        what = f"unknown architecture model_type={model_type!r} in {config_file}"
        nearest = ""
    else:
        what = f"{known.name} (model_type {model_type!r} in {config_file}) is not supported: {known.why}"
        nearest = f"; the nearest supported choice is {known.nearest}" if known.nearest else ""
    return ConfigError(
        f"{what}; choose a model of a supported family: {SUPPORTED_FAMILIES}{nearest}; {_ENGINE_2}"
    )


def rope_parameters(hf_config: dict) -> tuple[str, dict]:
    """('rope_scaling' | 'rope_parameters', its dict): transformers 4 writes rope_scaling + top-level rope_theta,
    transformers 5 one rope_parameters dict holding rope_theta too — for a model with two kinds of layer (Gemma 3)
    one per layer type, of which this is the global (`full_attention`) layers' ('rope_parameters.full_attention')."""
    for key in ("rope_parameters", "rope_scaling"):
        value = hf_config.get(key)
        if isinstance(value, dict):
            if isinstance(value.get(FULL), dict):
                return f"{key}.{FULL}", value[FULL]
            return key, value
    return "rope_scaling", {}


def _local_rope_parameters(hf_config: dict) -> dict:
    """Gemma 3's local (sliding-window) layers' RoPE dict in a transformers 5 config.json; {} in a transformers 4
    one, which has only `rope_local_base_freq` for them (plain RoPE)."""
    value = hf_config.get("rope_parameters")
    return value[SLIDING] if isinstance(value, dict) and isinstance(value.get(SLIDING), dict) else {}


def rope_type(hf_config: dict) -> str:
    _, rope = rope_parameters(hf_config)
    return rope.get("rope_type") or rope.get("type") or "default"


def _llama3_rope_value(name: str) -> Callable[[dict], Any]:
    """A llama3 RoPE setting (None where config.json omits it: transformers 4 requires all three)."""

    def read(hf_config: dict) -> Any:
        return rope_parameters(hf_config)[1].get(name) if rope_type(hf_config) == "llama3" else None

    return read


def _scale_factor(hf_config: dict) -> Any:
    # Llama3ScaledRoPE (and Gemma 3's linear scaling) with factor 1 is plain RoPE: what a builder with scale_factor
    # gets for unscaled RoPE.
    return (
        rope_parameters(hf_config)[1].get("factor") if rope_type(hf_config) in ("llama3", "linear") else 1.0
    )


def _rope_theta(hf_config: dict) -> Any:
    theta = rope_parameters(hf_config)[1].get("rope_theta", hf_config.get("rope_theta"))
    return _ROPE_BASES.get(hf_config.get("model_type"), _ROPE_BASE) if theta is None else theta


def _local_rope_theta(hf_config: dict) -> Any:
    theta = _local_rope_parameters(hf_config).get("rope_theta", hf_config.get("rope_local_base_freq"))
    return _ROPE_BASE if theta is None else theta


def _local_rope_type(hf_config: dict) -> str:
    rope = _local_rope_parameters(hf_config)
    return rope.get("rope_type") or rope.get("type") or "default"


def layer_types(hf_config: dict) -> list[str] | None:
    """config.json's `layer_types`, or for Gemma 3 the list transformers' Gemma3TextConfig makes of its
    `sliding_window_pattern` (default 6: every 6th layer global) where a transformers 4.5x config.json has none."""
    if hf_config.get("layer_types") is not None or hf_config.get("model_type") != "gemma3_text":
        return hf_config.get("layer_types")
    layers = hf_config.get("num_hidden_layers")
    if layers is None:
        return None  # builder_node reports the missing dimension
    pattern = hf_config.get("sliding_window_pattern", 6)
    return [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]


def _partial_rotary_factor(hf_config: dict) -> Any:
    return rope_parameters(hf_config)[1].get("partial_rotary_factor", hf_config.get("partial_rotary_factor"))


def _head_dim(hf_config: dict) -> int | None:
    """What builders without a head_dim argument compute."""
    if not hf_config.get("hidden_size") or not hf_config.get("num_attention_heads"):
        return None  # builder_node reports the missing dimensions
    return hf_config["hidden_size"] // hf_config["num_attention_heads"]


def _window_is_neutral(window: Any, hf_config: dict, family: Family | None = None) -> bool:
    return window is None or window >= hf_config.get("max_position_embeddings", 0)


def _qwen2_window_is_neutral(use_sliding_window: Any, hf_config: dict, family: Family) -> bool:
    # transformers' Qwen2 and Qwen3 slide only with use_sliding_window, and only from layer max_window_layers on.
    return (
        not use_sliding_window
        or _window_is_neutral(hf_config.get("sliding_window", 4096), hf_config)
        or hf_config.get("max_window_layers", 28) >= hf_config.get("num_hidden_layers", 0)
    )


def _gemma2_layer_types(layers: int) -> list[str]:
    # torchtune's gemma2 builder: a sliding window on every even layer, as transformers' Gemma2 default.
    return [SLIDING if i % 2 == 0 else FULL for i in range(layers)]


@dataclass(frozen=True)
class LayoutField:
    """One config.json field that changes the math, and how a family's builder meets it."""

    key: str  # as written in config.json (`rope_scaling.x`: inside rope_scaling or rope_parameters)
    read_by: frozenset[str]  # model_types whose transformers class reads it
    # (value, config.json, family) -> the family's builder computes the same without carrying it
    neutral: Callable[[Any, dict, Family], bool]
    fix: str  # what to do when neither carried nor neutral; may name {builder} and {head_dim}
    arg: str | None = None  # the builder argument carrying it, where the family's builder takes one
    defaults: dict[str, Any] = field(default_factory=dict)  # transformers' value per model_type when omitted
    read: Callable[[dict], Any] | None = None  # how to read it when not a plain top-level key
    carries: Callable[[Any], bool] = lambda value: True  # values the argument accepts
    limits_positions: bool = False  # a sliding window: else-refused values become the position limit


LAYOUT_FIELDS: tuple[LayoutField, ...] = (
    LayoutField(
        "quantization_config", _ALL, lambda v, c, f: v is None,
        "a quantized checkpoint cannot be loaded into torchtune's model; use the unquantized model "
        "(tune_method=qlora quantizes the base itself)",
    ),
    LayoutField(
        "rope_scaling.rope_type", _ALL,
        lambda v, c, f: v == "default"
        or (v == "llama3" and f.name in ("llama3_1", "llama3_2", "llama3_3"))
        or (v == "linear" and f.name == "gemma3"),
        "{builder} builds plain RoPE (llama3 scaling only for Llama 3.1+, linear scaling only for Gemma 3's global "
        "layers); no supported family implements this scaling (Phi-3.5 / Phi-3 128k LongRoPE: use microsoft/Phi-3-mini-4k-instruct or microsoft/phi-4; "
        "Qwen2.5 / Qwen3 with YaRN added for long context: remove rope_scaling from config.json, where the released "
        "checkpoints have none, and train within max_position_embeddings)",
        read=rope_type,
    ),
    LayoutField(
        "rope_scaling.factor", _ALL, lambda v, c, f: v == 1, "{builder} takes no RoPE scale factor",
        arg="scale_factor", read=_scale_factor, carries=lambda v: v is not None,
    ),
    *(
        LayoutField(
            f"rope_scaling.{name}", _ALL, lambda v, c, f, expected=expected: v is None or v == expected,
            f"{{builder}} fixes Llama 3 RoPE scaling's {name} at {expected}; this model was trained with another",
            read=_llama3_rope_value(name),
        )
        for name, expected in _LLAMA3_ROPE.items()
    ),
    LayoutField(
        "partial_rotary_factor", _ALL, lambda v, c, f: v is None or v == 1,
        "{builder} rotates whole heads (Phi-4-mini's partial rotation is not supported); use microsoft/phi-4 or "
        "a Phi-3 4k model",
        read=_partial_rotary_factor,
    ),
    LayoutField(
        "rope_theta", _ALL, lambda v, c, f: v == _ROPE_BASE,
        "{builder} takes no RoPE base (its base is 10000)", arg="rope_base", read=_rope_theta,
    ),
    LayoutField(
        "rope_local_base_freq", frozenset({"gemma3_text"}), lambda v, c, f: False,
        "{builder} takes no RoPE base for the local layers", arg="local_rope_base", read=_local_rope_theta,
    ),
    LayoutField(
        f"rope_parameters.{SLIDING}.rope_type", frozenset({"gemma3_text"}), lambda v, c, f: v == "default",
        "{builder} rotates the local (sliding-window) layers with plain RoPE, as every released Gemma 3 does; this "
        "model scales their RoPE",
        read=_local_rope_type,
    ),
    LayoutField(
        "head_dim", _ALL, lambda v, c, f: v is None or _head_dim(c) is None or v == _head_dim(c),
        "{builder} computes head_dim as hidden_size / num_attention_heads = {head_dim} and takes no head_dim; "
        "no supported family with these layers has another (Mistral-Nemo's is read by its own builder)",
        arg="head_dim", defaults={"gemma": 256, "gemma2": 256, "qwen3": 128, "gemma3_text": 256},
    ),
    LayoutField(
        "intermediate_size", _ALL, lambda v, c, f: False, "{builder} takes no MLP width", arg="intermediate_dim",
        defaults={"llama": 11008, "mistral": 14336, "qwen2": 22016, "qwen3": 22016, "gemma": 24576, "gemma2": 9216,
                  "phi3": 8192, "gemma3_text": 9216},
    ),
    LayoutField(
        "rms_norm_eps", _ALL, lambda v, c, f: False, "{builder} takes no norm epsilon", arg="norm_eps",
        defaults={"llama": 1e-6, "mistral": 1e-6, "qwen2": 1e-6, "qwen3": 1e-6, "gemma": 1e-6, "gemma2": 1e-6,
                  "phi3": 1e-5, "gemma3_text": 1e-6},
    ),
    LayoutField(
        "tie_word_embeddings", _ALL, lambda v, c, f: bool(v) == f.ties_embeddings,
        "{builder} builds the output layer the other way (gemma families tie it, llama 3.2, SmolLM2, qwen2 and "
        "qwen3 follow config.json, the others keep separate weights); no supported family builds this model",
        arg="tie_word_embeddings",
        defaults={"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "phi3": False, "gemma": True,
                  "gemma2": True, "gemma3_text": True},
    ),
    LayoutField(
        "attention_bias", frozenset({"llama", "gemma", "gemma2", "qwen3", "gemma3_text"}), lambda v, c, f: not v,
        "{builder} builds attention projections without biases; no supported family with these layers has them",
    ),
    LayoutField(
        "mlp_bias", frozenset({"llama"}), lambda v, c, f: not v,
        "{builder} builds MLP projections without biases; no supported family with these layers has them",
    ),
    LayoutField(
        "hidden_act", frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma"}),
        lambda v, c, f: v in f.activations,
        "{builder} builds a fixed activation; no supported family with these layers uses this one",
        defaults={"llama": "silu", "mistral": "silu", "qwen2": "silu", "qwen3": "silu", "phi3": "silu",
                  "gemma": "gelu_pytorch_tanh"},
    ),
    LayoutField(
        "hidden_activation", _GEMMAS, lambda v, c, f: v is None or v in _GELU_TANH,
        "{builder} builds the tanh-approximated GELU; no supported family with these layers uses this one",
    ),
    LayoutField(
        "use_bidirectional_attention", _GEMMAS, lambda v, c, f: not v,
        "{builder} builds causal attention (an embedding model such as EmbeddingGemma is not a text generator "
        "torchtune can tune)",
    ),
    LayoutField(
        "sliding_window", frozenset({"mistral", "phi3", "gemma2", "gemma3_text"}), _window_is_neutral, "",
        arg="sliding_window_size", defaults={"mistral": 4096, "gemma2": 4096, "gemma3_text": 4096},
        limits_positions=True,
    ),
    LayoutField(
        "use_sliding_window", frozenset({"qwen2", "qwen3"}), _qwen2_window_is_neutral,
        "{builder} builds full attention in every layer; use a model with use_sliding_window false (all released "
        "Qwen2, Qwen2.5 and Qwen3 models)",
    ),
    LayoutField(
        "layer_types", frozenset({"qwen2", "qwen3", "gemma2", "gemma3_text"}),
        lambda v, c, f: v is None or v == (_gemma2_layer_types(len(v)) if f.name == "gemma2" else [FULL] * len(v)),
        "{builder} fixes which layers use a sliding window (gemma2: the even ones; qwen2, qwen3: none); this model "
        "arranges them otherwise",
        arg="layer_types", read=layer_types,
    ),
    LayoutField(
        "attn_logit_softcapping", frozenset({"gemma2", "gemma3_text"}), lambda v, c, f: v is None,
        "{builder} takes no soft-capping (no released Gemma 3 soft-caps its attention)",
        arg="hidden_capping_value", defaults={"gemma2": 50.0},
    ),
    LayoutField(
        "final_logit_softcapping", frozenset({"gemma2", "gemma3_text"}), lambda v, c, f: v is None and f.name == "gemma3",
        "{builder} fixes the final soft-capping (gemma2: always soft-caps, a null cap is not supported; gemma3: "
        "never, as no released Gemma 3 soft-caps)",
        arg="final_capping_value", defaults={"gemma2": 30.0}, carries=lambda v: v is not None,
    ),
    LayoutField(
        "query_pre_attn_scalar", frozenset({"gemma2", "gemma3_text"}), lambda v, c, f: False,
        "{builder} takes no query scale", arg="query_pre_attn_scalar", defaults={"gemma2": 256, "gemma3_text": 256},
    ),
)  # fmt: skip


def ties_embeddings(hf_config: dict) -> bool:
    """Whether the model's output layer is its embedding, as transformers reads config.json."""
    return bool(layout_value(next(f for f in LAYOUT_FIELDS if f.key == "tie_word_embeddings"), hf_config))


# How a builder meets one field's value (carry_layout; parity_cases names the kinds it proves by them).
CARRIED, NEUTRAL, POSITION_LIMIT, REFUSED = "carried", "neutral", "position limit", "refused"


def layout_value(layout: LayoutField, hf_config: dict) -> Any:
    """The field's value as transformers reads it: its default for the model_type where config.json omits it."""
    if layout.read is not None:
        return layout.read(hf_config)
    return hf_config.get(layout.key, layout.defaults.get(hf_config.get("model_type")))


def how_met(layout: LayoutField, value: Any, hf_config: dict, family: Family, accepted: set[str]) -> str:
    """CARRIED to the builder's argument, NEUTRAL, turned into a POSITION_LIMIT, or REFUSED."""
    if layout.arg in accepted and layout.carries(value):
        return CARRIED
    if layout.neutral(value, hf_config, family):
        return NEUTRAL
    return POSITION_LIMIT if layout.limits_positions else REFUSED


def carry_layout(
    node: dict,
    family: Family,
    hf_config: dict,
    component: str,
    accepted: set[str],
    full_accepted: set[str],
    config_file: str,
) -> None:
    """Add every layout field the builder `component` (taking `accepted`) carries to `node`; lower max_seq_len to
    a sliding window it cannot apply; raise ConfigError for a field it would silently compute otherwise.

    `full_accepted`: the arguments of the family's full builder, to tell a LoRA builder's gap from a family's."""
    model_type = hf_config.get("model_type")
    source, _ = rope_parameters(hf_config)
    for layout in LAYOUT_FIELDS:
        if model_type not in layout.read_by:
            continue
        value = layout_value(layout, hf_config)
        how = how_met(layout, value, hf_config, family, accepted)
        if how == CARRIED:
            node[layout.arg] = value
        elif how == POSITION_LIMIT:
            node["max_seq_len"] = min(node["max_seq_len"], value)
        elif how == REFUSED:
            name = layout.key.replace("rope_scaling.", f"{source}.")
            fix = layout.fix
            if layout.arg in full_accepted and layout.arg not in accepted:
                fix = f"{{builder}} takes no {layout.arg}, though the family's full builder does: set tune_method=full"
            fix = fix.format(
                builder=f"torchtune 0.6.1's {component.rpartition('.')[2]} builder",
                head_dim=_head_dim(hf_config),
            )
            raise ConfigError(f"{name} = {value!r} in {config_file}: {fix}")
