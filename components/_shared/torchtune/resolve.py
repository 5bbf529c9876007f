"""Resolve one torchtune run into a single complete YAML, before anything runs.

Order of precedence: the base config from torchtune's registry (the recipe authors' tested hyperparameters),
then what the model directory dictates (model builder + dims, checkpointer, tokenizer), then the data, then the
user's typed fields, then the free `overrides`. Every output path is pinned inside the run directory. Resolving
imports no torch (the launcher step runs without it); torchtune's own config validation runs where training
runs (torch_checks.py). One file per run sidesteps the CLI-override traps of
`tune run` (values with `=`, `~key` on missing keys, nodes created without `_component_`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import yaml

from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune import (
    flex_attention,
    installed,
    overrides,
    recipes,
    resume,
    sample_packing,
)
from kfp_finetune.components._shared.torchtune.choices import user_set
from kfp_finetune.components._shared.torchtune.component_paths import check_components
from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.dataset_node import SOURCES, dataset_builder_node, source_of
from kfp_finetune.components._shared.torchtune.defaults import (
    Choice,
    TokenLengths,
    choose_defaults,
    no_packing_on_cuda,
)
from kfp_finetune.components._shared.torchtune.model_inspection import (
    ModelDir,
    inspect_model_dir,
)
from kfp_finetune.components._shared.torchtune.run_layout import RESOLVED_CONFIG

log = get_logger(__name__)

METRICS_DIR = "logs"
METRICS_FILE = "metrics.txt"
METRIC_LOGGER = "kfp_finetune.components.torchtune_finetune.metrics.TeeMetricLogger"

# What export publishes (components/export): merged weights, the PEFT adapter, or both.
EXPORT_FORMATS = ("merged", "adapter", "both")
ADAPTER_ONLY_REASON = (
    "no GPU idles while the merged model is written at each epoch end: export and evaluate merge the adapter "
    "into the base after training, on CPU"
)
# torchao NF4 quantizes in blocks of 64 values with scalers in blocks of 256 (DESIGN.md §5).
_NF4_MULTIPLE = 64 * 256


@dataclass
class ResolvedRun:
    recipe: str
    config_name: str | None
    config: dict
    yaml_path: Path
    run_dir: Path
    model: ModelDir
    distributed: bool
    defaults: list[Choice] = field(default_factory=list)  # what defaults.py chose, each with its reason
    token_lengths: TokenLengths | None = None  # the data's lengths the defaults were chosen from, when known
    world: int = 1  # devices x nodes
    # This wing's face.NAME: the TrainJob's node pod checks and runs the command with it.
    engine: ClassVar[str] = "torchtune"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_DIR / METRICS_FILE

    @property
    def model_path(self) -> Path:
        return self.model.path

    def command(self, torchrun_args: tuple[str, ...] | list[str] = ()) -> list[str]:
        """The training command (tune_command); torchrun flags make it distributed."""
        return tune_command(self.recipe, self.yaml_path, torchrun_args)


def tune_command(
    recipe: str, config_path: str | os.PathLike, torchrun_args: tuple[str, ...] | list[str] = ()
) -> list[str]:
    """`tune run [torchrun flags] <recipe> --config <file>`; no flags keeps a single-device recipe in-process. The
    four fine-tuning recipes run as our recipe module, which extends them with resume (resume.py)."""
    runs = resume.RECIPE_PATH if recipe in resume.RESUMABLE else recipe
    return ["tune", "run", *torchrun_args, runs, "--config", str(config_path)]


# --- assembling the config ---------------------------------------------------------------------------------


def resolve_run(
    cfg: TorchtuneConfig,
    model_dir: str | os.PathLike,
    data: str | os.PathLike | None,
    run_dir: str | os.PathLike,
    devices: int = 1,
    nodes: int = 1,
    write: bool = True,
    validate: bool = False,
    export_format: str = "",
    gpu_memory_gib: float | None = None,
    token_lengths: TokenLengths | None = None,
    tokenize_sample: bool = True,
    packs: Callable[[dict], object] | None = None,
    weights_required: bool = True,
) -> ResolvedRun:
    """Resolve, check and (by default) write `<run_dir>/torchtune_config.yaml`. Raises ConfigError on bad input.

    Imports no torch: everything that can be checked without it is checked here. `validate=True` adds the checks
    that need torch (torchtune's config validation, prompts against max_seq_len: torch_checks.py), which the
    backends otherwise run where training runs, first thing (entrypoint.py in a TrainJob).

    `export_format` (merged, adapter or both; empty: unknown) is how the model will be exported: the method
    must train what that needs (an adapter for adapter/both), or the run is refused. `gpu_memory_gib` (None: 80) and `token_lengths` (the
    data's, when dataset-initialize recorded them; None: a sample is tokenized, or with `tokenize_sample=False`
    estimated from characters without torch) feed the defaults (defaults.py). `weights_required=False` resolves
    from config.json and the tokenizer files alone (pre-flight, before any weights are fetched): the
    checkpointer then names no files."""
    cfg.check()
    if export_format and export_format not in EXPORT_FORMATS:
        raise SettingError(
            "export_format", f"must be one of {', '.join(EXPORT_FORMATS)} (got {export_format!r})"
        )
    if devices < 1 or nodes < 1:
        raise ConfigError(  # only the CLI can ask for none: the fine-tune step counts at least one
            f"devices and nodes must be at least 1 (got devices={devices}, nodes={nodes}): resolve-config's "
            "--devices / --nodes"
        )
    distributed = devices * nodes > 1
    if distributed and cfg.device == "cpu":
        raise ConfigError(
            "torchtune's distributed recipes cannot run on CPU: with tune_device=cpu set tune_gpus_per_node=0 (one "
            "process) and tune_num_nodes=1"
        )
    model = inspect_model_dir(model_dir, weights_required=weights_required)
    run_dir = Path(run_dir).resolve()
    recipe, config_name, config_file = recipes.select_recipe_and_config(cfg, model, devices, nodes)
    base = _load_config_file(config_file)

    config = copy.deepcopy(base)
    _apply_model(config, base, cfg, model)
    _apply_data(config, cfg, data)
    _apply_training(config, cfg, recipe)
    _apply_paths(config, run_dir)
    _apply_checkpoints(config, cfg, recipe)
    if config.get("device") == "cpu":
        _apply_cpu(config, recipe, dtype_chosen=cfg.dtype is not None)
    overrides.apply_overrides(config, cfg.overrides, config_name or str(config_file))
    _check_packing(config, model)
    choices, token_lengths = choose_defaults(
        config, base, cfg, model, devices, nodes, gpu_memory_gib, token_lengths, tokenize_sample,
        base_world=installed.written_world_size(Path(config_file)),
    )  # fmt: skip
    choices += _fit_checkpoint_to_export(config, cfg, export_format)
    config = _resolve_interpolations(config)
    check_components(config, cfg, config_name or str(config_file))
    if packs is not None:  # e.g. packs.use_packs: dataset-initialize's packs in place of torchtune's packing
        packs(config)
    choices += _own_fixes(config, cfg)
    _check_paths_inside(config, run_dir)
    if validate:  # torch's checks: where training runs (torch_checks.py); here only when asked
        from kfp_finetune.components._shared.torchtune.torch_checks import check_resolved

        check_resolved(config)

    yaml_path = run_dir / RESOLVED_CONFIG
    if write:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = yaml_path.with_name(f".{yaml_path.name}.tmp")
        tmp.write_text(render_yaml(config, recipe, config_name))
        os.replace(tmp, yaml_path)
    run = (recipe, config_name, config, yaml_path, run_dir, model, distributed)
    return ResolvedRun(*run, choices, token_lengths, world=devices * nodes)


def _own_fixes(config: dict, cfg: TorchtuneConfig) -> list[Choice]:
    """torchtune 0.6.1 bugs on the packed path, fixed by builders of ours the YAML names in place of torchtune's
    (after the components are checked and the packs chosen: both read torchtune's nodes). Packing by torchtune:
    no label crosses a sample boundary (sample_packing.py). Packed on CUDA: flex attention compiled as torchtune
    main compiles it (flex_attention.py), unless the user names the model builder."""
    config["dataset"] = sample_packing.wrap(config["dataset"])
    if (
        config.get("device") != "cuda"
        or not config["dataset"].get("packed")
        or user_set(cfg, None, "model._component_")
    ):
        return []
    config["model"] = flex_attention.wrap(config["model"])
    choice = Choice(flex_attention.SETTING, flex_attention.COMPILED, flex_attention.REASON)
    log.info("%s", choice.line())
    return [choice]


def _check_packing(config: dict, model: ModelDir) -> None:
    """A packed CUDA run of a family whose attention takes no block masks would fail at its first step, inside
    torchtune: refused now, before the defaults plan around it (they never pack it: defaults.py)."""
    why = no_packing_on_cuda(model.family)
    if why and config.get("device") == "cuda" and config["dataset"].get("packed"):
        raise SettingError(
            "packed",
            f"cannot be on for a {model.family.name} model on CUDA: {why}; set tune_packed=false and leave "
            "dataset.packed out of tune_overrides",
        )


def _load_config_file(path: Path) -> dict:
    """Load as torchtune does (OmegaConf): YAML 1.1 alone would read `3e-4` as a string."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}


def render_yaml(config: dict, recipe: str, config_name: str | None) -> str:
    header = (
        f"# Resolved by kfp-finetune for `tune run {recipe}`; base config: {config_name or 'user file'}\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def _apply_model(config: dict, base: dict, cfg: TorchtuneConfig, model: ModelDir) -> None:
    lora = None
    if cfg.is_peft:
        base_model = base.get("model") or {}
        lora = {
            key: base_model.get(key) for key in model.lora_args() if key.startswith(("lora_", "apply_lora"))
        }
        lora.update({k: v for k, v in vars(cfg.lora).items() if v is not None})
        lora["quantize_base"] = cfg.method == "qlora" or bool(lora.get("quantize_base"))
        lora["use_dora"] = cfg.method == "dora" or bool(lora.get("use_dora"))
        if not lora.get("lora_attn_modules"):
            lora["lora_attn_modules"] = ["q_proj", "v_proj", "output_proj"]
        if lora.get("apply_lora_to_output") and model.hf_config.get("tie_word_embeddings"):
            raise SettingError(
                "apply_lora_to_output",
                "is not possible: this model ties its output projection to the embeddings (tie_word_embeddings); "
                "leave it unset or false",
            )
        if lora["quantize_base"]:
            _check_qlora_dims(model, lora)
    config["model"] = model.model_node(lora)
    max_seq_len = cfg.max_seq_len or (base.get("tokenizer") or {}).get("max_seq_len")
    config["tokenizer"] = model.tokenizer_node(max_seq_len)
    config["checkpointer"] = model.checkpointer_node(output_dir="${output_dir}")
    config["resume_from_checkpoint"] = False


def _check_qlora_dims(model: ModelDir, lora: dict) -> None:
    c = model.hf_config
    dim = c["hidden_size"]
    head_dim = c.get("head_dim") or dim // c["num_attention_heads"]
    kv = (c.get("num_key_value_heads") or c["num_attention_heads"]) * head_dim
    q = c["num_attention_heads"] * head_dim
    sizes = {"q_proj": dim * q, "k_proj": dim * kv, "v_proj": dim * kv, "output_proj": q * dim}
    targets = {m: sizes[m] for m in lora["lora_attn_modules"]}
    if lora.get("apply_lora_to_mlp"):
        targets["mlp"] = dim * c["intermediate_size"]
    bad = {name: numel for name, numel in targets.items() if numel % _NF4_MULTIPLE}
    if bad:
        detail = ", ".join(f"{name} has {numel} weights" for name, numel in bad.items())
        raise SettingError(
            "method",
            f"qlora: QLoRA cannot quantize this model: {detail}, not a multiple of {_NF4_MULTIPLE} (NF4 blocks of "
            "64 with scaler blocks of 256). Use tune_method=lora, or a model with hidden size >= 256.",
        )


def data_source(data: str | os.PathLike) -> tuple[str, list[str]]:
    """(datasets builder, data files) for a data file or a directory of data files."""
    path = Path(data)
    if path.is_file():
        return source_of(path), [str(path.resolve())]
    if path.is_dir():
        for suffix, builder in SOURCES.items():
            files = sorted(p for p in path.rglob(f"*{suffix}") if p.is_file() and p.name != "manifest.json")
            train = [p for p in files if p.name.startswith("train") or p.parent.name == "train"]
            if files:
                return builder, [str(p.resolve()) for p in (train or files)]
        raise ConfigError(f"data directory {path} holds no {', '.join(SOURCES)} files")
    raise ConfigError(f"data {str(data)!r} does not exist: pass a data file or a directory of data files")


def _apply_data(config: dict, cfg: TorchtuneConfig, data: str | os.PathLike | None) -> None:
    settings = cfg.dataset
    if settings.source:
        source, files = settings.source, settings.data_files
    elif data is not None:
        source, files = data_source(data)
    else:
        raise ConfigError(
            "no training data: pass data (a file or folder) or dataset.source (e.g. an HF dataset)"
        )
    node = dataset_builder_node(
        settings.dataset_type,
        source=source,
        data_files=files or (),
        data_style=settings.data_style or "",
        split=settings.split,
        text_column=settings.text_column or "",
        conversation_column=settings.conversation_column or "",
        conversation_style=settings.conversation_style or "",
        column_map=settings.column_map,
        train_on_input=bool(settings.train_on_input),
        new_system_prompt=settings.new_system_prompt,
        packed=bool(cfg.packed),
    )
    if cfg.packed and not config["tokenizer"].get("max_seq_len"):
        raise SettingError(
            "packed", "needs a sequence length (the length packs are filled to): set tune_max_seq_len too"
        )
    config["dataset"] = node


def _apply_training(config: dict, cfg: TorchtuneConfig, recipe: str) -> None:
    for key in (
        "device", "dtype", "batch_size", "epochs", "gradient_accumulation_steps", "max_steps_per_epoch",
        "compile", "seed", "log_every_n_steps", "enable_activation_checkpointing", "enable_activation_offloading",
    ):  # fmt: skip
        value = getattr(cfg, key)
        if value is not None:
            config[key] = value
    if cfg.save_adapter_weights_only is not None:
        if not cfg.is_peft:
            raise SettingError(
                "save_adapter_weights_only", "applies to lora/qlora/dora, not to tune_method=full"
            )
        config["save_adapter_weights_only"] = cfg.save_adapter_weights_only
    if cfg.loss:
        config["loss"] = {"_component_": cfg.loss}
    optimizer = config.setdefault("optimizer", {"_component_": "torch.optim.AdamW"})
    if cfg.optimizer and cfg.optimizer != optimizer.get("_component_"):
        # A different optimizer keeps only the settings every torch optimizer shares.
        config["optimizer"] = optimizer = {
            "_component_": cfg.optimizer,
            **{k: v for k, v in optimizer.items() if k in ("lr", "weight_decay")},
        }
    for key, value in (
        ("lr", cfg.learning_rate),
        ("weight_decay", cfg.weight_decay),
        ("fused", cfg.optimizer_fused),
    ):
        if value is not None:
            optimizer[key] = value
    if cfg.lr_scheduler or cfg.num_warmup_steps is not None:
        scheduler = config.setdefault(
            "lr_scheduler",
            {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup"},
        )
        if cfg.lr_scheduler:
            scheduler["_component_"] = cfg.lr_scheduler
        if cfg.num_warmup_steps is not None:
            scheduler["num_warmup_steps"] = cfg.num_warmup_steps


def _apply_paths(config: dict, run_dir: Path) -> None:
    config["output_dir"] = str(run_dir)
    config["checkpointer"]["output_dir"] = str(run_dir)
    config["metric_logger"] = {
        "_component_": METRIC_LOGGER,
        "log_dir": str(run_dir / METRICS_DIR),
        "filename": METRICS_FILE,
    }
    if isinstance(config.get("profiler"), dict):
        config["profiler"]["output_dir"] = str(run_dir / "profiling")


def _apply_checkpoints(config: dict, cfg: TorchtuneConfig, recipe: str) -> None:
    """The recipe module's block (resume.CheckpointSettings): which torchtune recipe it extends, and when it saves."""
    if recipe not in resume.RESUMABLE:
        if cfg.resume or cfg.checkpoint_every_steps or cfg.checkpoint_every_minutes:
            log.info(
                "recipe %s checkpoints only at epoch ends: resume and its intervals do not apply", recipe
            )
        return
    every_minutes = (
        resume.DEFAULT_EVERY_MINUTES if cfg.checkpoint_every_minutes is None else cfg.checkpoint_every_minutes
    )
    settings = resume.CheckpointSettings(
        recipe=recipe,
        resume=cfg.resume is not False,
        every_steps=cfg.checkpoint_every_steps or 0,
        every_minutes=float(every_minutes),
    )
    config[resume.CONFIG_KEY] = settings.as_config()


def _apply_cpu(config: dict, recipe: str, dtype_chosen: bool) -> None:
    """torchtune defaults assume CUDA; these keep a CPU run working (DESIGN.md §5)."""
    if not dtype_chosen:
        config["dtype"] = "fp32"
    config["log_peak_memory_stats"] = False
    config["enable_activation_offloading"] = False
    if recipe.startswith("full_") and "bitsandbytes" in str(
        config.get("optimizer", {}).get("_component_", "")
    ):
        config["optimizer"] = {
            "_component_": "torch.optim.AdamW",
            **{k: v for k, v in config["optimizer"].items() if k in ("lr", "weight_decay")},
        }
    if "optimizer_in_bwd" in config:
        config["optimizer_in_bwd"] = False


def _fit_checkpoint_to_export(config: dict, cfg: TorchtuneConfig, export_format: str) -> list[Choice]:
    """Checkpoints the export can publish, found out now, not after training, evaluation and the gate; and an
    adapter method saves only its adapter unless the user says otherwise: torchtune's per-epoch merge keeps every
    GPU idle while rank 0 merges and writes the whole model, and export / evaluate merge it later, off the GPUs
    (_shared/torchtune/merge.py)."""
    if export_format in ("adapter", "both") and not cfg.is_peft:
        raise SettingError(
            "export_format",
            f"{export_format} needs a LoRA adapter, but tune_method=full trains none: set export_format=merged, or "
            "tune_method=lora/qlora/dora",
        )
    if not cfg.is_peft or user_set(cfg, "save_adapter_weights_only", "save_adapter_weights_only"):
        return []
    config["save_adapter_weights_only"] = True
    choice = Choice("save_adapter_weights_only", True, ADAPTER_ONLY_REASON)
    log.info("%s", choice.line())
    return [choice]


def _resolve_interpolations(config: dict) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.create(config), resolve=True)


def _check_paths_inside(config: dict, run_dir: Path) -> None:
    outputs = {
        "output_dir": config.get("output_dir"),
        "checkpointer.output_dir": config.get("checkpointer", {}).get("output_dir"),
        "metric_logger.log_dir": config.get("metric_logger", {}).get("log_dir"),
        "profiler.output_dir": (config.get("profiler") or {}).get("output_dir"),
    }
    for key, value in outputs.items():
        if value is not None and not Path(value).resolve().is_relative_to(run_dir):
            raise ConfigError(
                f"{key}={value} is outside the run directory {run_dir}; outputs must stay inside it"
            )
