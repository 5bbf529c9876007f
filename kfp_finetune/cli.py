"""The `kfp-finetune` command line.

Each subcommand lives in the module that does the work; the module exposes `add_arguments(parser)` and
`run(args) -> int`. Modules are imported only when their subcommand runs (or help is shown), so commands
that need no torch never import it.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tiny-model": ("kfp_finetune.tiny.model", "Build a tiny offline HF-layout model torchtune can train."),
    "tiny-dataset": ("kfp_finetune.tiny.dataset", "Write the synthetic instruct dataset (train + held-out)."),
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
