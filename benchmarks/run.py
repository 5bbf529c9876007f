"""Run the benchmark suite and write `results.json` + `results.md`.

    python -m benchmarks.run                      # all 11 measurements, default sizes (~10-15 min on 2 quiet cores)
    python -m benchmarks.run --quick              # smaller sizes, 2 repeats (a few minutes; noisier)
    python -m benchmarks.run --only launcher,peer --repeats 5 --steps 20
    python -m benchmarks.run --max-load 1.0       # wait (up to --wait-timeout s) for a quiet machine first

Names: launcher, orchestration, dataset_init, model_init, model_resume, packing, efficiency, peer, export,
gpu_suite (without GPUs: the plan only, every job skipped), tiny_defaults (the GPU suite's three sides on the tiny
kit on CPU: defaults vs expert vs Kubeflow runtime; `--set tiny_steps=8 --set tiny_rows=3000 --set tiny_repeats=2`),
training_resume, engines (the torchtune and transformers engines on the same tiny model and data).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

from benchmarks.common import ROOT, Settings, load_average, machine, versions, wait_for_quiet, write_json

BENCHMARKS = {
    "launcher": "benchmarks.bench_launcher",
    "orchestration": "benchmarks.bench_orchestration",
    "dataset_init": "benchmarks.bench_dataset_init",
    "model_init": "benchmarks.bench_model_init",
    "model_resume": "benchmarks.bench_model_resume",
    "packing": "benchmarks.bench_packing",
    "efficiency": "benchmarks.bench_efficiency",
    "peer": "benchmarks.bench_peer",
    "export": "benchmarks.bench_export",
    "gpu_suite": "benchmarks.bench_gpu_suite",
    "tiny_defaults": "benchmarks.bench_tiny_defaults",
    "training_resume": "benchmarks.bench_training_resume",
    "engines": "benchmarks.bench_engines",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="comma-separated names (default: all)")
    p.add_argument("--repeats", type=int, default=3, help="runs per side; medians are reported (default 3)")
    p.add_argument("--quick", action="store_true", help="small sizes and at most 2 repeats")
    p.add_argument("--workdir", default=str(ROOT / ".bench"), help="scratch folder (default .bench/)")
    p.add_argument("--output", default=str(ROOT / ".bench" / "results"), help="folder for results.json/.md")
    p.add_argument("--rows", type=int, default=None, help="JSONL rows for dataset_init (default 1,000,000)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 12)")
    p.add_argument("--seq-len", type=int, default=None, help="max_seq_len for packing/efficiency/peer (256)")
    p.add_argument("--batch-size", type=int, default=None, help="batch size for packing/efficiency/peer (4)")
    p.add_argument("--dim", type=int, default=None, help="hidden size of the small model (512)")
    p.add_argument("--layers", type=int, default=None, help="layers of the small model (8)")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="benchmark-specific knob, e.g. launcher_steps=60, pipeline_steps=10, num_proc=2, matmul_size=2048",
    )  # fmt: skip
    p.add_argument(
        "--max-load", type=float, default=0.0, help="wait until the 1-min load average is below this"
    )
    p.add_argument("--wait-timeout", type=float, default=1800.0, help="longest wait for --max-load (seconds)")
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace) -> Settings:
    extra = {}
    for item in args.set:
        key, _, value = item.partition("=")
        extra[key] = value
    s = Settings(
        workdir=Path(args.workdir).resolve(), repeats=args.repeats, quick=args.quick, extra=extra
    ).scaled()
    for field, value in (
        ("dataset_rows", args.rows), ("train_steps", args.steps), ("seq_len", args.seq_len),
        ("batch_size", args.batch_size), ("big_dim", args.dim), ("big_layers", args.layers),
    ):  # fmt: skip
        if value is not None:
            setattr(s, field, value)
    return s


def _fmt(value) -> str:
    if isinstance(value, dict) and "median" in value:
        runs = ", ".join(f"{r:g}" for r in value["runs"])
        return f"{value['median']:g} (runs: {runs})"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return "`" + json.dumps(value, default=str) + "`"
    return str(value)


def render_markdown(report: dict) -> str:
    lines = [
        "# kfp-finetune benchmark results",
        "",
        f"- date: {report['started']} → {report['finished']} (UTC)",
        f"- machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, "
        f"{report['machine']['memory_gib']} GiB, torch threads {report['machine']['torch_threads']}",
        f"- load average (1/5/15 min) at start {report['load_start']}, at end {report['load_end']}; "
        f"per benchmark below",
        f"- command: `{report['command']}`",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        "| measurement | target | result | met |",
        "| --- | --- | --- | --- |",
    ]
    for r in report["benchmarks"]:
        met = {True: "yes", False: "**no**", None: "n/a (reported)"}.get(r.get("met"), "error")
        lines.append(
            f"| {r['title']} | {r.get('target', '')} | {r.get('headline', r.get('error', ''))} | {met} |"
        )
    for r in report["benchmarks"]:
        lines += ["", f"## {r['title']}", ""]
        if "error" in r:
            lines += ["```", r["error"][-3000:], "```"]
            continue
        lines.append(f"- load average before / after: {r['load_before']} / {r['load_after']}; "
                     f"took {r['seconds']:.0f} s")  # fmt: skip
        lines += [f"- **{r['headline']}**", "", "| result | value |", "| --- | --- |"]
        for key, value in r["results"].items():
            if isinstance(value, dict) and "median" not in value:
                for sub, subvalue in value.items():
                    lines.append(f"| {key}.{sub} | {_fmt(subvalue)} |")
            else:
                lines.append(f"| {key} | {_fmt(value)} |")
        lines += ["", "Settings: " + ", ".join(f"{k}={_fmt(v)}" for k, v in r["settings"].items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; choose from {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    s = settings_from(args)
    s.workdir.mkdir(parents=True, exist_ok=True)
    if args.max_load:
        wait_for_quiet(args.max_load, args.wait_timeout)
    now = lambda: dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    report = {
        "started": now(),
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "versions": versions(),
        "load_start": [round(x, 2) for x in load_average()],
        "settings": {k: str(v) for k, v in vars(s).items()},
        "benchmarks": [],
    }
    out = Path(args.output)
    failed = False
    for name in names:
        print(f"== {name}", flush=True)
        if args.max_load:
            wait_for_quiet(args.max_load, args.wait_timeout)
        load_before = [round(x, 2) for x in load_average()]
        started = time.perf_counter()
        try:
            result = importlib.import_module(BENCHMARKS[name]).run(s, echo=lambda m: print(m, flush=True))
        except Exception:  # noqa: BLE001 - one failing benchmark must not hide the others' numbers
            failed = True
            result = {"name": name, "title": name, "error": traceback.format_exc()}
            print(result["error"], file=sys.stderr, flush=True)
        result["load_before"], result["load_after"] = load_before, [round(x, 2) for x in load_average()]
        result["seconds"] = time.perf_counter() - started
        report["benchmarks"].append(result)
        print(f"   {result.get('headline', 'FAILED')}", flush=True)
        report["finished"], report["load_end"] = now(), [round(x, 2) for x in load_average()]
        write_json(out / "results.json", report)  # after every benchmark, so a stop keeps what was measured
        (out / "results.md").write_text(render_markdown(report))
    print(f"results: {out / 'results.md'} and {out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
