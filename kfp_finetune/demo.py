"""`kfp-finetune demo`: the whole `finetune_pipeline` on this machine, offline, on CPU, in a few minutes.

Builds the tiny model and the synthetic dataset, runs dataset/model-initialize → torchtune-finetune (local
backend) → evaluate → quality gate → export under kfp.local, and prints base vs tuned metrics and where the
model and reports are.
"""

from __future__ import annotations

import argparse
from pathlib import Path

_SHOWN_METRICS = ("eval_loss", "perplexity", "exact_match", "token_f1", "rouge_l")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", default="demo_output", help="folder for everything (default: demo_output)"
    )
    parser.add_argument("--method", default="full", choices=["full", "lora", "qlora", "dora"])
    parser.add_argument(
        "--steps", type=int, default=0, help="training steps (default: the tiny kit's recommendation)"
    )


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.commands.run_local import run_pipeline_locally
    from kfp_finetune.pipelines import finetune_pipeline
    from kfp_finetune.tiny import RECOMMENDED_TRAINING
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.model import build_tiny_model

    out = Path(args.output).resolve()
    model_dir = build_tiny_model(
        out / "sources" / "model", family="llama3_2", dim=256 if args.method == "qlora" else 64
    )
    data = build_tiny_dataset(out / "sources" / "data")
    recommended = RECOMMENDED_TRAINING.get(args.method, RECOMMENDED_TRAINING["full"])
    task = run_pipeline_locally(
        finetune_pipeline,
        {
            "model_uri": str(model_dir),
            "data_uri": str(data["train.jsonl"]),
            "export_destination": str(out / "model"),
            "export_overwrite": True,  # a second demo run replaces the first one's model
            "tune_method": args.method,
            "tune_backend": "local",
            "tune_device": "cpu",
            "tune_gpus_per_node": 0,
            "tune_learning_rate": recommended["lr"],
            "tune_batch_size": recommended["batch_size"],
            "tune_max_steps_per_epoch": args.steps or recommended["max_steps_per_epoch"],
            "tune_max_seq_len": recommended["max_seq_len"],
            "tune_seed": 0,
            "tune_num_warmup_steps": recommended["num_warmup_steps"],
            "eval_max_samples": 50,
            "eval_max_new_tokens": 16,
            "eval_device": "cpu",
        },
        out,
    )
    print(summary(task.outputs, out))
    return 0


def summary(outputs: dict, out: Path) -> str:
    metrics = outputs["eval_metrics"].metadata
    rows = [f"  {'metric':<12} {'base':>10} {'tuned':>10} {'delta':>10}"]
    for name in _SHOWN_METRICS:
        if f"tuned_{name}" in metrics:
            base, tuned = metrics.get(f"base_{name}", float("nan")), metrics[f"tuned_{name}"]
            rows.append(f"  {name:<12} {base:>10.4f} {tuned:>10.4f} {tuned - base:>+10.4f}")
    train = outputs["train_metrics"].metadata
    exported = out / "model"
    lines = [
        "",
        "kfp-finetune demo: finetune_pipeline ran locally",
        f"training: loss {train['first_loss']:.3f} -> {train['final_loss']:.3f} in {int(train['steps'])} steps "
        f"({train.get('tokens_per_second', 0):.0f} tokens/s)",
        "evaluation (held-out split):",
        *rows,
        f"quality gate: {'passed: the model was exported' if outputs['passed'] else 'failed: nothing exported'}",
        f"  exported model: {exported if exported.is_dir() else '(none)'}",
        f"  training report: {outputs['train_report'].path}",
        f"  evaluation report: {outputs['eval_report'].path}",
        f"  generations: {outputs['eval_samples'].path}",
        f"  all artifacts: {out / 'pipeline_root'}",
    ]
    return "\n".join(lines)
