"""Logit parity between transformers and torchtune for one model layout, measured on a tiny random model.

`measure(hf_config, family)` builds, with transformers, a tiny random model that keeps every config.json field
that changes the math (`tiny_config`: only sizes shrink), saves it as an HF folder, converts it the way a run
does (inspect_model_dir → the family's builder node → the project's checkpointer → a strict load) and compares
fp32 logits, in every direction a run's weights travel:

- load: transformers' logits of the HF folder vs torchtune's of the model the checkpointer loaded;
- save: a torchtune model (weights drawn again) saved by the checkpointer, loaded by transformers;
- lora merged / dora merged: the family's LoRA model (DoRA: `use_dora`) with random non-zero adapters (and DoRA
  magnitudes), merged as the recipes merge (`get_merged_lora_ckpt`) and saved, loaded by transformers;
- lora peft / dora peft: the adapter the checkpointer writes in PEFT's format, loaded with peft onto the HF base.

TOLERANCE: the largest max |Δlogit| a direction may show. Two fp32 computations of the same model that add in
another order (RoPE tables, attention, norms; a merged weight W + s·BA rounded once instead of two products) differ
by a few ulps of the logits, which reach ~10 on these tiny models. Over every case of parity_cases with seeds 0-3
(544 measurements, transformers 5.24 and 4.57 alike) the correct conversions measured: load, save and PEFT at most
4.8e-6 (median 3e-6); merged LoRA / DoRA at most 1.2e-5 (median 5e-6). 2e-5 keeps those with a margin, while
every fault the project corrects measures 4.5e-2 to 2.5 (test_parity.py): three orders of magnitude above it.

torch, torchtune and transformers (peft for the adapter directions) are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune.conversions import conversion
from kfp_finetune.components._shared.torchtune.model_inspection import (
    FAMILIES,
    Family,
    inspect_model_dir,
    instantiate,
)

TOLERANCE = 2e-5
LOAD, SAVE = "load", "save"
LORA_MERGED, LORA_PEFT, DORA_MERGED, DORA_PEFT = "lora merged", "lora peft", "dora merged", "dora peft"
DIRECTIONS = (LOAD, SAVE, LORA_MERGED, LORA_PEFT, DORA_MERGED, DORA_PEFT)
# What a run of each method writes: the directions its weights travel (QLoRA's are LoRA's: its NF4 base is not
# meant to be bit-exact, the mapping around it is the same).
METHOD_DIRECTIONS = {
    "full": (LOAD, SAVE),
    "lora": (LOAD, LORA_MERGED, LORA_PEFT),
    "dora": (LOAD, DORA_MERGED, DORA_PEFT),
}

# The tiny model: sizes only (tiny_config keeps every other field).
SEQ_LEN = 48  # tokens compared (one sequence): three tiny sliding windows
_POSITIONS = 64
_WINDOW = 16
_HEAD_DIM = 16
_LAYERS = 2  # an alternating layout (Gemma 2: sliding, global) shows both kinds
_VOCAB = 128
LORA = {
    "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
    "apply_lora_to_mlp": True,
    "lora_rank": 4,
    "lora_alpha": 8.0,
    "lora_dropout": 0.0,
}
# B A scaled well below the base weights (as a trained adapter is): fp32 rounding grows with the activations, and
# a wrongly ordered or scaled adapter still moves the logits by 1e-2 and more.
_LORA_B_SCALE = 0.1
# Fields a tiny copy must not keep: ids outside the tiny vocabulary, the checkpoint's dtype, remote code.
_DROPPED = ("torch_dtype", "dtype", "auto_map", "_name_or_path", "transformers_version")
_NO_TOKEN_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
# Their RMSNorm scales by 1 + weight: a non-trivial scale is drawn around 0.
_OFFSET_NORMS = ("gemma", "gemma2", "gemma3_text")
_CHECKPOINTER_LOG = "kfp_finetune.components._shared.torchtune.checkpointer"


@dataclass
class Measurement:
    direction: str
    difference: float | None = None  # max |Δlogit|; None: not measured
    skipped: str = ""  # why not

    @property
    def passed(self) -> bool:
        return self.difference is None or self.difference <= TOLERANCE

    def line(self) -> str:
        if self.difference is None:
            return f"{self.direction}: not measured ({self.skipped})"
        verdict = "ok" if self.passed else f"FAILS (tolerance {TOLERANCE:.0e})"
        return f"{self.direction}: max |Δlogit| {self.difference:.1e} {verdict}"


@dataclass
class Parity:
    family: str
    config: dict  # the tiny config.json measured
    seq_len: int
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(m.passed for m in self.measurements)

    def failed(self) -> list[Measurement]:
        return [m for m in self.measurements if not m.passed]


def missing_libraries(directions: Iterable[str] = DIRECTIONS) -> list[str]:
    """The libraries the measurement needs that are not installed (peft: for the adapter directions only)."""
    needed = ["torch", "torchtune", "transformers"]
    if any(d in (LORA_PEFT, DORA_PEFT) for d in directions):
        needed.append("peft")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def tiny_config(hf_config: dict) -> dict:
    """config.json with its sizes shrunk (hidden size, layers, heads keeping the grouped-query ratio, MLP width,
    vocabulary, positions, sliding window) and every other field kept, relations included: head_dim against
    hidden_size / num_attention_heads, the window against max_position_embeddings, the layer pattern."""
    from kfp_finetune.components._shared.torchtune.model_layout import (
        LAYOUT_FIELDS,
        layer_types,
        layout_value,
    )

    config = {key: value for key, value in hf_config.items() if key not in _DROPPED}
    heads = hf_config["num_attention_heads"]
    kv_heads = hf_config.get("num_key_value_heads") or heads
    tiny_kv = 4 if kv_heads == heads else min(kv_heads, 2)
    tiny_heads = tiny_kv * (heads // kv_heads)
    head_dim = hf_config.get("head_dim")
    natural = hf_config["hidden_size"] // heads  # what a builder without head_dim computes
    if head_dim is None or head_dim == natural:
        hidden = tiny_heads * _HEAD_DIM
    else:  # keep hidden_size / num_attention_heads on the same side of head_dim
        hidden = tiny_heads * (_HEAD_DIM + (8 if natural > head_dim else -8))
    kinds = layer_types(hf_config)  # Gemma 3's from its sliding_window_pattern where config.json lists none
    layers = min(hf_config["num_hidden_layers"], max(_LAYERS, _period(kinds or [])))
    config.update(
        _NO_TOKEN_IDS,
        vocab_size=_VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=tiny_heads,
        num_key_value_heads=tiny_kv,
        max_position_embeddings=_POSITIONS,
    )
    if head_dim is not None:
        config["head_dim"] = _HEAD_DIM
    if kinds:
        config["layer_types"] = kinds[:layers]
    if "max_window_layers" in hf_config:  # Qwen2: the layers from which a window applies
        slides_nowhere = hf_config["max_window_layers"] >= hf_config["num_hidden_layers"]
        config["max_window_layers"] = (
            layers if slides_nowhere else min(hf_config["max_window_layers"], layers - 1)
        )
    window = layout_value(next(f for f in LAYOUT_FIELDS if f.key == "sliding_window"), hf_config)
    if window is not None:
        positions = hf_config.get("max_position_embeddings")
        config["sliding_window"] = _WINDOW if positions is None or window < positions else _POSITIONS
    return config


def _period(layer_types: list) -> int:
    """The shortest repeating unit of a per-layer pattern (1 for none)."""
    for period in range(1, len(layer_types) + 1):
        if all(layer_types[i] == layer_types[i % period] for i in range(len(layer_types))):
            return period
    return 1


def measure(hf_config: dict, family: str, directions: Iterable[str] = DIRECTIONS, seed: int = 0) -> Parity:
    """Measure each direction for the architecture of `hf_config` (a config.json of any size) as `family`.

    Raises ConfigError when the family's builder refuses the layout (model_layout), as a run would."""
    import torch

    from kfp_finetune.components._shared.torchtune.model_inspection import builder_node

    expected = FAMILIES[family]
    builder_node(expected, hf_config)  # refused here, before anything is built
    directions = tuple(directions)
    config = tiny_config(hf_config)
    with _quiet(), tempfile.TemporaryDirectory(prefix="kfp-finetune-parity-") as scratch:
        hf_dir, out_dir = Path(scratch) / "hf", Path(scratch) / "out"
        _save_hf_model(config, expected, hf_dir, seed)
        model_dir = inspect_model_dir(hf_dir)
        # Families told apart by their tokenizer files (qwen2 / qwen2_5) read alike: the family measured is `family`.
        if model_dir.family.model_type != expected.model_type:
            raise ValueError(f"the tiny copy of a {family} layout was read as {model_dir.family.name}")
        model_dir = replace(model_dir, family=expected)
        seq_len = min(
            SEQ_LEN, model_dir.hf_config["max_position_embeddings"]
        )  # a window made a position limit
        tokens = torch.randint(0, _VOCAB, (1, seq_len), generator=torch.Generator().manual_seed(seed + 3))
        run = _Run(model_dir, out_dir, tokens, config["model_type"], seed)
        parity = Parity(family, config, seq_len)
        for direction in DIRECTIONS:
            if direction in directions:
                parity.measurements.append(run.measure(direction))
    return parity


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars or warnings from transformers (a tiny model's sizes trip its checks, e.g. Llama 3's
    original_max_position_embeddings above 64 positions), no shard-saved lines from the checkpointer: the
    measurement's own lines are what a log needs."""
    from transformers.utils import logging as transformers_logging

    saves = logging.getLogger(_CHECKPOINTER_LOG)
    levels = transformers_logging.get_verbosity(), saves.level
    progress_bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    saves.setLevel(logging.WARNING)
    try:
        yield
    finally:
        transformers_logging.set_verbosity(levels[0])
        saves.setLevel(levels[1])
        if progress_bars:
            transformers_logging.enable_progress_bar()


