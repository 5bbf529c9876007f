"""`kfp-finetune resolve-config`: show the engine a run would use and why, and its complete settings — torchtune's
recipe and YAML, or the transformers engine's settings file — running nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", required=True, help="HF-layout model folder")
    parser.add_argument(
        "--data", help="training data: a json/jsonl/csv/parquet/arrow file or a folder of them"
    )
    parser.add_argument(
        "--engine",
        default="auto",
        help="auto (the first engine that serves the model), torchtune or transformers",
    )
    parser.add_argument("--method", default="lora", choices=["full", "lora", "qlora", "dora"])
    parser.add_argument("--devices", type=int, default=1, help="processes (GPUs) per node")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--recipe", help="torchtune recipe (default: chosen from method and devices)")
    parser.add_argument(
        "--config", help="torchtune config name or YAML file (default: nearest for the model)"
    )
    parser.add_argument("--device", help="cuda, cpu, ... (default: the base config's)")
    parser.add_argument(
        "--gpu-memory-gib", type=float, help="memory of one GPU for the defaults' memory model (default: 80)"
    )
    parser.add_argument("--run-dir", default="run", help="where the run's outputs would go (default: ./run)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a typed setting (e.g. learning_rate=1e-4, lora_rank=16), converted to the setting's type, or a "
        "dotted torchtune key (e.g. clip_grad_norm=1.0, +new.key=1, ~profiler), read as YAML 1.2",
    )
    parser.add_argument("-o", "--output", help="write the YAML here instead of printing it")


# Python annotation -> the KFP parameter type the one value parser (commands/values.py) converts to.
_KFP_TYPES = {
    int: "NUMBER_INTEGER",
    float: "NUMBER_DOUBLE",
    bool: "BOOLEAN",
    str: "STRING",
    list: "LIST",
    dict: "STRUCT",
}


def setting_types() -> dict[str, str]:
    """Each flat TorchtuneConfig setting (nested lora/dataset ones included) -> its KFP parameter type."""
    import dataclasses
    import types
    import typing

    from kfp_finetune.components._shared.torchtune import config

    found: dict[str, str] = {}
    for cls in (config.TorchtuneConfig, config.LoraSettings, config.DatasetSettings):
        names = {f.name for f in dataclasses.fields(cls)}
        for name, hint in typing.get_type_hints(cls).items():
            union = typing.get_origin(hint) in (typing.Union, types.UnionType)
            kinds = [typing.get_origin(a) or a for a in (typing.get_args(hint) if union else (hint,))]
            kinds = [kind for kind in kinds if kind is not type(None)]
            if name in names and len(kinds) == 1 and kinds[0] in _KFP_TYPES:
                found[name] = _KFP_TYPES[kinds[0]]
    return found


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.commands.values import UsageError, parse_pairs, parse_value
    from kfp_finetune.components._shared import engines
    from kfp_finetune.components._shared.torchtune.config import ConfigError, from_flat
    from kfp_finetune.components._shared.torchtune.resolve import render_yaml, resolve_run

    settings: dict = {
        "method": args.method,
        "recipe": args.recipe,
        "config": args.config,
        "device": args.device,
    }
    declared = setting_types()
    try:
        for key, raw in parse_pairs(args.set, "--set").items():
            settings[key] = parse_value(key, raw, declared.get(key), "--set")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        # --set dataset_type=classification previews a classifier's run (the engine that trains one).
        task = engines.task_of(settings.get("dataset_type"))
        choice = engines.choose(args.model_dir, engines.model_config(args.model_dir), args.engine, task)
        face = engines.face(choice.engine)
        if hasattr(face, "preview"):  # a wing that plans its own runs shows its own settings
            return _print_preview(face, choice, settings, args)
        config = from_flat({k: v for k, v in settings.items() if v is not None}, unknown_to_overrides=True)
        run = resolve_run(
            config,
            args.model_dir,
            args.data,
            Path(args.run_dir),
            devices=args.devices,
            nodes=args.nodes,
            write=False,
            gpu_memory_gib=args.gpu_memory_gib,
            tokenize_sample=False,  # a preview imports no torch: token lengths are estimated (said so)
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = render_yaml(run.config, run.recipe, run.config_name)
    chosen = "".join(f"# {choice.line()}\n" for choice in run.defaults)
    if args.output:
        Path(args.output).write_text(text)
        print(
            f"recipe: {run.recipe}\nconfig: {run.config_name or 'user file'}\nwrote {args.output}",
            file=sys.stderr,
        )
        print(f"{choice.line()}\n{chosen}", end="", file=sys.stderr)
    else:
        print(f"# recipe: {run.recipe}")
        print(f"# {choice.line()}")
        print(chosen, end="")
        print(text, end="")
    return 0


def _print_preview(face, choice, settings: dict, args: argparse.Namespace) -> int:
    """The settings file the engine's run would get (its `auto` settings are chosen where it trains)."""
    given = {k: v for k, v in settings.items() if v is not None}
    data = Path(args.data) if args.data else Path("data.parquet")
    files = sorted(str(p) for p in data.iterdir() if p.is_file()) if data.is_dir() else [str(data)]
    text = face.preview(
        given, model_dir=args.model_dir, data_files=files, run_dir=args.run_dir, devices=args.devices,
        nodes=args.nodes,
    )  # fmt: skip
    note = (
        "# the run's settings file; `auto` settings are chosen where it trains, with their reasons in its log"
    )
    if args.output:
        Path(args.output).write_text(text)
        print(f"{choice.line()}\nwrote {args.output}", file=sys.stderr)
    else:
        print(f"# {choice.line()}\n{note}\n{text}", end="")
    return 0
