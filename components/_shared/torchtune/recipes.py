"""Which torchtune recipe and which of its registry configs a run starts from.

Explicit choices (`tune_recipe`, `tune_config`) are checked against torchtune 0.6.1's registry; otherwise the
recipe follows the method and the device count, and the config is the family's of the nearest size. Read from
torchtune's files (installed.py), without torch: the launcher step has none.
"""

from __future__ import annotations

import math
from pathlib import Path

from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.torchtune import installed
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.model_inspection import ModelDir, size_in_parameters

FINETUNE_RECIPES = {
    ("full", False): "full_finetune_single_device",
    ("full", True): "full_finetune_distributed",
    ("lora", False): "lora_finetune_single_device",
    ("lora", True): "lora_finetune_distributed",
}
# Config-name variants, best first, by method (e.g. "1B_qlora_single_device" → variant "qlora").
VARIANTS = {
    "full": ("full", "full_low_memory", "full_multinode"),
    "lora": ("lora",),
    "qlora": ("qlora", "lora"),
    "dora": ("dora", "lora", "qdora"),
}


def config_parts(config_name: str) -> tuple[str, str, str]:
    """'llama3_2/1B_lora_single_device' → ('llama3_2', '1B', 'lora')."""
    family, _, rest = config_name.partition("/")
    size, _, variant = rest.partition("_")
    return family, size, variant.removesuffix("_single_device")


def recipe_method_matches(recipe: str, method: str) -> bool:
    return ("lora" in recipe) == (method != "full")


def select_recipe_and_config(
    cfg: TorchtuneConfig, model: ModelDir, devices: int, nodes: int
) -> tuple[str, str | None, Path]:
    """(recipe, registry config name or None, config file) — explicit choices win, else auto-selection."""
    registry = installed.recipes()  # read from torchtune's files: no torch
    distributed = devices * nodes > 1
    recipe = cfg.recipe or FINETUNE_RECIPES[("full" if cfg.method == "full" else "lora", distributed)]
    if recipe not in registry:
        finetune = sorted(name for name in registry if "finetune" in name)
        raise SettingError(
            "recipe", f"{recipe!r} is unknown; torchtune 0.6.1 fine-tuning recipes: {', '.join(finetune)}"
        )
    if "finetune" not in recipe and "qat" not in recipe and "distillation" not in recipe:
        raise SettingError("recipe", f"{recipe!r} does not fine-tune a model; choose a *_finetune_* recipe")
    if not recipe_method_matches(recipe, cfg.method):
        raise SettingError(
            "recipe",
            f"{recipe!r} does not match tune_method={cfg.method!r}: "
            + (
                "use a lora_* recipe for lora/qlora/dora"
                if cfg.method != "full"
                else "use a full_* recipe for full"
            ),
        )
    if distributed and not registry[recipe].supports_distributed:
        raise SettingError(
            "recipe",
            f"{recipe!r} runs on one device but {nodes} node(s) x {devices} device(s) were requested; "
            "use its *_distributed counterpart, or set tune_gpus_per_node=1 and tune_num_nodes=1",
        )
    configs = {c.name: c.file_path for c in registry[recipe].configs}

    if cfg.config:
        if cfg.config in configs:
            return recipe, cfg.config, installed.config_file(configs[cfg.config])
        path = Path(cfg.config)
        if path.suffix in (".yaml", ".yml") and path.is_file():
            return recipe, None, path.resolve()
        all_configs = {c.name for r in registry.values() for c in r.configs}
        if cfg.config in all_configs:
            raise SettingError("config", f"{cfg.config!r} belongs to another recipe than {recipe!r}")
        raise SettingError(
            "config",
            f"{cfg.config!r} is unknown for recipe {recipe!r}: give a registry name "
            f"(`tune ls`, e.g. {next(iter(sorted(configs)), 'none')}) or a path to a .yaml file",
        )
    name = nearest_config(list(configs), model, cfg.method)
    return recipe, name, installed.config_file(configs[name])


def nearest_config(config_names: list[str], model: ModelDir, method: str) -> str:
    """The family's config (any family's if it has none for this recipe) of the nearest size, and of that size the
    best variant. Size before variant: an 8B QLoRA run on 8 GPUs must get the 8B LoRA config, not the family's
    only QLoRA config (405B, with adapter-only checkpoints and 405B-sized settings). A family torchtune 0.6.1 does
    not have takes the configs of the family it names (`Family.configs_from`: Qwen3 takes Qwen2.5's)."""
    preferences = VARIANTS[method]
    scored = []
    for name in config_names:
        family, size, variant = config_parts(name)
        params = size_in_parameters(size)
        if params is None or variant not in preferences:
            continue
        other_family = family != model.family.config_family
        distance = abs(math.log(params) - math.log(max(model.num_parameters, 1)))
        scored.append((other_family, distance, preferences.index(variant), name))
    if not scored:
        raise ConfigError(f"no torchtune config fits tune_method={method!r}; set tune_config explicitly")
    return min(scored)[-1]