def _save_hf_model(config: dict, family: Family, folder: Path, seed: int) -> None:
    """The tiny model, random, as an HF folder (safetensors + config.json), with the family's tokenizer file
    names present (empty: nothing here tokenizes) so that the folder is read as a run reads it."""
    model = _hf_model_from_config(config)
    _randomize(model.named_parameters(), seed, config["model_type"])
    model.save_pretrained(folder)
    for relative in family.tokenizer_files.values():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(b"")


def _hf_model_from_config(config: dict) -> Any:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    config = dict(config)
    if int(transformers.__version__.split(".")[0]) < 5:
        if isinstance((config.get("rope_parameters") or {}).get("full_attention"), dict):
            # Gemma 3 saved by transformers 5 (one RoPE dict per layer type): transformers 4's three settings.
            per_layer_type = config.pop("rope_parameters")
            rope = dict(per_layer_type["full_attention"])
            config["rope_theta"] = rope.pop("rope_theta")
            config["rope_local_base_freq"] = per_layer_type["sliding_attention"]["rope_theta"]
            config["rope_scaling"] = rope if rope.get("rope_type", "default") != "default" else None
        if "rope_parameters" in config:  # a transformers 5 config.json: its RoPE settings where 4 reads them
            rope = dict(config.pop("rope_parameters"))
            config["rope_theta"] = rope.pop("rope_theta", config.get("rope_theta", 10000.0))
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                config["rope_scaling"] = rope
        if config["model_type"] == "gemma" and config.get("hidden_act") == "gelu":
            # Gemma's legacy name for the tanh GELU it was trained with: transformers 5 (GemmaConfig) reads it so,
            # transformers 4 computes the exact GELU for it.
            config["hidden_act"] = "gelu_pytorch_tanh"
    model_type = config.pop("model_type")
    hf_config = AutoConfig.for_model(model_type, **config)
    return AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager").float().eval()


