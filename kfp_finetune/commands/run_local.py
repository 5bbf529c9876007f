"""`kfp-finetune run-local`: run one of our pipelines on this machine with kfp.local.

Each step runs as a subprocess of this Python environment (`SubprocessRunner(use_venv=False)`); the fine-tune
step trains in a local process (`tune_backend=local`). kfp.local deletes the run workspace when the run ends, so
what is worth keeping is copied into `--output` (the same for `kfp-finetune demo`):

    tuned-model/<run name>/merged|adapter   the fine-tune step's model, linked there by the step itself
                                            (KFP_FINETUNE_LOCAL_OUTPUT), kept even when the quality gate fails
    reports/<output>.html                   the HTML reports, openable in a browser
    metrics/<output>.json                   the metrics
    pipeline_root/                          every artifact kfp.local wrote
    <log file>                              the full log; the terminal shows task starts/ends and progress
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# What a laptop run needs instead of the cluster defaults (no TrainJob, no GPU request).
LOCAL_DEFAULTS = {"tune_backend": "local", "tune_gpus_per_node": 0}
LOG_FILE = "run-local.log"
# Folders of --output a run writes; cleared first so nothing from an earlier run passes for this one's.
KEPT_DIRS = ("tuned-model", "reports", "metrics")
_SHOWN_METRICS = ("eval_loss", "perplexity", "exact_match", "token_f1", "rouge_l")


@dataclass
class LocalRun:
    """What a local run left: the pipeline's outputs (none when it failed) and the files kept in `output`."""

    name: str
    output: Path
    log_path: Path
    outputs: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    exported: Path | None = None  # the export destination, when it is a local folder the run wrote

    def exported_now(self) -> bool:
        """Whether this run exported to a local folder (an earlier run's export does not count)."""
        return self.outputs.get("passed") is True and self.exported is not None and self.exported.is_dir()

    def kept(self) -> list[tuple[str, Path]]:
        """(label, path) of every kept result that exists, in the order the summary shows them."""
        found = [("exported model", self.exported)] if self.exported_now() else []
        models = sorted(m for m in (self.output / "tuned-model").glob("*/*") if m.is_dir())
        several_runs = len({m.parent for m in models}) > 1  # a sweep: one per trial
        found += [(f"tuned model ({f'{m.parent.name}/' if several_runs else ''}{m.name})", m) for m in models]
        found += [(name.replace("_", " "), self.output / "reports" / f"{name}.html") for name in self.outputs]
        found.append(("metrics", self.output / "metrics"))
        samples = self.outputs.get("eval_samples")
        if samples is not None:
            found.append(("generations", Path(samples.path)))
        found += [("all artifacts", self.output / "pipeline_root"), ("full log", self.log_path)]
        return [(label, path) for label, path in found if path.exists()]


def local_arguments(pipeline: Any, pairs: list[str]) -> dict[str, Any]:
    """LOCAL_DEFAULTS plus `--param KEY=VALUE` pairs (YAML) converted to the pipeline's declared types; raises
    UsageError naming the parameter for unknown names, missing required ones and values of the wrong type."""
    from google.protobuf import json_format

    from kfp_finetune.commands.kfp_backend import parse_params, typed_params

    spec = json_format.MessageToDict(pipeline.pipeline_spec)
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    return {
        **{key: value for key, value in LOCAL_DEFAULTS.items() if key in declared},
        **typed_params(parse_params(pairs), spec),
    }


def run_and_keep(
    pipeline: Any,
    arguments: dict[str, Any],
    output: str | Path,
    *,
    log_name: str = LOG_FILE,
    append_log: bool = False,
    verbose: bool = False,
) -> LocalRun:
    """Run `pipeline` under kfp.local with its folders in `output`, quietly (the full log in `output/log_name`),
    and keep its results there (see the module docstring). A failed run is returned with `error` set."""
    from kfp_finetune.commands.local_console import quiet_console
    from kfp_finetune.components.torchtune_finetune.outputs import LOCAL_OUTPUT_ENV

    output = Path(output).resolve()
    for folder in KEPT_DIRS:
        shutil.rmtree(output / folder, ignore_errors=True)
    run = LocalRun(pipeline.name, output, output / log_name)
    print(f"running {pipeline.name} locally; full log: {run.log_path}", flush=True)
    environment = {LOCAL_OUTPUT_ENV: str(output), "PYTHONUNBUFFERED": "1"}
    with _environment(environment), quiet_console(run.log_path, verbose, append_log):
        try:
            task = run_pipeline_locally(pipeline, arguments, output)
            run.outputs = dict(getattr(task, "outputs", None) or {})
        except Exception as error:  # kfp.local raises when a task fails; its log is on screen and in the file
            run.error = re.sub(r"\x1b\[[0-9;]*m", "", str(error)) or type(error).__name__
    _keep_outputs(run.outputs, output)
    destination = arguments.get("export_destination")
    if isinstance(destination, str) and destination and "://" not in destination:
        run.exported = Path(destination).resolve()
    return run


