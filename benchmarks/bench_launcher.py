"""1. Launcher overhead: the finetune component (local backend) vs plain `tune run` on the identical YAML.

Component side: a fresh Python process runs `run_finetune` (the component's implementation, as the KFP step
calls it) with dataset/model artifacts from the initializers: it resolves the YAML, launches `tune run` through
the local launcher (output piped, parsed and echoed), then separates merged weights and adapter and builds
metrics + the HTML report. Plain side: `tune run <recipe> --config <the YAML the component resolved>` (output
paths moved to another folder, nothing else changed), output to a file. Sides alternate (ABBA) per repeat.

Reported: steady-state trained tokens/s (torchtune's per-step number, first step skipped, median) and wall
time of the whole process; ratios component/plain for tokens/s and plain/component for wall.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.common import (
    PY,
    ROOT,
    Settings,
    Timer,
    bench_env,
    copy_yaml_to,
    fresh_dir,
    median,
    spread,
    steady,
    step_tokens_per_second,
    tiny_model,
    tiny_task_data,
    tune_run,
)
from benchmarks.drivers import parse_result

NAME = "launcher"
TITLE = "1. Launcher overhead (finetune component, local backend, vs plain `tune run`)"


def _prepare(s: Settings, base: Path) -> dict:
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    from kfp_finetune.components.model_initialize.initialize import initialize_model

    dim = int(s.extra.get("launcher_dim", 256))
    layers = int(s.extra.get("launcher_layers", 4))
    model_dir = tiny_model(s.workdir, dim=dim, layers=layers, heads=4, kv_heads=2)
    data = tiny_task_data(s.workdir, rows=4000)
    workspace = base / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    ds = initialize_dataset(str(data), str(workspace), "tiny", dataset_type="instruct")
    model = initialize_model(str(model_dir), str(workspace), "tiny")
    steps = int(s.extra.get("launcher_steps", s.train_steps * 5))
    settings = {
        "method": "lora", "device": "cpu", "dtype": "fp32", "batch_size": 16, "gradient_accumulation_steps": 1, "max_steps_per_epoch": steps,
        "learning_rate": 3e-3, "seed": 0, "compile": False, "log_every_n_steps": 1,
    }  # fmt: skip
    return {
        "workspace": str(workspace),
        "train_metadata": ds.train_metadata,
        "model_metadata": model.metadata,
        "settings": settings,
        "run_id": "bench-launcher",
        "model": f"tiny llama3_2 dim {dim}, {layers} layers",
        "steps": steps,
    }


def _component_run(args: dict, base: Path) -> dict:
    args_file = base / "component-args.json"
    args_file.write_text(json.dumps(args))
    with Timer() as t:
        proc = subprocess.run(
            [PY, "-m", "benchmarks.drivers", "component", str(args_file)],
            cwd=ROOT, env=bench_env(), capture_output=True, text=True,
        )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"component run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = parse_result(proc.stdout)
    result["wall_seconds"] = t.seconds
    result["tokens_per_second"] = median(steady(step_tokens_per_second(Path(result["metrics_path"]))))
    return result


def run(s: Settings, echo=print) -> dict:
    base = fresh_dir(s.workdir / NAME)
    args = _prepare(s, base)
    comp_runs, plain_runs = [], []
    plain_dir = base / "plain-run"
    # An untimed warm-up run: fills the page cache and gives the plain side its YAML.
    first = _component_run(args, base)
    echo(f"  (warm-up) component: {first['wall_seconds']:.2f}s")
    # Start-up dominates these short runs and varies run to run: more repeats than elsewhere by default.
    repeats = int(s.extra.get("launcher_repeats", max(s.repeats, 5)))
    for repeat in range(repeats):
        order = ("component", "plain") if repeat % 2 == 0 else ("plain", "component")
        for side in order:
            if side == "component":
                result = _component_run(args, base)
                comp_runs.append(result)
                echo(f"  component: {result['wall_seconds']:.2f}s, {result['tokens_per_second']:.0f} tok/s")
            else:
                yaml_path = copy_yaml_to(Path(first["yaml_path"]), Path(first["run_dir"]), plain_dir)
                wall = tune_run(yaml_path, first["recipe"], plain_dir.parent / "plain.log", cwd=plain_dir)
                tps = median(steady(step_tokens_per_second(plain_dir / "logs" / "metrics.txt")))
                plain_runs.append({"wall_seconds": wall, "tokens_per_second": tps})
                echo(f"  plain tune run: {wall:.2f}s, {tps:.0f} tok/s")
    tps_ratio = median([c["tokens_per_second"] for c in comp_runs]) / median(
        [p["tokens_per_second"] for p in plain_runs]
    )
    wall_ratio = median([p["wall_seconds"] for p in plain_runs]) / median(
        [c["wall_seconds"] for c in comp_runs]
    )
    extra = median([c["wall_seconds"] for c in comp_runs]) - median([p["wall_seconds"] for p in plain_runs])
    return {
        "name": NAME,
        "title": TITLE,
        "target": "tokens/s ratio (component / plain) >= 0.98",
        "met": tps_ratio >= 0.98,
        "headline": f"tokens/s ratio {tps_ratio:.3f}; wall ratio (plain/component) {wall_ratio:.3f} "
        f"(component +{extra:.2f}s)",
        "results": {
            "tokens_per_second_ratio": round(tps_ratio, 4),
            "wall_ratio_plain_over_component": round(wall_ratio, 4),
            "component_extra_seconds": round(extra, 3),
            "component_tokens_per_second": spread([c["tokens_per_second"] for c in comp_runs]),
            "plain_tokens_per_second": spread([p["tokens_per_second"] for p in plain_runs]),
            "component_wall_seconds": spread([c["wall_seconds"] for c in comp_runs]),
            "plain_wall_seconds": spread([p["wall_seconds"] for p in plain_runs]),
            "component_training_subprocess_seconds": spread([c["training_wall_seconds"] for c in comp_runs]),
        },
        "settings": {
            "model": args["model"],
            "data": "tiny kit upper-case task, 4000 rows",
            "steps": args["steps"],
            "repeats": repeats,
            **args["settings"],
        },  # fmt: skip
    }
