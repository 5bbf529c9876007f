"""2. Orchestration overhead: `finetune_pipeline` under kfp.local, total wall minus the training's own time.

A fresh process runs the whole pipeline (dataset-initialize, model-initialize, torchtune-finetune with the local
backend, evaluate, quality gate, export) on the tiny model and task. Per-task wall times come from kfp.local's own
log lines (`Executing task` / `finished with status`, millisecond timestamps); the training's own time is the
`tune run` subprocess wall the finetune step reports (its `wall_seconds` metric).

Start-up per step: a fresh interpreter imports what kfp's executor imports (`kfp.dsl.executor_main` with
`_KFP_RUNTIME=true`, as the compiled command sets it) plus the
modules the component body imports (read from components/*/component.py), timed from process start to done, and
whether torch got imported. That is the cost before a step's own work begins. Target: under 2 s for every
non-training step.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
import subprocess
from pathlib import Path

from benchmarks.common import (
    PY,
    ROOT,
    Settings,
    Timer,
    bench_env,
    fresh_dir,
    median,
    spread,
    tiny_model,
    tiny_task_data,
)
from benchmarks.drivers import parse_result

NAME = "orchestration"
TITLE = "2. Orchestration overhead (finetune_pipeline under kfp.local)"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# kfp.local's own log lines: `HH:MM:SS.ffffff - LEVEL - message` (kfp 2.17 prints no date).
_LINE = re.compile(r"^(?:\d{4}-\d\d-\d\d )?(\d\d:\d\d:\d\d[.,]\d+) - \w+ - (.*)$")
_START = re.compile(r"Executing task '([^']+)'")
_END = re.compile(r"Task '([^']+)' finished with status (\w+)")
TRAINING_STEP = "torchtune-finetune"
START_TARGET_SECONDS = 2.0


def component_body_imports() -> dict[str, list[str]]:
    """{component function name: modules its body imports}, read from components/*/component.py."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "components").glob("*/component.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            is_component = any(
                "component" in ast.unparse(d.func if isinstance(d, ast.Call) else d)
                for d in node.decorator_list
            )
            if not is_component:
                continue
            modules = []
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.module:
                    modules.append(inner.module)
                elif isinstance(inner, ast.Import):
                    modules.extend(alias.name for alias in inner.names)
            found[node.name.replace("_", "-")] = modules
    return found


def probe_imports(modules: list[str]) -> dict:
    with Timer() as t:
        proc = subprocess.run(
            [PY, "-m", "benchmarks.drivers", "imports", *modules],
            cwd=ROOT, env=bench_env(_KFP_RUNTIME="true"), capture_output=True, text=True,
        )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"import probe failed for {modules}:\n{proc.stderr[-2000:]}")
    result = parse_result(proc.stdout)
    result["process_seconds"] = t.seconds
    return result


def task_times(log_text: str) -> dict[str, dict]:
    """{task: {start, end, seconds, status}} from kfp.local's log lines."""
    starts: dict[str, float] = {}
    tasks: dict[str, dict] = {}
    day, last = 0.0, -1.0
    for raw in log_text.splitlines():
        match = _LINE.match(_ANSI.sub("", raw).strip())
        if not match:
            continue
        clock = dt.datetime.strptime(match.group(1).replace(",", "."), "%H:%M:%S.%f")
        when = day + clock.hour * 3600 + clock.minute * 60 + clock.second + clock.microsecond / 1e6
        if when < last:  # the run crossed midnight
            day += 86400.0
            when += 86400.0
        last = when
        message = match.group(2)
        if m := _START.search(message):
            starts[m.group(1)] = when
        elif (m := _END.search(message)) and m.group(1) in starts:
            begun = starts[m.group(1)]
            tasks[m.group(1)] = {"start": begun, "end": when, "seconds": when - begun, "status": m.group(2)}
    # A task whose interval holds another task is a sub-DAG, not a step.
    for name, info in tasks.items():
        info["is_dag"] = any(
            other != name and o["start"] >= info["start"] and o["end"] <= info["end"]
            for other, o in tasks.items()
        )
    return tasks


def _pipeline_arguments(s: Settings, out: Path) -> dict:
    model_dir = tiny_model(s.workdir, dim=64)
    data = tiny_task_data(s.workdir, rows=4000)
    return {
        "model_uri": str(model_dir),
        "data_uri": str(data),
        "export_destination": str(out / "exported"),
        "export_overwrite": True,
        "tune_method": "lora",
        "tune_backend": "local",
        "tune_device": "cpu",
        "tune_gpus_per_node": 0,
        "tune_learning_rate": 3e-3,
        "tune_batch_size": 16,
        "tune_max_steps_per_epoch": int(s.extra.get("pipeline_steps", 10)),
        "tune_max_seq_len": -1,  # unset: the base config's
        "tune_seed": 0,
        "eval_max_samples": 10,
        "eval_max_new_tokens": 8,
        "eval_device": "cpu",
    }


