"""The `kfp-finetune` command line.

Each subcommand lives in the module that does the work; the module exposes `add_arguments(parser)` and
`run(args) -> int`. Command modules import heavy libraries (torch, torchtune) inside `run`, so building the
parser stays fast and commands that need no torch never import it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "kfp_finetune.demo",
        "Fine-tune the built-in tiny model locally (offline, CPU) and show the results.",
    ),
    "tiny-model": ("kfp_finetune.tiny.model", "Build a tiny offline HF-layout model torchtune can train."),
    "tiny-hf-model": (
        "kfp_finetune.tiny.hf_models",
        "Build a tiny offline transformers model folder (Qwen3-MoE, Gemma 3 VLM, BERT classifier).",
    ),
    "trainjob": ("kfp_finetune.commands.trainjob", "Print the TrainJob manifest a fine-tune would create."),
    "tiny-dataset": ("kfp_finetune.tiny.dataset", "Write the synthetic instruct dataset (train + held-out)."),
    "compile": (
        "kfp_finetune.commands.compile",
        "Compile every pipeline and component to YAML (or --check it).",
    ),
    "resolve-config": (
        "kfp_finetune.commands.resolve_config",
        "Print the complete torchtune YAML and recipe a run would use, without running it.",
    ),
    "check-model": (
        "kfp_finetune.commands.check_model",
        "Measure whether a model folder's layout computes what transformers computes (config.json only).",
    ),
    "upload": (
        "kfp_finetune.commands.upload",
        "Upload a pipeline to a KFP backend (creates it, or adds a version).",
    ),
    "run-local": (
        "kfp_finetune.commands.run_local",
        "Run a pipeline on this machine with kfp.local (local training) and keep its results.",
    ),
    "run": ("kfp_finetune.commands.run_pipeline", "Start one run of a pipeline on a KFP backend."),
    "schedule": (
        "kfp_finetune.commands.schedule",
        "Create a recurring run (cron or interval) on a KFP backend.",
    ),
    "serve-manifest": (
        "kfp_finetune.commands.serve_manifest",
        "Print the KServe InferenceService that serves an export (oci://, s3:// or hf://).",
    ),
    "list-runtimes": (
        "kfp_finetune.commands.list_runtimes",
        "List the Kubeflow Trainer runtimes (ClusterTrainingRuntimes) visible to you.",
    ),
    "component-readmes": (
        "kfp_finetune.component_readme",
        "Write components/*/README.md from the component docstrings (--check: fail when one is stale).",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kfp-finetune", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        importlib.import_module(module_name).add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