def run_pipeline_locally(pipeline: Any, arguments: dict[str, Any], output_dir: str | Path) -> Any:
    """Run `pipeline` under kfp.local with artifacts in `output_dir/pipeline_root`; returns the run's task."""
    from kfp import local

    output_dir = Path(output_dir).resolve()
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(output_dir / "pipeline_root"),
        workspace_root=str(output_dir / "workspace"),
    )
    return pipeline(**arguments)


def _keep_outputs(outputs: dict[str, Any], output: Path) -> None:
    """Copy the HTML reports to reports/<name>.html and the metrics to metrics/<name>.json."""
    from kfp import dsl

    for name, artifact in outputs.items():
        if isinstance(artifact, dsl.HTML) and Path(artifact.path).is_file():
            (output / "reports").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(artifact.path, output / "reports" / f"{name}.html")
        elif isinstance(artifact, dsl.Metrics):
            (output / "metrics").mkdir(parents=True, exist_ok=True)
            text = json.dumps(dict(artifact.metadata), indent=2, sort_keys=True)
            (output / "metrics" / f"{name}.json").write_text(text + "\n")


@contextlib.contextmanager
def _environment(values: dict[str, str]):
    """Set environment variables (inherited by kfp.local's step subprocesses) for the run, then restore them."""
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def summary(run: LocalRun) -> str:
    """Base vs tuned metrics, the gate's verdict and where the kept results are (only paths that exist)."""
    outputs = run.outputs
    lines = ["", f"kfp-finetune: {run.name} " + (f"FAILED: {run.error}" if run.error else "ran locally")]
    train = outputs["train_metrics"].metadata if "train_metrics" in outputs else {}
    if "final_loss" in train:
        lines.append(
            f"training: loss {train['first_loss']:.3f} -> {train['final_loss']:.3f} in {int(train['steps'])} "
            f"steps ({train.get('tokens_per_second', 0):.0f} tokens/s)"
        )
    evaluation = next(
        (outputs[k].metadata for k in ("eval_metrics", "best_eval_metrics") if k in outputs), {}
    )
    if evaluation:
        # The gain (positive = better) with the confidence interval the quality gate reads (evaluate/confidence.py).
        level = f"gain, {evaluation['confidence'] * 100:g}% CI" if "confidence" in evaluation else ""
        lines += [
            "evaluation (held-out split):",
            f"  {'metric':<12} {'base':>10} {'tuned':>10} {'delta':>10}  {level}".rstrip(),
        ]
        for name in _SHOWN_METRICS:
            if f"tuned_{name}" in evaluation:
                base, tuned = evaluation.get(f"base_{name}", float("nan")), evaluation[f"tuned_{name}"]
                interval = ""
                if f"{name}_improvement_ci_low" in evaluation:
                    low, high = (
                        evaluation[f"{name}_improvement_ci_low"],
                        evaluation[f"{name}_improvement_ci_high"],
                    )
                    interval = f"  [{low:+.4f}, {high:+.4f}]"
                lines.append(f"  {name:<12} {base:>10.4f} {tuned:>10.4f} {tuned - base:>+10.4f}{interval}")
    if outputs.get("passed") is True:
        lines.append("quality gate: passed" + (": the model was exported" if run.exported_now() else ""))
    elif outputs.get("passed") is False:
        kept = any((run.output / "tuned-model").glob("*/*"))
        lines.append("quality gate: failed: nothing exported" + ("; the tuned model is kept" if kept else ""))
    kept = run.kept()
    width = max((len(label) for label, _ in kept), default=0)
    lines += [f"  {label + ':':<{width + 1}} {_shown(path)}" for label, path in kept]
    return "\n".join(lines)


def _shown(path: Path) -> str:
    """A path as short as it is clear: relative to the current folder when inside it."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "pipeline", help="pipeline name (finetune-pipeline, sweep-pipeline, prepare-inputs, ...)"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a pipeline parameter, its value read as YAML and converted to the parameter's type (repeatable)",
    )
    parser.add_argument(
        "--output",
        default="local_outputs",
        help="folder for the results and the log (default: local_outputs)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="stream every step's full log (it always goes to the log file)"
    )


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.commands.kfp_backend import UsageError
    from kfp_finetune.pipelines import PIPELINES

    if args.pipeline not in PIPELINES:
        print(
            f"error: unknown pipeline {args.pipeline!r}; choose from {', '.join(PIPELINES)}", file=sys.stderr
        )
        return 2
    pipeline = PIPELINES[args.pipeline]
    try:
        arguments = local_arguments(pipeline, args.param)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = run_and_keep(pipeline, arguments, args.output, verbose=args.verbose)
    print(summary(result))
    return 1 if result.error else 0
