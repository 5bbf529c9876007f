"""A HF-layout model directory, mapped to torchtune: model builder + dims, checkpointer, tokenizer.

Shared by fine-tuning (to write the config) and evaluation (to load the same model the same way). The model
node always uses the family's *component builder* with every dimension taken from config.json, so any size
of a known family works (including fine-tuned variants and our tiny test models) and the resolved YAML shows
exactly what is built.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from kfp_finetune.components._shared import torchtune_files
from kfp_finetune.components._shared.errors import ConfigError


@dataclass(frozen=True)
class Family:
    name: str  # torchtune config folder, e.g. "llama3_2"
    builder: str
    lora_builder: str
    model_type: str  # torchtune checkpointer ModelType
    tokenizer: str
    tokenizer_files: dict[str, str]  # tokenizer builder argument -> file in the model dir


_SPM = {"path": "tokenizer.model"}
_TIKTOKEN = {"path": "original/tokenizer.model"}
_QWEN_BPE = {"path": "vocab.json", "merges_file": "merges.txt"}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("llama2", "torchtune.models.llama2.llama2", "torchtune.models.llama2.lora_llama2", "LLAMA2",
               "torchtune.models.llama2.llama2_tokenizer", _SPM),
        Family("code_llama2", "torchtune.models.llama2.llama2", "torchtune.models.llama2.lora_llama2", "LLAMA2",
               "torchtune.models.llama2.llama2_tokenizer", _SPM),
        Family("llama3", "torchtune.models.llama3.llama3", "torchtune.models.llama3.lora_llama3", "LLAMA3",
               "torchtune.models.llama3.llama3_tokenizer", _TIKTOKEN),
        Family("llama3_1", "torchtune.models.llama3_1.llama3_1", "torchtune.models.llama3_1.lora_llama3_1",
               "LLAMA3", "torchtune.models.llama3.llama3_tokenizer", _TIKTOKEN),
        Family("llama3_2", "torchtune.models.llama3_2.llama3_2", "torchtune.models.llama3_2.lora_llama3_2",
               "LLAMA3_2", "torchtune.models.llama3.llama3_tokenizer", _TIKTOKEN),
        Family("llama3_3", "torchtune.models.llama3_1.llama3_1", "torchtune.models.llama3_1.lora_llama3_1",
               "LLAMA3", "torchtune.models.llama3.llama3_tokenizer", _TIKTOKEN),
        Family("mistral", "torchtune.models.mistral.mistral", "torchtune.models.mistral.lora_mistral", "MISTRAL",
               "torchtune.models.mistral.mistral_tokenizer", _SPM),
        Family("gemma", "torchtune.models.gemma.gemma", "torchtune.models.gemma.lora_gemma", "GEMMA",
               "torchtune.models.gemma.gemma_tokenizer", _SPM),
        Family("gemma2", "torchtune.models.gemma2.gemma2", "torchtune.models.gemma2.lora_gemma2", "GEMMA2",
               "torchtune.models.gemma.gemma_tokenizer", _SPM),
        Family("phi3", "torchtune.models.phi3.phi3", "torchtune.models.phi3.lora_phi3", "PHI3_MINI",
               "torchtune.models.phi3.phi3_mini_tokenizer", _SPM),
        Family("phi4", "torchtune.models.phi3.phi3", "torchtune.models.phi3.lora_phi3", "PHI4",
               "torchtune.models.phi4.phi4_tokenizer", {"vocab_path": "vocab.json", "merges_path": "merges.txt"}),
        # torchtune's Qwen tokenizers, fixed not to mask every example's end token when max_seq_len is set.
        Family("qwen2", "torchtune.models.qwen2.qwen2", "torchtune.models.qwen2.lora_qwen2", "QWEN2",
               "kfp_finetune.components._shared.torchtune_tokenizers.qwen2_tokenizer", _QWEN_BPE),
        Family("qwen2_5", "torchtune.models.qwen2.qwen2", "torchtune.models.qwen2.lora_qwen2", "QWEN2",
               "kfp_finetune.components._shared.torchtune_tokenizers.qwen2_5_tokenizer", _QWEN_BPE),
    ]
}  # fmt: skip

# HF config.json key -> torchtune builder argument. Only arguments the chosen builder accepts are passed.
_HF_TO_BUILDER = {
    "vocab_size": "vocab_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "hidden_size": "embed_dim",
    "intermediate_size": "intermediate_dim",
    "max_position_embeddings": "max_seq_len",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_base",
    "head_dim": "head_dim",
    "tie_word_embeddings": "tie_word_embeddings",
    "attn_logit_softcapping": "hidden_capping_value",
    "final_logit_softcapping": "final_capping_value",
    "sliding_window": "sliding_window_size",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
}
_QWEN2_ONLY_SPECIAL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
_UNSUPPORTED = {
    "mllama": "Llama-3.2-Vision",
    "llama4": "Llama 4",
    "qwen3": "Qwen3",
    "qwen2_vl": "Qwen2-VL",
    "phi3_v": "Phi-3-vision",
}
WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass
class ModelDir:
    """What torchtune needs to know about one model directory."""

    path: Path
    family: Family
    hf_config: dict
    checkpoint_files: list[str]
    tokenizer_paths: dict[str, str] = field(default_factory=dict)
    special_tokens_path: str | None = None

    @property
    def num_parameters(self) -> int:
        """Parameter count estimated from config.json (used to pick the nearest torchtune config size)."""
        c = self.hf_config
        dim, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads = c["num_attention_heads"]
        head_dim = c.get("head_dim") or dim // heads
        kv_heads = c.get("num_key_value_heads") or heads
        attention = dim * head_dim * (2 * heads + 2 * kv_heads)
        mlp = 3 * dim * c.get("intermediate_size", 4 * dim)
        embeddings = vocab * dim * (1 if c.get("tie_word_embeddings") else 2)
        return layers * (attention + mlp) + embeddings

    def model_node(self, lora: dict | None = None) -> dict:
        """The `model:` config node: component builder + dims (+ LoRA settings for adapter methods)."""
        return builder_node(self.family, self.hf_config, lora, where=str(self.path))

    def lora_args(self) -> set[str]:
        return set(torchtune_files.parameters(self.family.lora_builder))

    def tokenizer_node(self, max_seq_len: int | None) -> dict:
        node: dict = {"_component_": self.family.tokenizer, **self.tokenizer_paths}
        accepted = torchtune_files.parameters(self.family.tokenizer)
        if self.special_tokens_path and "special_tokens_path" in accepted:
            node["special_tokens_path"] = self.special_tokens_path
        node["max_seq_len"] = max_seq_len
        return node

    def checkpointer_node(self, output_dir: str) -> dict:
        return {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(self.path),
            "checkpoint_files": list(self.checkpoint_files),
            "recipe_checkpoint": None,
            "output_dir": output_dir,
            "model_type": self.family.model_type,
        }


def builder_node(
    family: Family, hf_config: dict, lora: dict | None = None, where: str = "the model folder"
) -> dict:
    """The family's component builder (LoRA builder when `lora` is given) with every dimension from an HF
    config.json; only arguments the builder accepts are passed."""
    component = family.lora_builder if lora is not None else family.builder
    signature = torchtune_files.parameters(component)  # read from the source: no torch imported
    accepted = set(signature)
    node: dict = {"_component_": component}
    for hf_key, arg in _HF_TO_BUILDER.items():
        if arg in accepted and hf_config.get(hf_key) is not None:
            node[arg] = hf_config[hf_key]
    scaling = hf_config.get("rope_scaling") or {}
    if "scale_factor" in accepted and scaling.get("factor") is not None:
        node["scale_factor"] = scaling["factor"]
    if "attn_dropout" in accepted:
        node["attn_dropout"] = 0.0
    if family.name.startswith("qwen2") and "tie_word_embeddings" in accepted:
        # torchtune's Qwen2 LoRA builder defaults to untied embeddings; the checkpoint decides.
        node["tie_word_embeddings"] = bool(hf_config.get("tie_word_embeddings", False))
    missing = [
        name
        for name, has_default in signature.items()
        if not has_default and name not in node and name not in (lora or {})
    ]
    if missing:
        raise ConfigError(
            f"config.json in {where} lacks what {component} needs: {', '.join(missing)}; "
            "is this a complete HF model config?"
        )
    for key, value in (lora or {}).items():
        if key in accepted and value is not None:
            node[key] = value
    return node


def instantiate(node: dict):
    """Build what a config node describes (outside a recipe, e.g. for the tiny kit and evaluation)."""
    return _import(node["_component_"])(**{k: v for k, v in node.items() if k != "_component_"})


def _import(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def inspect_model_dir(path: str | Path, *, weights_required: bool = True) -> ModelDir:
    """Read config.json and the files present; raise ConfigError naming what is missing or unsupported.
    `weights_required=False`: a folder of config.json and tokenizer files only (no checkpoint files then)."""
    path = Path(path).resolve()
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"model directory {path} has no config.json: is it an HF-layout model folder?")
    try:
        hf_config = json.loads(config_path.read_text())
    except ValueError as err:
        raise ConfigError(f"{config_path} is not valid JSON: {err}") from err
    family = FAMILIES[detect_family(path, hf_config)]
    weights = find_weights(path) if weights_required else []
    model = ModelDir(path, family, hf_config, checkpoint_files=weights)
    for arg, relative in family.tokenizer_files.items():
        if not (path / relative).is_file():
            raise ConfigError(
                f"model directory {path} lacks the {family.name} tokenizer file {relative}; "
                "download it with the model (model-initialize fetches it)"
            )
        model.tokenizer_paths[arg] = str(path / relative)
    if (path / "tokenizer.json").is_file():
        model.special_tokens_path = str(path / "tokenizer.json")
    return model


def detect_family(path: Path, hf_config: dict) -> str:
    model_type = hf_config.get("model_type")
    if model_type in _UNSUPPORTED:
        raise ConfigError(f"{_UNSUPPORTED[model_type]} ({model_type}) is not supported by torchtune 0.6.1")
    if model_type == "llama":
        scaling = hf_config.get("rope_scaling") or {}
        if scaling.get("rope_type", scaling.get("type")) == "llama3":
            return "llama3_2" if float(scaling.get("factor", 8)) >= 16 else "llama3_1"
        if (path / "original" / "tokenizer.model").is_file() or hf_config.get("vocab_size", 0) >= 128000:
            return "llama3"
        return "code_llama2" if hf_config.get("vocab_size") == 32016 else "llama2"
    if model_type in ("mistral", "gemma", "gemma2"):
        return model_type
    if model_type == "phi3":
        return (
            "phi4" if (path / "vocab.json").is_file() and not (path / "tokenizer.model").is_file() else "phi3"
        )
    if model_type == "qwen2":
        return "qwen2_5" if _added_tokens(path) - _QWEN2_ONLY_SPECIAL or not _added_tokens(path) else "qwen2"
    known = ", ".join(sorted({"llama", "mistral", "gemma", "gemma2", "phi3", "qwen2"}))
    raise ConfigError(
        f"unknown architecture model_type={model_type!r} in {path / 'config.json'}; "
        f"torchtune 0.6.1 families supported here: {known}"
    )


def _added_tokens(path: Path) -> set[str]:
    try:
        data = json.loads((path / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return set()
    return {token["content"] for token in data.get("added_tokens", [])}


def find_weights(path: Path) -> list[str]:
    """Checkpoint files: the shards an index names (all must exist), else the weight files present."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = path / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
            missing = [s for s in shards if not (path / s).is_file()]
            if missing:
                raise ConfigError(
                    f"{path} is missing weight shards listed in {index_name}: {', '.join(missing)}"
                )
            return shards
    for suffix in WEIGHT_SUFFIXES:
        files = sorted(p.name for p in path.glob(f"*{suffix}") if not p.name.startswith("adapter_"))
        if files:
            return files
    raise ConfigError(f"model directory {path} has no weights (*.safetensors or pytorch_model*.bin)")


def size_in_parameters(size_tag: str) -> float | None:
    """'1B' -> 1e9, '0.5B' -> 5e8, 'mini' (Phi-3-mini) -> 3.8e9; None for tags that are not sizes."""
    if size_tag == "mini":
        return 3.8e9
    match = re.fullmatch(r"(\d+(?:\.\d+)?)B", size_tag)
    return float(match.group(1)) * 1e9 if match else None
