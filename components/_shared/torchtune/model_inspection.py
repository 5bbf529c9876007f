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

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune import installed, model_layout, tokenizer_files

# The project's HF checkpointer (torchtune/checkpointer.py), named by path: importing it needs torch.
CHECKPOINTER = "kfp_finetune.components._shared.torchtune.checkpointer.HFCheckpointer"


@dataclass(frozen=True)
class Family:
    name: str  # e.g. "llama3_2": torchtune's config folder, unless configs_from names another
    builder: str
    lora_builder: str
    model_type: str  # torchtune checkpointer ModelType
    tokenizer: str
    tokenizer_files: dict[str, str]  # tokenizer builder argument -> file in the model dir
    ties_embeddings: bool = False  # the output layer reuses the embedding (where the builder takes no switch)
    activations: tuple[str, ...] = ("silu",)  # config.json hidden_act values the builder's MLP computes
    # Its attention takes the BlockMask packed batches get on CUDA (flex attention); where not, GPU runs train
    # unpacked (defaults.py) and dataset-initialize writes no packs.
    block_masks: bool = True
    qk_norms: bool = False  # q and k pass an RMSNorm per head (activations the memory model counts)
    post_norms: bool = False  # attention and MLP outputs pass a norm too (Gemma 2, 3: more activations)
    # torchtune config folder whose recipe configs serve a family that has none in 0.6.1 (resolve picks the size)
    configs_from: str | None = None

    @property
    def config_family(self) -> str:
        return self.configs_from or self.name


_SPM = {"path": "tokenizer.model"}
_TIKTOKEN = {"path": "original/tokenizer.model"}
_QWEN_BPE = {"path": "vocab.json", "merges_file": "merges.txt"}
_TOKENIZER_JSON = {"path": "tokenizer.json"}
# nn.GELU(approximate="tanh"); transformers reads Gemma's legacy hidden_act "gelu" as the same.
_GEMMA_GELU = ("gelu_pytorch_tanh", "gelu_new", "gelu")
_GEMMA2 = "kfp_finetune.components._shared.torchtune.gemma2"
_LORA_QWEN2 = "kfp_finetune.components._shared.torchtune.qwen2.lora_qwen2"
_TOKENIZERS = "kfp_finetune.components._shared.torchtune.tokenizer_builders"
_QWEN3 = "kfp_finetune.components._shared.torchtune.families.qwen3"
_GEMMA3 = "kfp_finetune.components._shared.torchtune.families.gemma3"
_HF_TOKENIZER = "kfp_finetune.components._shared.torchtune.hf_tokenizer"
_MISTRAL_NEMO = "kfp_finetune.components._shared.torchtune.families.mistral_nemo"

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
               "torchtune.models.gemma.gemma_tokenizer", _SPM, ties_embeddings=True, activations=_GEMMA_GELU),
        # torchtune's gemma2 builders soft-cap the hidden state instead of the logits: ours cap the logits.
        # Its attention takes no block masks (torchtune/models/gemma2/_attention.py), so no packing on CUDA.
        Family("gemma2", f"{_GEMMA2}.gemma2", f"{_GEMMA2}.lora_gemma2", "GEMMA2",
               "torchtune.models.gemma.gemma_tokenizer", _SPM, ties_embeddings=True, activations=_GEMMA_GELU,
               block_masks=False, post_norms=True),
        Family("phi3", "torchtune.models.phi3.phi3", "torchtune.models.phi3.lora_phi3", "PHI3_MINI",
               "torchtune.models.phi3.phi3_mini_tokenizer", _SPM),
        Family("phi4", "torchtune.models.phi3.phi3", "torchtune.models.phi3.lora_phi3", "PHI4",
               "torchtune.models.phi4.phi4_tokenizer", {"vocab_path": "vocab.json", "merges_path": "merges.txt"}),
        # torchtune's Qwen tokenizers, fixed not to mask every example's end token when max_seq_len is set; its
        # LoRA builder, fixed not to scale the q/k/v biases with DoRA's magnitudes.
        Family("qwen2", "torchtune.models.qwen2.qwen2", _LORA_QWEN2, "QWEN2", f"{_TOKENIZERS}.qwen2_tokenizer",
               _QWEN_BPE),
        Family("qwen2_5", "torchtune.models.qwen2.qwen2", _LORA_QWEN2, "QWEN2", f"{_TOKENIZERS}.qwen2_5_tokenizer",
               _QWEN_BPE),
        # Not in torchtune 0.6.1: our builders on its modules; Qwen2.5's recipe configs of the nearest size.
        Family("qwen3", f"{_QWEN3}.qwen3", f"{_QWEN3}.lora_qwen3", "QWEN3", f"{_TOKENIZERS}.qwen3_tokenizer",
               _QWEN_BPE, qk_norms=True, configs_from="qwen2_5"),
        # Not in torchtune 0.6.1: our builders on its modules (local/global layers, q/k norms before RoPE) and
        # tokenizer (Gemma 3's turns); Gemma 2's recipe configs of the nearest size.
        Family("gemma3", f"{_GEMMA3}.gemma3", f"{_GEMMA3}.lora_gemma3", "GEMMA3", f"{_TOKENIZERS}.gemma3_tokenizer",
               _SPM, ties_embeddings=True, activations=_GEMMA_GELU, qk_norms=True, post_norms=True,
               configs_from="gemma2"),
        # SmolLM2: Llama 3.2's layers (tied embeddings) with plain RoPE, which torchtune's llama3_2 builders compute
        # with scale factor 1; its tokenizer.json read by ours; Qwen2.5's recipe configs of the nearest size.
        Family("smollm2", "torchtune.models.llama3_2.llama3_2", "torchtune.models.llama3_2.lora_llama3_2",
               "LLAMA3_2", f"{_HF_TOKENIZER}.smollm2_tokenizer", _TOKENIZER_JSON, configs_from="qwen2_5"),
        # Mistral-Nemo: Mistral's layers with their own head_dim (our builders on torchtune 0.6.1's modules), its
        # Tekken tokenizer.json read by ours; Mistral 7B's recipe configs.
        Family("mistral_nemo", f"{_MISTRAL_NEMO}.mistral_nemo", f"{_MISTRAL_NEMO}.lora_mistral_nemo", "MISTRAL",
               f"{_HF_TOKENIZER}.mistral_nemo_tokenizer", _TOKENIZER_JSON, configs_from="mistral"),
    ]
}  # fmt: skip

