"""`kfp-finetune demo`: the whole `finetune_pipeline` on this machine, offline, on CPU, in a few minutes.

Builds the tiny model and the synthetic dataset, runs dataset/model-initialize → torchtune-finetune (local
backend) → evaluate → quality gate → export under kfp.local (as `run-local` does: task starts/ends and progress
on the terminal, the full log in `<output>/demo.log`), and prints base vs tuned metrics and where the model and
the reports are.
"""

from __future__ import annotations

import argparse
from pathlib import Path

LOG_FILE = "demo.log"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", default="demo_output", help="folder for everything (default: demo_output)"
    )
    parser.add_argument("--method", default="full", choices=["full", "lora", "qlora", "dora"])
    parser.add_argument(
        "--steps", type=int, default=0, help="training steps (default: the tiny kit's recommendation)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help=f"stream every step's full log (it always goes to {LOG_FILE})"
    )


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.commands.local_console import quiet_console
    from kfp_finetune.commands.run_local import run_and_keep, summary
    from kfp_finetune.pipelines import finetune_pipeline
    from kfp_finetune.tiny import RECOMMENDED_TRAINING

    out = Path(args.output).resolve()
    # Building the sources imports torch and torchao, whose import-time warnings concern no demo user.
    with quiet_console(out / LOG_FILE):
        model_dir, data = _build_sources(out, args.method)
    recommended = RECOMMENDED_TRAINING.get(args.method, RECOMMENDED_TRAINING["full"])
    result = run_and_keep(
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
        log_name=LOG_FILE,
        append_log=True,
        verbose=args.verbose,
    )
    print(summary(result))
    return 1 if result.error else 0


def _build_sources(out: Path, method: str) -> tuple[Path, dict[str, Path]]:
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.model import build_tiny_model

    model_dir = build_tiny_model(
        out / "sources" / "model", family="llama3_2", dim=256 if method == "qlora" else 64
    )
    return model_dir, build_tiny_dataset(out / "sources" / "data")