def _load_hf_model(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").float().eval()


def _randomize(named_parameters: Iterable[tuple[str, Any]], seed: int, model_type: str) -> None:
    """Weights from one seeded generator: matrices N(0, 1/fan_in), norm scales 1 + N(0, 0.2²) (non-trivial, so a
    norm loaded into another's place shows), biases N(0, 0.1²)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    norm_centre = 0.0 if model_type in _OFFSET_NORMS else 1.0
    with torch.no_grad():
        for name, parameter in sorted(named_parameters):
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.ndim > 1:
                parameter.copy_(noise / parameter.shape[-1] ** 0.5)
            elif name.endswith("bias"):
                parameter.copy_(0.1 * noise)
            else:
                parameter.copy_(norm_centre + 0.2 * noise)


class _Run:
    """One tiny model folder, converted once; each direction measured against it."""

    def __init__(self, model_dir, out_dir: Path, tokens, model_type: str, seed: int) -> None:
        import torch
        from omegaconf import OmegaConf
        from torchtune import config, training

        self.model_dir, self.out_dir, self.tokens, self.model_type, self.seed = (
            model_dir, out_dir, tokens, model_type, seed,
        )  # fmt: skip
        self.checkpointer = config.instantiate(OmegaConf.create(model_dir.checkpointer_node(str(out_dir))))
        self.base_state_dict = self.checkpointer.load_checkpoint()[training.MODEL_KEY]
        self._epoch = 0
        self._torch = torch

    def measure(self, direction: str) -> Measurement:
        if direction == LOAD:
            return Measurement(direction, self._load())
        if direction == SAVE:
            return Measurement(direction, self._save())
        dora = direction.startswith("dora")
        try:
            lora_model = self._lora_model(dora)
        except ConfigError as error:  # the family's LoRA builder refuses this layout, as a run would
            refusal = str(error).replace(str(self.model_dir.path / "config.json"), "config.json")
            return Measurement(direction, skipped=f"refused: {refusal}")
        if direction in (LORA_MERGED, DORA_MERGED):
            return Measurement(direction, self._merged(lora_model))
        if not conversion(self.model_dir.family.model_type).peft_adapter:
            return Measurement(
                direction, skipped=f"the {self.model_dir.family.model_type} layout has no PEFT format"
            )
        if missing_libraries([direction]):
            return Measurement(direction, skipped="peft is not installed")
        return Measurement(direction, self._peft(lora_model))

    # --- the directions ---------------------------------------------------------------------------------------

    def _load(self) -> float:
        model = self._build(self.model_dir.model_node())
        model.load_state_dict(self.base_state_dict, strict=True)
        return self._difference(_load_hf_model(self.model_dir.path), model)

    def _save(self) -> float:
        from torchtune import training

        model = self._build(self.model_dir.model_node())
        _randomize(model.named_parameters(), self.seed + 1, self.model_type)
        folder = self._checkpoint({training.MODEL_KEY: model.state_dict()})
        return self._difference(_load_hf_model(folder), model)

    def _merged(self, lora_model) -> float:
        from torchtune import training
        from torchtune.modules.peft import get_merged_lora_ckpt

        state_dict = {key: value.clone() for key, value in lora_model.state_dict().items()}
        merged = get_merged_lora_ckpt(state_dict, rank=LORA["lora_rank"], alpha=LORA["lora_alpha"])
        folder = self._checkpoint({training.MODEL_KEY: merged})
        return self._difference(_load_hf_model(folder), lora_model)

    def _peft(self, lora_model) -> float:
        from peft import PeftModel
        from torchtune import training
        from torchtune.modules.peft import get_adapter_state_dict, get_lora_module_names

        # What the LoRA recipes hand the checkpointer (lora_finetune_single_device.save_checkpoint).
        adapter_config = {
            "r": LORA["lora_rank"],
            "lora_alpha": LORA["lora_alpha"],
            "target_modules": get_lora_module_names(
                LORA["lora_attn_modules"], LORA["apply_lora_to_mlp"], self.lora["apply_lora_to_output"]
            ),
            "peft_type": "LORA",
        }
        adapter = get_adapter_state_dict(lora_model.state_dict())
        folder = self._checkpoint(
            {training.ADAPTER_KEY: adapter, training.ADAPTER_CONFIG: adapter_config}, adapter_only=True
        )
        with_adapter = PeftModel.from_pretrained(_load_hf_model(self.model_dir.path), folder).eval()
        return self._difference(with_adapter, lora_model)

    # --- helpers ----------------------------------------------------------------------------------------------

    def _build(self, node: dict):
        from omegaconf import OmegaConf
        from torchtune import config, training

        with training.set_default_dtype(self._torch.float32):
            return config.instantiate(OmegaConf.create(node)).eval()

    @functools.cached_property
    def lora(self) -> dict:
        """LORA, with the output projection adapted too where the model has its own and the family's LoRA
        builder takes it (torchtune's lora_llama3_2 refuses it whatever tie_word_embeddings says)."""
        settings = {**LORA, "apply_lora_to_output": False}
        family, config = self.model_dir.family, self.model_dir.hf_config
        if family.ties_embeddings or config.get("tie_word_embeddings"):
            return settings
        if "apply_lora_to_output" not in self.model_dir.lora_args():
            return settings
        with_output = {**settings, "apply_lora_to_output": True}
        try:
            with self._torch.device("meta"):
                instantiate(self.model_dir.model_node(lora=with_output))
        except ValueError:
            return settings
        return with_output

    def _lora_model(self, dora: bool):
        model = self._build(self.model_dir.model_node(lora={**self.lora, "use_dora": dora}))
        missing, unexpected = model.load_state_dict(self.base_state_dict, strict=False)
        adapter_names = {name for name, _ in model.named_parameters() if _is_adapter(name)}
        if unexpected or set(missing) != adapter_names:
            raise ValueError(
                f"the LoRA model's base weights do not match: {sorted(set(missing) ^ adapter_names)}"
            )
        torch = self._torch
        generator = torch.Generator().manual_seed(self.seed + 2)
        with torch.no_grad():
            for name, parameter in sorted(model.named_parameters()):
                if name.endswith(("lora_a.weight", "lora_b.weight")):
                    scale = _LORA_B_SCALE if name.endswith("lora_b.weight") else 1.0
                    parameter.copy_(
                        scale * torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5
                    )
            for module in model.modules():
                if dora and hasattr(
                    module, "initialize_dora_magnitude"
                ):  # from the adapted weights, as trained
                    module.initialize_dora_magnitude()
                    module.magnitude.mul_(1 + 0.2 * torch.randn(module.magnitude.shape, generator=generator))
        return model

    def _checkpoint(self, state_dict: dict, adapter_only: bool = False) -> Path:
        """Saved by the checkpointer as a run saves an epoch; the epoch folder."""
        self._epoch += 1
        self.checkpointer.save_checkpoint(state_dict, epoch=self._epoch, adapter_only=adapter_only)
        return self.out_dir / f"epoch_{self._epoch}"

    def _difference(self, hf_model, tune_model) -> float:
        with self._torch.no_grad():
            expected = tune_model(self.tokens)
            actual = hf_model(self.tokens).logits
        return (actual - expected).abs().max().item()


def _is_adapter(name: str) -> bool:
    return name.endswith(("lora_a.weight", "lora_b.weight", "magnitude"))