# HF config.json dimensions -> torchtune builder argument. The fields that change the math beyond these
# dimensions are carried or refused by model_layout.
_HF_TO_BUILDER = {
    "vocab_size": "vocab_size",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "hidden_size": "embed_dim",
    "max_position_embeddings": "max_seq_len",
}
_QWEN2_ONLY_SPECIAL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}
_LLAMA2_VOCABULARIES = (32000, 32016)  # Llama 2's and Code Llama's SentencePiece vocabularies
_TOKENIZER_KINDS = {
    "original/tokenizer.model": "the Llama 3 tiktoken file",
    "tokenizer.model": "the SentencePiece model",
    "vocab.json": "the BPE vocabulary",
    "merges.txt": "the BPE merges",
    "tokenizer.json": "the Hugging Face tokenizer",
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
        return builder_node(self.family, self.hf_config, lora, config_file=str(self.path / "config.json"))

    def lora_args(self) -> set[str]:
        return set(installed.parameters(self.family.lora_builder))

    def tokenizer_node(self, max_seq_len: int | None) -> dict:
        node: dict = {"_component_": self.family.tokenizer, **self.tokenizer_paths}
        accepted = installed.parameters(self.family.tokenizer)
        if self.special_tokens_path and "special_tokens_path" in accepted:
            node["special_tokens_path"] = self.special_tokens_path
        node["max_seq_len"] = max_seq_len
        return node

    def checkpointer_node(self, output_dir: str) -> dict:
        return {
            "_component_": CHECKPOINTER,
            "checkpoint_dir": str(self.path),
            "checkpoint_files": list(self.checkpoint_files),
            "recipe_checkpoint": None,
            "output_dir": output_dir,
            "model_type": self.family.model_type,
        }


def builder_node(
    family: Family, hf_config: dict, lora: dict | None = None, config_file: str = "config.json"
) -> dict:
    """The family's component builder (LoRA builder when `lora` is given) with every dimension from an HF
    config.json and every field that changes the math carried, or a ConfigError naming the one it cannot carry
    (model_layout). Only arguments the builder accepts are passed."""
    component = family.lora_builder if lora is not None else family.builder
    signature = installed.parameters(component)  # read from the source: no torch imported
    accepted = set(signature)
    node: dict = {"_component_": component}
    for hf_key, arg in _HF_TO_BUILDER.items():
        if arg in accepted and hf_config.get(hf_key) is not None:
            node[arg] = hf_config[hf_key]
    full_accepted = set(installed.parameters(family.builder))
    model_layout.carry_layout(node, family, hf_config, component, accepted, full_accepted, config_file)
    missing = [
        name
        for name, has_default in signature.items()
        if not has_default and name not in node and name not in (lora or {})
    ]
    if missing:
        hf_keys = {arg: key for key, arg in _HF_TO_BUILDER.items()}
        named = ", ".join(repr(hf_keys.get(name, name)) for name in missing)
        raise ConfigError(
            f"config.json has no {named}, which {component} needs ({config_file}); "
            "is this a complete HF model config?"
        )
    if "attn_dropout" in accepted:
        node["attn_dropout"] = 0.0
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

    Every check but the weights' reads only config.json and the file listing, so a folder holding just those
    and the tokenizer files (pre-flight, before any download) is checked with `weights_required=False`; its
    `checkpoint_files` are then empty. `hf_config` is config.json with `max_position_embeddings` lowered to a
    sliding window the family's builder cannot apply (model_layout), so every length rule keeps within it,
    and `tie_word_embeddings` as transformers reads it where config.json omits it (Gemma's: tied), so every size
    rule counts the embedding once or twice as the model has it.
    """
    path = Path(path).resolve()
    config_path = path / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"model directory {path} has no config.json: is it an HF-layout model folder?")
    try:
        hf_config = json.loads(config_path.read_text())
    except ValueError as err:
        raise ConfigError(f"{config_path} is not valid JSON: {err}") from err
    if not isinstance(hf_config, dict):
        raise ConfigError(f"{config_path} is not a JSON object: is it an HF model config?")
    family = FAMILIES[detect_family(path, hf_config)]
    positions = builder_node(family, hf_config, config_file=str(config_path)).get("max_seq_len")
    if positions is not None and positions != hf_config.get("max_position_embeddings"):
        hf_config = {**hf_config, "max_position_embeddings": positions}
    if hf_config.get("tie_word_embeddings") is None:
        hf_config = {**hf_config, "tie_word_embeddings": model_layout.ties_embeddings(hf_config)}
    checkpoint_files = find_weights(path) if weights_required else []
    model = ModelDir(path, family, hf_config, checkpoint_files=checkpoint_files)
    for arg, relative in family.tokenizer_files.items():
        if not (path / relative).is_file():
            refused = tokenizer_files.derivation_refused(path, _tokenizer_file_names(family))
            if refused is not None:
                raise ConfigError(_missing_tokenizer_file(path, family, relative, refused))
        model.tokenizer_paths[arg] = str(path / relative)
    if (path / "tokenizer.json").is_file():
        model.special_tokens_path = str(path / "tokenizer.json")
    return model


def derive_missing_tokenizer_files(path: Path) -> list[str]:
    """At model-initialize: write the family's tokenizer files the repo does not ship where its tokenizer.json
    holds them exactly (tokenizer_files); the names written. Anything else is left to the checks."""
    names = family_tokenizer_files(path)
    return [] if names is None else tokenizer_files.derive_tokenizer_files(path, names)


def family_tokenizer_files(path: Path) -> tuple[str, ...] | None:
    """The tokenizer files of the family a model folder is read as; None where its config.json names none (refused
    later, with its message)."""
    try:
        family = FAMILIES[detect_family(path, json.loads((path / "config.json").read_text()))]
    except (OSError, ValueError):  # ConfigError included
        return None
    return _tokenizer_file_names(family)


def _tokenizer_file_names(family: Family) -> tuple[str, ...]:
    return tuple(family.tokenizer_files.values())


def _missing_tokenizer_file(path: Path, family: Family, relative: str, refused: str) -> str:
    """The real reason: the model ships no such file (model-initialize fetches every tokenizer file it has)."""
    needed = " + ".join(_tokenizer_file_names(family))
    message = (
        f"the model in {path} ships no {relative} ({_TOKENIZER_KINDS.get(relative, 'a tokenizer file')}), which "
        f"torchtune 0.6.1's {family.name} tokenizer ({family.tokenizer.rpartition('.')[2]}) needs ({needed})"
    )
    if (path / "tokenizer.json").is_file():
        message += f"; {refused}"
    return (
        f"{message}. If the model keeps its base model's vocabulary, add the base model's {needed} to the "
        "model's repo or folder; otherwise torchtune 0.6.1 cannot tokenize for it"
    )


def detect_family(path: Path, hf_config: dict) -> str:
    """The family serving config.json's model_type (and, within llama / mistral / phi3 / qwen2, the version)."""
    model_type = hf_config.get("model_type")
    if model_type == "llama":
        scaling = model_layout.rope_parameters(hf_config)[1]
        if model_layout.rope_type(hf_config) == "llama3":
            return "llama3_2" if float(scaling.get("factor", 8)) >= 16 else "llama3_1"
        if (path / "original" / "tokenizer.model").is_file() or hf_config.get("vocab_size", 0) >= 128000:
            return "llama3"
        if _smollm2(path, hf_config):
            return "smollm2"
        return "code_llama2" if hf_config.get("vocab_size") == 32016 else "llama2"
    if model_type == "mistral":
        return _mistral(path, hf_config)
    if model_type in ("gemma", "gemma2"):
        return model_type
    if model_type == "phi3":
        return (
            "phi4" if (path / "vocab.json").is_file() and not (path / "tokenizer.model").is_file() else "phi3"
        )
    if model_type == "qwen2":
        return "qwen2_5" if _added_tokens(path) - _QWEN2_ONLY_SPECIAL or not _added_tokens(path) else "qwen2"
    if model_type == "qwen3":
        return "qwen3"
    if model_type == "gemma3_text":
        return "gemma3"
    raise model_layout.refuse_model_type(model_type, str(path / "config.json"))


def _smollm2(path: Path, hf_config: dict) -> bool:
    """Llama layers with tied embeddings, plain RoPE (Llama 3.2 is told apart before, by its RoPE scaling) and
    neither a Meta tokenizer file nor a Meta vocabulary: Llama 2 and Code Llama (SentencePiece `tokenizer.model`,
    32000 / 32016 tokens) and Llama 3.x (`original/tokenizer.model`, 128256 tokens) untie them. A tokenizer.json
    with a 49152-token byte-level BPE, as SmolLM2's (and SmolLM's, its predecessor with the same layers)."""
    return (
        bool(hf_config.get("tie_word_embeddings"))
        and not (path / "tokenizer.model").is_file()
        and hf_config.get("vocab_size") not in _LLAMA2_VOCABULARIES
    )


def _mistral(path: Path, hf_config: dict) -> str:
    """Mistral 7B, or Mistral-Nemo where head_dim is not hidden_size / num_attention_heads (128 vs 5120 / 32). A
    model of that layout whose chat template writes Mistral's later [SYSTEM_PROMPT] turns (Mistral Small 3, the V7
    Tekken format) is refused: the mistral_nemo chat format would write its system prompts otherwise."""
    head_dim, heads, hidden = (hf_config.get(k) for k in ("head_dim", "num_attention_heads", "hidden_size"))
    if not (head_dim and heads and hidden) or head_dim * heads == hidden:
        return "mistral"
    if "[SYSTEM_PROMPT]" in _chat_template(path):
        raise ConfigError(
            f"the model in {path} has Mistral-Nemo's layout (head_dim {head_dim}, not hidden_size / "
            "num_attention_heads) but its chat template (tokenizer_config.json) writes [SYSTEM_PROMPT] turns, "
            "Mistral's V7 format (Mistral Small 3 and later), which this project's mistral_nemo tokenizer does not "
            "write; choose Mistral-Nemo (e.g. mistralai/Mistral-Nemo-Instruct-2407)"
        )
    return "mistral_nemo"


def _chat_template(path: Path) -> str:
    """The chat template text of tokenizer_config.json (every named template of a list), or ''."""
    try:
        template = json.loads((path / "tokenizer_config.json").read_text()).get("chat_template") or ""
    except (OSError, ValueError, AttributeError):
        return ""
    if isinstance(template, list):
        return "".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return str(template)


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


def tokenizer_fingerprint(model_dir: ModelDir) -> dict[str, str]:
    """sha256 of the files that define the tokenizer: equal fingerprints tokenize identically."""
    from kfp_finetune.components._shared.storage import hash_file

    files = {arg: Path(p) for arg, p in model_dir.tokenizer_paths.items()}
    if model_dir.special_tokens_path:
        files["special_tokens_path"] = Path(model_dir.special_tokens_path)
    return {
        "family_tokenizer": model_dir.family.tokenizer,
        **{arg: hash_file(p).sha256 for arg, p in sorted(files.items())},
    }
