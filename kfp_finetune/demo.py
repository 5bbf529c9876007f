"""`kfp-finetune demo`: fine-tune the built-in tiny model on the synthetic task, locally, offline, on CPU.

Builds the tiny model and dataset, resolves the torchtune config, runs `tune run` through the local launcher
and prints where everything is.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", default="demo_output", help="folder for the model, data and run (default: demo_output)"
    )
    parser.add_argument("--method", default="lora", choices=["full", "lora", "qlora", "dora"])
    parser.add_argument("--steps", type=int, default=60, help="training steps (default: 60)")


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.components.torchtune_finetune.config import TorchtuneConfig
    from kfp_finetune.components.torchtune_finetune.local_launcher import run_local
    from kfp_finetune.components.torchtune_finetune.metrics import summarize
    from kfp_finetune.components.torchtune_finetune.resolve import resolve_run, tune_command
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.model import build_tiny_model

    out = Path(args.output).resolve()
    model_dir = build_tiny_model(out / "model", family="llama3_2", dim=256 if args.method == "qlora" else 64)
    data = build_tiny_dataset(out / "data")
    config = TorchtuneConfig(
        method=args.method, device="cpu", batch_size=8, gradient_accumulation_steps=1, epochs=1,
        max_steps_per_epoch=args.steps, learning_rate=3e-3, num_warmup_steps=0, seed=0,
    )  # fmt: skip
    resolved = resolve_run(config, model_dir, data["train.jsonl"], out / "run")
    print(
        f"recipe {resolved.recipe} (base config {resolved.config_name}); config {resolved.yaml_path}",
        flush=True,
    )
    result = run_local(tune_command(resolved.recipe, resolved.yaml_path), total_steps=args.steps)
    summary = summarize(result.steps)
    print(
        f"\ndone in {result.wall_seconds:.0f}s: loss {summary['first_loss']:.3f} -> {summary['final_loss']:.3f} "
        f"(min {summary['min_loss']:.3f}), {summary.get('tokens_per_second', 0):.0f} tokens/s\n"
        f"  model:      {model_dir}\n  data:       {out / 'data'}\n  checkpoint: {resolved.run_dir / 'epoch_0'}\n"
        f"  metrics:    {resolved.metrics_path}"
    )
    return 0