def _pipeline_run(s: Settings, base: Path, index: int) -> dict:
    out = fresh_dir(base / f"run-{index}")
    args = {"arguments": _pipeline_arguments(s, out), "output_dir": str(out)}
    args_file = out / "args.json"
    args_file.write_text(json.dumps(args))
    with Timer() as t:
        proc = subprocess.run(
            [PY, "-m", "benchmarks.drivers", "pipeline", str(args_file)],
            cwd=ROOT, env=bench_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    (out / "pipeline.log").write_text(proc.stdout)
    if proc.returncode:
        raise RuntimeError(f"pipeline failed:\n{proc.stdout[-4000:]}")
    result = parse_result(proc.stdout)
    tasks = task_times(proc.stdout)
    steps = {name: info["seconds"] for name, info in tasks.items() if not info["is_dag"]}
    training = float(result["train_metrics"]["wall_seconds"])
    training_task = next((n for n in steps if n.startswith(TRAINING_STEP)), None)
    return {
        "total_seconds": t.seconds,
        "training_seconds": training,
        "overhead_seconds": t.seconds - training,
        "steps": steps,
        "training_task_overhead_seconds": steps[training_task] - training if training_task else None,
        "steps_outside_tasks_seconds": t.seconds - sum(steps.values()),
    }


def run(s: Settings, echo=print) -> dict:
    base = fresh_dir(s.workdir / NAME)
    runs = []
    for index in range(s.repeats):
        result = _pipeline_run(s, base, index)
        runs.append(result)
        echo(f"  pipeline: total {result['total_seconds']:.1f}s, training {result['training_seconds']:.1f}s, "
             f"steps {json.dumps({k: round(v, 1) for k, v in result['steps'].items()})}")  # fmt: skip
    step_names = sorted({name for r in runs for name in r["steps"]})
    per_step = {name: spread([r["steps"][name] for r in runs if name in r["steps"]]) for name in step_names}

    startup = {}
    for component, modules in component_body_imports().items():
        probes = [probe_imports(modules) for _ in range(s.repeats)]
        startup[component] = {
            "modules": modules,
            "start_seconds": spread([p["process_seconds"] for p in probes]),
            "torch_imported": any(p["torch_imported"] for p in probes),
            "transformers_imported": any(p["transformers_imported"] for p in probes),
        }
        echo(f"  start-up {component}: {startup[component]['start_seconds']['median']:.2f}s, "
             f"torch={startup[component]['torch_imported']}")  # fmt: skip
    baseline = [probe_imports([]) for _ in range(s.repeats)]
    slow = {
        name: info["start_seconds"]["median"]
        for name, info in startup.items()
        if name != TRAINING_STEP and info["start_seconds"]["median"] >= START_TARGET_SECONDS
    }
    pipeline_steps = {"dataset-initialize", "model-initialize", "evaluate", "quality-gate", "export"}
    slow_in_pipeline = {k: v for k, v in slow.items() if k in pipeline_steps}
    total = median([r["total_seconds"] for r in runs])
    training = median([r["training_seconds"] for r in runs])
    return {
        "name": NAME,
        "title": TITLE,
        "target": f"every non-training step starts in < {START_TARGET_SECONDS:.0f} s (no torch import where none is needed)",
        "met": not slow_in_pipeline,
        "headline": f"pipeline {total:.1f}s of which training {training:.1f}s: overhead {total - training:.1f}s; "
        + (f"slow starts: {slow_in_pipeline}" if slow_in_pipeline else "all non-training steps start < 2 s"),
        "results": {
            "total_seconds": spread([r["total_seconds"] for r in runs]),
            "training_seconds": spread([r["training_seconds"] for r in runs]),
            "overhead_seconds": spread([r["overhead_seconds"] for r in runs]),
            "training_task_overhead_seconds": spread(
                [
                    r["training_task_overhead_seconds"]
                    for r in runs
                    if r["training_task_overhead_seconds"] is not None
                ]
            ),
            "outside_tasks_seconds": spread([r["steps_outside_tasks_seconds"] for r in runs]),
            "per_step_seconds": per_step,
            "startup": startup,
            "bare_executor_start_seconds": spread([p["process_seconds"] for p in baseline]),
        },
        "settings": {
            "repeats": s.repeats,
            **{
                k: v
                for k, v in _pipeline_arguments(s, base).items()
                if not k.endswith(("_uri", "destination"))
            },
        },  # fmt: skip
    }
