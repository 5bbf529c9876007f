"""Which family a model folder is read as, from config.json and the files it ships: SmolLM2 and Mistral-Nemo told
apart from the Llama and Mistral models detected before them, whose detection stays as it was."""

import json

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune.model_inspection import detect_family
from kfp_finetune.components._shared.torchtune.parity_cases import FAMILY_CASES

_LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip
_META = ["original/tokenizer.model", "tokenizer.json", "tokenizer_config.json"]  # Llama 3.x repos
_GPT2_STYLE = ["tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"]  # SmolLM2 repos
_HF_SAVED = ["tokenizer.json", "tokenizer_config.json"]  # what transformers' save_pretrained writes

# name -> (config.json fields that decide, files shipped, family); each as the released repo (or a fine-tune of it
# saved by transformers, which writes no SentencePiece or tiktoken file) has them.
MODELS = {
    "meta-llama/Llama-2-7b-hf": ({"model_type": "llama", "vocab_size": 32000, "tie_word_embeddings": False},
                                 ["tokenizer.model", "tokenizer.json"], "llama2"),
    "codellama/CodeLlama-7b-hf": ({"model_type": "llama", "vocab_size": 32016, "rope_theta": 1e6},
                                  ["tokenizer.model", "tokenizer.json"], "code_llama2"),
    "meta-llama/Meta-Llama-3-8B": ({"model_type": "llama", "vocab_size": 128256, "tie_word_embeddings": False},
                                   _META, "llama3"),
    "a Llama 3 8B fine-tune saved by transformers": ({"model_type": "llama", "vocab_size": 128256}, _HF_SAVED, "llama3"),
    "meta-llama/Llama-3.1-8B": ({"model_type": "llama", "vocab_size": 128256,
                                 "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0}}, _META, "llama3_1"),
    "meta-llama/Llama-3.2-1B": ({"model_type": "llama", "vocab_size": 128256, "tie_word_embeddings": True,
                                 "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}}, _META, "llama3_2"),
    "a Llama 3.2 1B fine-tune saved by transformers": (
        {"model_type": "llama", "vocab_size": 128256, "tie_word_embeddings": True,
         "rope_scaling": {**_LLAMA3_ROPE, "factor": 32.0}}, _HF_SAVED, "llama3_2"),
    "HuggingFaceTB/SmolLM2-135M": ({**FAMILY_CASES["smollm2"].base}, _GPT2_STYLE, "smollm2"),
    "HuggingFaceTB/SmolLM2-1.7B-Instruct saved by transformers": (
        {**FAMILY_CASES["smollm2"].cases()[2].config}, _HF_SAVED, "smollm2"),
    # Tied llama layers with Llama 2's vocabulary or SentencePiece model stay Llama 2 (and are refused there).
    "tied, with Llama 2's vocabulary": ({"model_type": "llama", "vocab_size": 32000, "tie_word_embeddings": True},
                                        _HF_SAVED, "llama2"),
    "tied, with a SentencePiece model": ({"model_type": "llama", "vocab_size": 49152, "tie_word_embeddings": True},
                                         ["tokenizer.model"], "llama2"),
    "untied, with a GPT-2 style tokenizer.json": ({"model_type": "llama", "vocab_size": 49152}, _GPT2_STYLE, "llama2"),
    "mistralai/Mistral-7B-v0.1": ({"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32},
                                  ["tokenizer.model", "tokenizer.json"], "mistral"),
    "mistralai/Mistral-7B-v0.3 saved by transformers 5 (head_dim written, = hidden/heads)": (
        {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128},
        ["tokenizer.model", "tokenizer.json"], "mistral"),
    "a Mistral 7B fine-tune with only tokenizer.json": (
        {"model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32}, _HF_SAVED, "mistral"),
    "mistralai/Mistral-Nemo-Base-2407": ({**FAMILY_CASES["mistral_nemo"].base}, _HF_SAVED, "mistral_nemo"),
}  # fmt: skip


def folder_of(tmp_path, config: dict, files: list[str]):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("")
    return folder


@pytest.mark.parametrize("name", MODELS)
def test_each_model_is_read_as_its_family(name, tmp_path):
    config, files, family = MODELS[name]
    assert detect_family(folder_of(tmp_path, config, files), config) == family


@pytest.mark.parametrize("family", ["smollm2", "mistral_nemo"])
def test_the_tiny_copy_parity_measures_is_read_as_the_family(family, tmp_path):
    """parity.py writes the family's tokenizer files empty next to a config.json of tiny sizes (vocabulary 128)."""
    from kfp_finetune.components._shared.torchtune.parity import tiny_config

    config = tiny_config(FAMILY_CASES[family].base)
    assert detect_family(folder_of(tmp_path, config, ["tokenizer.json"]), config) == family


@pytest.mark.parametrize(
    "template",
    [
        "{{ bos_token }}{% for m in messages %}[SYSTEM_PROMPT]{{ m['content'] }}[/SYSTEM_PROMPT]{% endfor %}",
        [{"name": "default", "template": "[SYSTEM_PROMPT]{{ system }}[/SYSTEM_PROMPT]"}],
    ],
    ids=["a template", "named templates"],
)
def test_nemos_layout_with_mistrals_v7_chat_format_is_refused(template, tmp_path):
    """Mistral Small 3 has Mistral-Nemo's layout kind (head_dim 128, not 5120 / 32) but writes system prompts as
    [SYSTEM_PROMPT] turns, which the mistral_nemo chat format does not."""
    config = {**FAMILY_CASES["mistral_nemo"].base, "intermediate_size": 32768, "rope_theta": 1e8}
    folder = folder_of(tmp_path, config, _HF_SAVED)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    with pytest.raises(ConfigError, match=r"\[SYSTEM_PROMPT\] turns, Mistral's V7 format .*Mistral-Nemo"):
        detect_family(folder, config)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "[INST]{{ m }}[/INST]"}))
    assert detect_family(folder, config) == "mistral_nemo"
