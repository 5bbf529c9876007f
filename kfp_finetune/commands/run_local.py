"""`kfp-finetune run-local`: run one of our pipelines on this machine with kfp.local.

Each step runs as a subprocess of this Python environment (`SubprocessRunner(use_venv=False)`); the fine-tune
step trains in-process with `tune_backend=local`. Outputs (metrics, reports, exported model) land under
`--output`; kfp.local deletes the run workspace when the run ends, so export to a path to keep the model.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

# What a laptop run needs instead of the cluster defaults (no TrainJob, no GPU request).
LOCAL_DEFAULTS = {"tune_backend": "local", "tune_gpus_per_node": 0}


def run_pipeline_locally(pipeline: Any, arguments: dict[str, Any], output_dir: str | Path) -> Any:
    """Run `pipeline` under kfp.local with artifacts in `output_dir/pipeline_root`; returns the run's task."""
    from kfp import local

    output_dir = Path(output_dir).resolve()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(output_dir / "pipeline_root"),
        workspace_root=str(output_dir / "workspace"),
    )
    return pipeline(**arguments)


def pipeline_parameters(pipeline: Any) -> set[str]:
    return set(pipeline.component_spec.inputs or {})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pipeline", help="pipeline name (finetune-pipeline, sweep-pipeline, prepare-inputs, ...)"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pipeline parameter; YAML-typed value",
    )
    parser.add_argument(
        "--output", default="local_outputs", help="folder for artifacts (default: local_outputs)"
    )


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.components.torchtune_finetune.config import parse_value
    from kfp_finetune.pipelines import PIPELINES

    if args.pipeline not in PIPELINES:
        print(
            f"error: unknown pipeline {args.pipeline!r}; choose from {', '.join(PIPELINES)}", file=sys.stderr
        )
        return 2
    pipeline = PIPELINES[args.pipeline]
    known = pipeline_parameters(pipeline)
    arguments = {k: v for k, v in LOCAL_DEFAULTS.items() if k in known}
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            print(
                f"error: --param {item!r}: expected KEY=VALUE with KEY one of {', '.join(sorted(known))}",
                file=sys.stderr,
            )
            return 2
        arguments[key] = parse_value(value)
    task = run_pipeline_locally(pipeline, arguments, args.output)
    for name, value in (getattr(task, "outputs", None) or {}).items():
        shown = getattr(value, "path", value)
        print(f"{name}: {shown}")
    return 0
