"""`kfp-finetune compile`: write the golden YAML of every pipeline and component to compiled/ (or check it).

Compiling is deterministic: the same sources, kfp version and compile-time settings give the same bytes, so
`--check` can fail when compiled/ is stale. Compile-time settings come from the environment (images:
KFP_FINETUNE_COMPONENT_IMAGE / KFP_FINETUNE_TRAINER_IMAGE; workspace: see kfp_finetune.pipelines.settings);
the golden files use the defaults.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
from pathlib import Path

COMPILE_ENV = (
    "KFP_FINETUNE_COMPONENT_IMAGE",
    "KFP_FINETUNE_TRAINER_IMAGE",
    "KFP_FINETUNE_WORKSPACE_SIZE",
    "KFP_FINETUNE_WORKSPACE_STORAGE_CLASS",
    "KFP_FINETUNE_WORKSPACE_ACCESS_MODE",
)


def targets() -> dict[str, object]:
    """Relative output path -> pipeline or component to compile."""
    from kfp_finetune.component_readme import components_in, discover
    from kfp_finetune.pipelines import PIPELINES

    found = {f"{name}.yaml": pipeline for name, pipeline in PIPELINES.items()}
    for folder in discover():
        for component in components_in(folder.module):
            found[f"components/{component.name}.yaml"] = component
    return found


def compile_all(out_dir: str | Path) -> list[Path]:
    from kfp import compiler

    out_dir = Path(out_dir)
    written = []
    for relative, target in targets().items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(target, str(path))
        written.append(path)
    return written


def stale_files(golden_dir: str | Path) -> list[str]:
    """Files in golden_dir that differ from a fresh compile, or are missing/extra."""
    golden_dir = Path(golden_dir)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.relative_to(tmp).as_posix(): p.read_bytes() for p in compile_all(tmp)}
    existing = {p.relative_to(golden_dir).as_posix() for p in golden_dir.rglob("*.yaml")}
    problems = [
        f"{name}: not compiled by `make compile` (remove it)" for name in sorted(existing - set(fresh))
    ]
    for name, content in sorted(fresh.items()):
        golden = golden_dir / name
        if not golden.is_file():
            problems.append(f"{name}: missing")
        elif golden.read_bytes() != content:
            diff = difflib.unified_diff(
                golden.read_text().splitlines(),
                content.decode().splitlines(),
                "golden",
                "fresh",
                n=1,
                lineterm="",
            )
            problems.append(f"{name}: stale\n" + "\n".join(list(diff)[:20]))
    return problems


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", default="compiled", help="folder for the YAML (default: compiled)")
    parser.add_argument(
        "--check", action="store_true", help="fail if the folder differs from a fresh compile"
    )


def run(args: argparse.Namespace) -> int:
    import os

    overridden = [name for name in COMPILE_ENV if os.environ.get(name)]
    if args.check:
        if overridden:
            print(f"error: unset {', '.join(overridden)} to check the golden files", file=sys.stderr)
            return 2
        problems = stale_files(args.output)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("compiled/ is stale: run `make compile` and commit the result", file=sys.stderr)
        return 1 if problems else 0
    for path in compile_all(args.output):
        print(path)
    if overridden:
        print(f"note: compiled with {', '.join(overridden)} set (not the golden defaults)", file=sys.stderr)
    return 0
