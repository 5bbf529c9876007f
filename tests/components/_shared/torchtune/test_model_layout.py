"""config.json layouts: every field that changes the math is carried into the model node, neutral, or refused
(naming the field, its value, the file and what to do) from config.json and the file listing alone."""

import json

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune.model_inspection import (
    FAMILIES,
    builder_node,
    inspect_model_dir,
)

_DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2}  # fmt: skip
_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
# family -> (tiny config.json as the released models of the family write it, the tokenizer files it ships)
BASES = {
    "llama2": ({"model_type": "llama", **_DIMS, "vocab_size": 32000, "rms_norm_eps": 1e-5,
                "max_position_embeddings": 4096}, ["tokenizer.model"]),
    "llama3": ({"model_type": "llama", **_DIMS, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                "max_position_embeddings": 8192}, ["original/tokenizer.model", "tokenizer.json"]),
    "llama3_1": ({"model_type": "llama", **_DIMS, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                  "max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE},
                 ["original/tokenizer.model", "tokenizer.json"]),
    "llama3_2": ({"model_type": "llama", **_DIMS, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                  "max_position_embeddings": 131072, "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0},
                  "tie_word_embeddings": True}, ["original/tokenizer.model", "tokenizer.json"]),
    "mistral": ({"model_type": "mistral", **_DIMS, "vocab_size": 32768, "rms_norm_eps": 1e-5, "rope_theta": 1e6,
                 "max_position_embeddings": 32768, "sliding_window": None}, ["tokenizer.model"]),
    "gemma": ({"model_type": "gemma", **_DIMS, "head_dim": 32, "vocab_size": 256000, "rms_norm_eps": 1e-6,
               "max_position_embeddings": 8192, "hidden_act": "gelu_pytorch_tanh"}, ["tokenizer.model"]),
    "gemma2": ({"model_type": "gemma2", **_DIMS, "head_dim": 32, "vocab_size": 256000, "rms_norm_eps": 1e-6,
                "max_position_embeddings": 8192, "hidden_activation": "gelu_pytorch_tanh",
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096,
                "query_pre_attn_scalar": 32}, ["tokenizer.model"]),
    "phi3": ({"model_type": "phi3", **_DIMS, "vocab_size": 32064, "rms_norm_eps": 1e-5,
              "max_position_embeddings": 4096, "rope_scaling": None, "sliding_window": None}, ["tokenizer.model"]),
    "qwen2_5": ({"model_type": "qwen2", **_DIMS, "vocab_size": 151936, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                 "max_position_embeddings": 32768, "tie_word_embeddings": True, "use_sliding_window": False,
                 "sliding_window": 32768, "max_window_layers": 21}, ["vocab.json", "merges.txt", "tokenizer.json"]),
    # Qwen3-0.6B's fields; head_dim is its own (0.6B: 128 with 1024 / 16)
    "qwen3": ({"model_type": "qwen3", **_DIMS, "head_dim": 32, "vocab_size": 151936, "rms_norm_eps": 1e-6,
               "rope_theta": 1e6, "rope_scaling": None, "max_position_embeddings": 40960, "tie_word_embeddings": True,
               "attention_bias": False, "hidden_act": "silu", "use_sliding_window": False, "sliding_window": None,
               "max_window_layers": 28}, ["vocab.json", "merges.txt", "tokenizer.json"]),
    # Gemma-3-1B's fields (transformers 4.50 form); head_dim is its own (1B: 256 with 1152 / 4)
    "gemma3": ({"model_type": "gemma3_text", **_DIMS, "num_hidden_layers": 6, "head_dim": 32, "vocab_size": 262144,
                "rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "hidden_activation": "gelu_pytorch_tanh",
                "sliding_window": 512, "sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
                "rope_scaling": None, "query_pre_attn_scalar": 256, "attn_logit_softcapping": None,
                "final_logit_softcapping": None, "attention_bias": False},
               ["tokenizer.model", "tokenizer.json"]),
    # SmolLM2-135M's fields: llama layers, tied embeddings, plain RoPE; a tokenizer.json (and GPT-2's files)
    "smollm2": ({"model_type": "llama", **_DIMS, "head_dim": 16, "vocab_size": 49152, "rms_norm_eps": 1e-5,
                 "rope_theta": 100000.0, "rope_scaling": None, "max_position_embeddings": 8192,
                 "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False},
                ["tokenizer.json", "vocab.json", "merges.txt"]),
    # Mistral-Nemo's fields; head_dim is its own (128 with 5120 / 32), a Tekken tokenizer.json
    "mistral_nemo": ({"model_type": "mistral", **_DIMS, "head_dim": 8, "vocab_size": 131072, "rms_norm_eps": 1e-5,
                      "rope_theta": 1e6, "max_position_embeddings": 1024000, "sliding_window": None},
                     ["tokenizer.json"]),
}  # fmt: skip
_GEMMA3_LAYERS = ["sliding_attention"] * 5 + ["full_attention"]


OMIT = "<not in config.json>"  # an override value that removes the key, as a real file omits it


def model_folder(tmp_path, family, overrides=None, *, weights=True, tokenizer_files=None):
    """A model folder as pre-flight or model-initialize sees it: config.json, placeholder tokenizer files and
    (unless `weights` is False) a placeholder weight file."""
    hf_config, files = BASES[family]
    hf_config = {k: v for k, v in {**hf_config, **(overrides or {})}.items() if v != OMIT}
    path = tmp_path / family
    path.mkdir()
    (path / "config.json").write_text(json.dumps(hf_config))
    for name in files if tokenizer_files is None else tokenizer_files:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text("")
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    return path


def build_on_meta(node):
    import torch

    from kfp_finetune.components._shared.torchtune.model_inspection import instantiate

    with torch.device("meta"):
        return instantiate(node)


# (family, config.json overrides, what the error must say: the field, its value and the fix)
REFUSED = [
    ("llama2", {"rope_scaling": {"type": "linear", "factor": 2.0}},
     r"rope_scaling.rope_type = 'linear' in .*config.json: torchtune 0.6.1's llama2 builder builds plain RoPE"),
    ("llama2", {"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_scaling.rope_type = 'dynamic'"),
    ("llama3", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 500000.0}},
     r"rope_parameters.rope_type = 'yarn'"),
    # Phi-3.5-mini / Phi-3-mini-128k: LongRoPE ("su" in the first releases).
    ("phi3", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
              "max_position_embeddings": 131072, "original_max_position_embeddings": 4096},
     r"rope_scaling.rope_type = 'longrope' .*Phi-3-mini-4k-instruct"),
    ("phi3", {"rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
     r"rope_scaling.rope_type = 'su'"),
    ("llama3_1", {"rope_scaling": {**_LLAMA3_ROPE, "low_freq_factor": 2.0}},
     r"rope_scaling.low_freq_factor = 2.0 .*fixes Llama 3 RoPE scaling's low_freq_factor at 1"),
    ("llama3_1", {"rope_scaling": {**_LLAMA3_ROPE, "original_max_position_embeddings": 4096}},
     r"rope_scaling.original_max_position_embeddings = 4096"),
    ("phi3", {"partial_rotary_factor": 0.75}, r"partial_rotary_factor = 0.75 .*rotates whole heads"),
    ("llama3", {"head_dim": 32}, r"head_dim = 32 .*= 16 and takes no head_dim"),
    ("llama2", {"hidden_size": 5120, "num_attention_heads": 32, "head_dim": 128},
     r"head_dim = 128 .*hidden_size / num_attention_heads = 160"),
    ("llama2", {"attention_bias": True}, r"attention_bias = True .*without biases"),
    ("llama3_2", {"mlp_bias": True}, r"mlp_bias = True .*MLP projections without biases"),
    ("gemma", {"attention_bias": True}, r"attention_bias = True"),
    ("llama2", {"hidden_act": "gelu"}, r"hidden_act = 'gelu' .*fixed activation"),
    ("gemma", {"hidden_act": "silu"}, r"hidden_act = 'silu'"),
    ("gemma2", {"hidden_activation": "silu"}, r"hidden_activation = 'silu'"),
    ("gemma", {"use_bidirectional_attention": True}, r"use_bidirectional_attention = True"),
    # Tied llama layers with a SentencePiece model are no SmolLM2 (smollm2 ties them).
    ("llama2", {"tie_word_embeddings": True, "vocab_size": 49152},
     r"tie_word_embeddings = True .*llama2 builder builds the output layer the other way"),
    ("smollm2", {"mlp_bias": True}, r"mlp_bias = True .*llama3_2 builder builds MLP projections without biases"),
    ("smollm2", {"head_dim": 32}, r"head_dim = 32 .*= 16 and takes no head_dim"),
    ("mistral_nemo", {"tie_word_embeddings": True},
     r"tie_word_embeddings = True .*mistral_nemo builder builds the output layer the other way"),
    ("mistral_nemo", {"hidden_act": "gelu"}, r"hidden_act = 'gelu'"),
    ("llama3_1", {"tie_word_embeddings": True}, r"tie_word_embeddings = True .*llama3_1"),
    ("gemma", {"tie_word_embeddings": False}, r"tie_word_embeddings = False"),
    ("qwen2_5", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0},
     r"use_sliding_window = True .*full attention in every layer"),
    ("qwen2_5", {"layer_types": ["full_attention", "sliding_attention"]}, r"layer_types = \['full_attention'"),
    ("gemma2", {"layer_types": ["full_attention", "sliding_attention"]}, r"layer_types = .*gemma2: the even ones"),
    ("gemma2", {"final_logit_softcapping": None}, r"final_logit_softcapping = None .*always soft-caps"),
    # Qwen3 with YaRN added for contexts past 32,768 tokens (its model card's recipe)
    ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
     r"rope_scaling.rope_type = 'yarn' .*Qwen3 with YaRN .*remove rope_scaling from config.json"),
    ("qwen3", {"attention_bias": True}, r"attention_bias = True .*qwen3 builder builds attention projections without"),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 0},
     r"use_sliding_window = True .*full attention in every layer"),
    ("qwen3", {"layer_types": ["sliding_attention", "full_attention"]}, r"layer_types = .*qwen2, qwen3: none"),
    ("qwen3", {"hidden_act": "gelu"}, r"hidden_act = 'gelu'"),
    ("gemma3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
     r"rope_scaling.rope_type = 'yarn' .*linear scaling only for Gemma 3's global layers"),
    ("gemma3", {"rope_theta": OMIT, "rope_local_base_freq": OMIT, "rope_scaling": OMIT, "rope_parameters": {
        "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     r"rope_parameters.sliding_attention.rope_type = 'linear' .*local \(sliding-window\) layers with plain RoPE"),
    ("gemma3", {"rope_theta": OMIT, "rope_scaling": OMIT, "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        "full_attention": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e6}}},
     r"rope_parameters.full_attention.rope_type = 'dynamic'"),
    # EmbeddingGemma: Gemma 3 layers attending both ways
    ("gemma3", {"use_bidirectional_attention": True}, r"use_bidirectional_attention = True .*causal attention"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, r"attn_logit_softcapping = 50.0 .*no released Gemma 3"),
    ("gemma3", {"final_logit_softcapping": 30.0}, r"final_logit_softcapping = 30.0 .*gemma3: never"),
    ("gemma3", {"tie_word_embeddings": False}, r"tie_word_embeddings = False"),
    ("gemma3", {"attention_bias": True}, r"attention_bias = True .*gemma3 builder builds attention projections"),
    ("gemma3", {"hidden_activation": "gelu"}, r"hidden_activation = 'gelu' .*tanh-approximated GELU"),
    ("mistral", {"quantization_config": {"quant_method": "gptq", "bits": 4}},
     r"quantization_config = .*gptq.*use the unquantized model \(tune_method=qlora"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "overrides", "message"), REFUSED)
def test_a_field_the_builder_would_drop_is_refused_from_config_json_alone(
    family, overrides, message, tmp_path
):
    folder = model_folder(tmp_path, family, overrides, weights=False)
    with pytest.raises(ConfigError, match=message) as refused:
        inspect_model_dir(folder, weights_required=False)
    assert str(folder / "config.json") in str(refused.value)


# (family, config.json overrides): the value the family's builder computes anyway
NEUTRAL = [
    ("mistral", {"sliding_window": None}),
    ("phi3", {"sliding_window": 4096}),
    ("mistral", {"head_dim": 16}),
    ("llama3", {"head_dim": None}),
    ("llama2", {"attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}),
    ("llama2", {"tie_word_embeddings": False, "pretraining_tp": 1}),
    ("llama2", {"rope_scaling": None, "partial_rotary_factor": 1.0}),
    ("llama2", {"rope_scaling": {"type": "default"}}),
    ("gemma", {"hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
    ("gemma2", {"layer_types": ["sliding_attention", "full_attention"], "use_bidirectional_attention": None}),
    ("qwen2_5", {"layer_types": ["full_attention", "full_attention"]}),
    ("qwen2_5", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 2}),
    ("qwen2_5", {"use_sliding_window": True, "sliding_window": 32768}),
    ("qwen3", {"layer_types": ["full_attention"] * 2, "attention_bias": OMIT, "hidden_act": OMIT}),
    ("qwen3", {"rope_scaling": {"rope_type": "default"}}),
    (
        "gemma3",
        {
            "attn_logit_softcapping": OMIT,
            "final_logit_softcapping": OMIT,
            "tie_word_embeddings": True,
            "hidden_activation": OMIT,
            "use_bidirectional_attention": False,
        },
    ),
    ("smollm2", {"head_dim": OMIT, "rope_scaling": {"rope_type": "default"}}),
    ("mistral_nemo", {"sliding_window": 1024000, "attention_bias": True}),
    ("phi3", {"quantization_config": None}),
    # Fields transformers' class for the model_type does not read either.
    ("mistral", {"attention_bias": True, "mlp_bias": True}),
    ("llama3", {"attn_logit_softcapping": 30.0, "sliding_window": 512}),
]


@pytest.mark.parametrize(("family", "overrides"), NEUTRAL)
def test_a_field_at_the_value_the_builder_computes_is_accepted(family, overrides, tmp_path):
    model = inspect_model_dir(
        model_folder(tmp_path, family, overrides, weights=False), weights_required=False
    )
    assert model.family.name == family
    build_on_meta(model.model_node())


# (family, config.json overrides, model node argument, its value)
CARRIED = [
    # transformers' default where config.json omits a field, not the builder's own default
    ("llama3_2", {"tie_word_embeddings": OMIT}, "tie_word_embeddings", False),
    ("llama3_2", {}, "tie_word_embeddings", True),
    ("qwen2_5", {}, "tie_word_embeddings", True),
    ("qwen2_5", {"tie_word_embeddings": False}, "tie_word_embeddings", False),
    ("llama3_1", {}, "scale_factor", 8.0),
    ("llama3_2", {}, "scale_factor", 32.0),
    ("llama3", {}, "rope_base", 500000.0),
    ("llama3", {"rope_theta": OMIT}, "rope_base", 10000.0),
    # transformers 5 writes rope_theta inside rope_parameters
    ("llama3_2", {"rope_theta": OMIT, "rope_scaling": OMIT,
                  "rope_parameters": {**_LLAMA3_ROPE, "factor": 32.0, "rope_theta": 500000.0}}, "rope_base", 500000.0),
    ("llama3_2", {"rope_theta": OMIT, "rope_scaling": OMIT,
                  "rope_parameters": {**_LLAMA3_ROPE, "factor": 32.0, "rope_theta": 500000.0}}, "scale_factor", 32.0),
    ("llama2", {"rms_norm_eps": OMIT}, "norm_eps", 1e-6),
    ("llama3", {"intermediate_size": OMIT}, "intermediate_dim", 11008),  # the builder would compute 256 for dim 64
    ("phi3", {"rms_norm_eps": OMIT}, "norm_eps", 1e-5),
    ("gemma", {"head_dim": OMIT}, "head_dim", 256),
    ("qwen3", {}, "head_dim", 32),
    ("qwen3", {"head_dim": OMIT}, "head_dim", 128),  # transformers' Qwen3Config default, not hidden / heads
    ("qwen3", {}, "tie_word_embeddings", True),
    ("qwen3", {"tie_word_embeddings": OMIT}, "tie_word_embeddings", False),
    ("qwen3", {}, "rope_base", 1e6),
    ("qwen3", {"rope_theta": OMIT, "rope_scaling": OMIT, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
     "rope_base", 1e6),
    ("qwen3", {"rms_norm_eps": OMIT, "intermediate_size": OMIT}, "norm_eps", 1e-6),
    ("qwen3", {"intermediate_size": OMIT}, "intermediate_dim", 22016),
    # SmolLM2: llama3_2's builder with plain RoPE (scale factor 1) and config.json's RoPE base and tying
    ("smollm2", {}, "scale_factor", 1.0),
    ("smollm2", {"rope_scaling": OMIT, "rope_theta": OMIT}, "scale_factor", 1.0),
    ("smollm2", {}, "rope_base", 100000.0),
    ("smollm2", {"rope_theta": OMIT}, "rope_base", 10000.0),
    ("smollm2", {}, "tie_word_embeddings", True),
    ("smollm2", {"rms_norm_eps": OMIT}, "norm_eps", 1e-6),
    ("mistral_nemo", {}, "head_dim", 8),
    ("mistral_nemo", {}, "rope_base", 1e6),
    ("mistral_nemo", {"rms_norm_eps": OMIT}, "norm_eps", 1e-6),
    ("mistral_nemo", {}, "max_seq_len", 1024000),
    ("mistral_nemo", {"sliding_window": 4096}, "max_seq_len", 4096),
    ("gemma2", {}, "hidden_capping_value", 50.0),
    ("gemma2", {"attn_logit_softcapping": None}, "hidden_capping_value", None),
    ("gemma2", {"final_logit_softcapping": 25.0}, "final_capping_value", 25.0),
    ("gemma2", {"sliding_window": None}, "sliding_window_size", None),
    ("gemma2", {"sliding_window": 2048}, "sliding_window_size", 2048),
    ("gemma2", {"query_pre_attn_scalar": 144}, "query_pre_attn_scalar", 144),
    # Gemma 3: two RoPE bases, the global one scaled (4B-27B), the layer kinds from sliding_window_pattern
    ("gemma3", {}, "rope_base", 1e6),
    ("gemma3", {}, "local_rope_base", 1e4),
    ("gemma3", {"rope_theta": OMIT, "rope_local_base_freq": OMIT}, "rope_base", 1e6),  # Gemma3TextConfig's
    ("gemma3", {"rope_theta": OMIT, "rope_local_base_freq": OMIT}, "local_rope_base", 1e4),
    ("gemma3", {}, "scale_factor", 1.0),
    ("gemma3", {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}, "scale_factor", 8.0),
    ("gemma3", {}, "layer_types", _GEMMA3_LAYERS),
    ("gemma3", {"sliding_window_pattern": OMIT}, "layer_types", _GEMMA3_LAYERS),  # transformers' default 6
    ("gemma3", {"sliding_window_pattern": 2}, "layer_types", ["sliding_attention", "full_attention"] * 3),
    ("gemma3", {"layer_types": ["full_attention"] * 6}, "layer_types", ["full_attention"] * 6),
    ("gemma3", {}, "sliding_window_size", 512),
    ("gemma3", {"sliding_window": OMIT}, "sliding_window_size", 4096),
    ("gemma3", {"query_pre_attn_scalar": OMIT}, "query_pre_attn_scalar", 256),
    ("gemma3", {"head_dim": OMIT}, "head_dim", 256),
    # transformers 5 writes one rope_parameters dict per layer type, and the layer list
    *[("gemma3", {"rope_theta": OMIT, "rope_local_base_freq": OMIT, "rope_scaling": OMIT, "sliding_window_pattern": OMIT,
                  "layer_types": _GEMMA3_LAYERS, "rope_parameters": {
                      "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                      "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}, arg, value)
      for arg, value in [("rope_base", 1e6), ("local_rope_base", 1e4), ("scale_factor", 8.0),
                         ("layer_types", _GEMMA3_LAYERS)]],
    # a sliding window the builder cannot apply becomes the position limit (Mistral-7B-v0.1, Phi-3-mini-4k)
    ("mistral", {"sliding_window": 4096}, "max_seq_len", 4096),
    ("mistral", {"sliding_window": OMIT}, "max_seq_len", 4096),
    ("phi3", {"sliding_window": 2047}, "max_seq_len", 2047),
    ("mistral", {"sliding_window": 65536}, "max_seq_len", 32768),
]  # fmt: skip


@pytest.mark.parametrize(("family", "overrides", "arg", "value"), CARRIED)
def test_a_field_the_builder_takes_is_carried_into_the_model_node(family, overrides, arg, value, tmp_path):
    model = inspect_model_dir(
        model_folder(tmp_path, family, overrides, weights=False), weights_required=False
    )
    node = model.model_node()
    assert node[arg] == value
    assert model.model_node({"lora_rank": 8, "lora_alpha": 16, "lora_attn_modules": ["q_proj"]})[arg] == value
    if arg == "max_seq_len":  # every length rule reads the limit from here
        assert model.hf_config["max_position_embeddings"] == value
    build_on_meta(node)


def test_llama3_2_builds_untied_output_weights_when_config_json_omits_tie_word_embeddings(tmp_path):
    """transformers' LlamaConfig defaults to untied; torchtune's llama3_2 builder to tied."""
    import torch

    config = {k: v for k, v in BASES["llama3_2"][0].items() if k != "tie_word_embeddings"}
    model = build_on_meta(builder_node(FAMILIES["llama3_2"], config))
    assert isinstance(model.output, torch.nn.Linear)


def test_code_llama_lora_is_refused_because_torchtunes_lora_builder_drops_its_rope_base(tmp_path):
    config = {**BASES["llama2"][0], "vocab_size": 32016, "rope_theta": 1e6, "max_position_embeddings": 16384}
    assert builder_node(FAMILIES["code_llama2"], config)["rope_base"] == 1e6
    with pytest.raises(
        ConfigError,
        match=r"rope_theta = 1000000.0 .*lora_llama2 builder takes no rope_base.*tune_method=full",
    ):
        builder_node(FAMILIES["code_llama2"], config, {"lora_rank": 8})


def test_pre_flight_inspects_a_folder_without_weights_and_model_initialize_still_needs_them(tmp_path):
    folder = model_folder(tmp_path, "llama3_2", weights=False)
    model = inspect_model_dir(folder, weights_required=False)
    assert model.checkpoint_files == []
    assert model.tokenizer_paths == {"path": str(folder / "original" / "tokenizer.model")}
    with pytest.raises(ConfigError, match="has no weights"):
        inspect_model_dir(folder)
    (folder / "model.safetensors").write_bytes(b"")
    assert inspect_model_dir(folder).checkpoint_files == ["model.safetensors"]
    assert inspect_model_dir(folder, weights_required=False).checkpoint_files == []


_ENGINE_2 = "mixture-of-experts and multimodal models need the second (transformers) training engine: tune_engine=auto"
# model_type -> the nearest supported choice the message names ("" where there is none)
UNSUPPORTED = {
    "qwen3_moe": "Qwen3 dense", "llama4": "Llama 3.1 / 3.3", "mllama": "Llama 3.2 text",
    "gemma3": "Gemma 3 text (model_type gemma3_text", "granite": "", "granitemoe": "", "olmo2": "", "smollm3": "",
    "phi4mm": "Phi-4", "gpt_oss": "", "qwen2_vl": "Qwen2.5", "falcon": "", "deepseek_v3": "",
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(UNSUPPORTED))
def test_an_unsupported_family_names_the_supported_ones_the_nearest_and_the_engine(model_type, tmp_path):
    folder = model_folder(tmp_path, "llama3_2", {"model_type": model_type}, weights=False)
    with pytest.raises(ConfigError) as refused:
        inspect_model_dir(folder, weights_required=False)
    message = str(refused.value)
    assert f"model_type {model_type!r}" in message or f"model_type={model_type!r}" in message
    assert str(folder / "config.json") in message
    assert "choose a model of a supported family: llama (" in message and "qwen2 (Qwen2, Qwen2.5)" in message
    assert _ENGINE_2 in message
    nearest = UNSUPPORTED[model_type]
    assert (f"the nearest supported choice is {nearest}" in message) == bool(nearest)


@pytest.mark.parametrize(
    ("family", "missing", "kind", "reason"),
    [
        ("llama3_2", "original/tokenizer.model", "the Llama 3 tiktoken file",
         "cannot read the model's tokenizer.json instead"),
        # a tokenizer.json holding the BPE: derived instead (test_torchtune_tokenizer_files.py)
        ("qwen2_5", "vocab.json", "the BPE vocabulary", "it has no readable tokenizer.json to derive them from"),
        ("mistral", "tokenizer.model", "the SentencePiece model", "cannot read the model's tokenizer.json instead"),
    ],
)  # fmt: skip
def test_a_tokenizer_file_the_repo_does_not_ship_is_refused_with_the_real_reason(
    family, missing, kind, reason, tmp_path
):
    files = [name for name in BASES[family][1] if name != missing] + ["tokenizer.json"]
    folder = model_folder(tmp_path, family, weights=False, tokenizer_files=sorted(set(files)))
    with pytest.raises(ConfigError) as refused:
        inspect_model_dir(folder, weights_required=False)
    message = str(refused.value)
    assert f"ships no {missing} ({kind}), which torchtune 0.6.1's" in message
    assert reason in message
    assert "add the base model's" in message
    assert "download it with the model" not in message


_PHI3_LONGROPE = {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0] * 48}
_NEMO = "kfp_finetune.components._shared.torchtune.families.mistral_nemo.mistral_nemo"
# What their repos ship: a tokenizer.json and no SentencePiece or tiktoken file (the others: both Meta files).
_TOKENIZER_JSON_ONLY = {"Mistral-Nemo-Instruct-2407", "SmolLM2-1.7B-Instruct"}
# The models named in issue 23, with the config.json fields that decide their layout as the released files set them.
REAL_WORLD = {
    "Mistral-Nemo-Instruct-2407": ({"model_type": "mistral", "hidden_size": 5120, "intermediate_size": 14336,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 131072, "max_position_embeddings": 1024000, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
        "sliding_window": None}, {"_component_": _NEMO, "head_dim": 128, "embed_dim": 5120, "num_heads": 32,
                                  "rope_base": 1e6, "max_seq_len": 1024000}),
    "Phi-3.5-mini-instruct": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_scaling": _PHI3_LONGROPE,
        "sliding_window": 262144, "rms_norm_eps": 1e-5}, r"rope_scaling.rope_type = 'longrope'"),
    "Phi-4-mini-instruct": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 200064,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
        "rope_scaling": _PHI3_LONGROPE, "tie_word_embeddings": True, "sliding_window": 262144, "rms_norm_eps": 1e-5},
        r"rope_scaling.rope_type = 'longrope'"),
    "SmolLM2-1.7B-Instruct": ({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 24, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 49152,
        "max_position_embeddings": 8192, "rope_theta": 130000, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "attention_bias": False, "mlp_bias": False, "rope_scaling": None},
        {"_component_": "torchtune.models.llama3_2.llama3_2", "rope_base": 130000, "scale_factor": 1.0,
         "tie_word_embeddings": True}),
    "Mistral-7B-v0.1": ({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "sliding_window": 4096},
        {"max_seq_len": 4096}),
    "Phi-3-mini-4k-instruct": ({"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096, "rope_scaling": None,
        "sliding_window": 2047, "rms_norm_eps": 1e-5}, {"max_seq_len": 2047}),
    "Llama-3.2-1B saved by transformers 5": ({"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "rope_parameters": {**_LLAMA3_ROPE, "factor": 32.0, "rope_theta": 500000.0}},
        {"_component_": "torchtune.models.llama3_2.llama3_2", "rope_base": 500000.0, "scale_factor": 32.0}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REAL_WORLD))
def test_the_models_of_issue_23_are_refused_or_carried_as_their_config_json_says(name, tmp_path):
    hf_config, expected = REAL_WORLD[name]
    folder = tmp_path / "model"
    (folder / "original").mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(hf_config))
    shipped = (
        ("tokenizer.json",)
        if name in _TOKENIZER_JSON_ONLY
        else ("tokenizer.model", "original/tokenizer.model")
    )
    for tokenizer_file in shipped:
        (folder / tokenizer_file).write_text("")
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            inspect_model_dir(folder, weights_required=False)
    else:
        node = inspect_model_dir(folder, weights_required=False).model_node()
        assert {key: node[key] for key in expected} == expected
