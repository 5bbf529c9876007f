"""11. Our defaults vs an expert config vs Kubeflow's runtime settings on the tiny kit, on this CPU (issue 18 item 6:
"on this machine: defaults vs expert on the tiny kit (ratio)").

    python -m benchmarks.bench_tiny_defaults --plan   # seconds: each side's settings and the keys they differ in
    python -m benchmarks.run --only tiny_defaults     # the measurement (~4-5 min on 2 busy cores, 2 repeats)
    python -m benchmarks.bench_tiny_defaults          # the same alone (results.json in --output)

The GPU reference suite's three sides (bench_gpu_suite) on the tiny kit's Llama-3.2-style model (benchmarks.common
.tiny_model: dim 64, 2 layers, vocabulary 461; LoRA: `lora_finetune_single_device` with torchtune's
llama3_2/1B_lora_single_device) and 3,000 long-tailed instruct rows (benchmarks.common.long_tailed_rows: about 100
tokens mean, 99th percentile under 512, the longest ~1,200), 8 optimizer steps and seed 0 on every side.

Each side is planned for CUDA exactly as the GPU suite plans it (bench_gpu_suite.resolve_side, the data's token
lengths tokenized as training does), then moved to CPU changing only what cannot run here:
- defaults: what the fine-tune step resolves with device=cuda (defaults.py): packing, max_seq_len from the data,
  activation checkpointing from the memory model (80 GiB GPU), a ~16k-token micro-batch, accumulation keeping
  the base config's tokens per optimizer step;
- expert: what an expert sets by hand for this model and data (EXPERT): packing at 1,024 tokens (every row but the
  longest few whole), 16 x 1,024 = 16k tokens per micro-batch (as the defaults), one micro-batch per optimizer step,
  no activation checkpointing (a tiny model: nothing to save);
- kubeflow: torchtune's base config as Kubeflow's torchtune runtimes run it (unpacked, max_seq_len null, batch 4 x
  accumulation 8, compile off): our resolve without `device`, as in the GPU suite.
Moving to CPU (cpu_settings): device cpu; dtype fp32 (this machine's CPU has no bf16 instructions: a bf16 matmul
runs ~100x slower than fp32 here); compile off on every side (the defaults and the expert both compile on CUDA, but
inductor's compile time would dominate a run of a few steps on 2 cores); the model builder (a packed CUDA run's
compiles flex attention as torchtune main does, _shared/torchtune/flex_attention.py; packed CPU batches use no flex
attention); and what resolve does for every CPU run (resolve._apply_cpu: no peak-memory stats, no activation
offloading). Every other decision (packing, max_seq_len,
batch size, accumulation, activation checkpointing, warmup) is pinned to the CUDA plan's value.

Measured per run (`tune run` on the resolved YAML, gpu_suite_runs.timed_run): trained tokens/s (torchtune's
tokens_per_second_per_gpu, unmasked label tokens; median after two warm-up steps), processed tokens/s (packed:
batch x max_seq_len x accumulation per median step time; unpacked: the trained rate, a lower bound), seconds
from process start to the first logged step (torchtune tokenizes and packs the data before it). Sides alternate
order between repeats; medians over repeats. The ratios are of trained tokens/s (the useful work: packs of
different lengths and padded batches make processed rates incomparable); defaults/expert processed is also given.
On a shared machine one step's time can vary several-fold with other processes' load, so a least-disturbed rate
is reported beside the medians (least_disturbed: each step at its fastest repeat; same seed, same tokens).

A CPU's speed ranking is not a GPU's: here attention over longer packs costs relatively more and nothing is
memory-bound as on a GPU; this measures the defaults' data-side decisions (packing, max_seq_len, micro-batch),
not compile or activation checkpointing (off on every side here).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from benchmarks.bench_gpu_suite import (
    ON_CPU,
    Job,
    config_value,
    differing_keys,
    resolve_side,
    side_settings,
    token_lengths,
)
from benchmarks.common import (
    ROOT,
    Settings,
    fresh_dir,
    long_tailed_data,
    median,
    spread,
    tiny_model,
    write_json,
)
from benchmarks.gpu_suite_runs import timed_run

NAME = "tiny_defaults"
TITLE = "11. Defaults vs expert vs Kubeflow runtime on the tiny kit (CPU)"
TARGET = "report the ratio (the GPU goal is defaults >= 80 % of the expert's tokens/s)"
SIDES = ("defaults", "expert", "kubeflow")
MODEL = {"dim": 64, "layers": 2, "heads": 4, "kv_heads": 2}
ROWS, STEPS, REPEATS = 3000, 8, 2
EXPERT = {
    "packed": True, "max_seq_len": 1024, "compile": True, "batch_size": 16, "gradient_accumulation_steps": 1,
    "enable_activation_checkpointing": False, "enable_activation_offloading": False,
}  # fmt: skip
JOB = Job("tiny-llama3_2-lora", "tiny", "llama3_2", {}, "lora", 1, 1, EXPERT)
UNPACKED = "not measured: unpacked batches are padded to their longest row, which torchtune does not log"
# ON_CPU (the GPU suite's): what cannot run on this CPU, changed on every side; the rest is pinned to the CUDA plan.
PINNED = {
    "packed": ("dataset", "packed"), "max_seq_len": ("tokenizer", "max_seq_len"), "batch_size": ("batch_size",),
    "gradient_accumulation_steps": ("gradient_accumulation_steps",),
    "enable_activation_checkpointing": ("enable_activation_checkpointing",),
    "num_warmup_steps": ("lr_scheduler", "num_warmup_steps"), "learning_rate": ("optimizer", "lr"),
    "epochs": ("epochs",),
}  # fmt: skip


def cpu_settings(side: str, steps: int, cuda_plan: dict) -> dict:
    """The side's typed settings for this CPU: its CUDA settings with ON_CPU changed and PINNED copied from the
    CUDA plan's resolved config (a null stays unset: the base config's null)."""
    settings = {k: v for k, v in side_settings(JOB, side, steps).items() if k not in ON_CPU}
    pinned = {name: config_value(cuda_plan, path) for name, path in PINNED.items()}
    return {**settings, **{k: v for k, v in pinned.items() if v is not None}, **ON_CPU}


def resolve_cpu(side: str, model_dir: Path, data: Path, run_dir: Path, steps: int, cuda_plan: dict):
    from kfp_finetune.components._shared.torchtune.config import from_flat
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    return resolve_run(from_flat(cpu_settings(side, steps, cuda_plan)), model_dir, data, run_dir)


def fixtures(workdir: Path, rows: int) -> tuple[Path, Path]:
    return tiny_model(workdir, **MODEL), long_tailed_data(workdir, rows)


def plan(workdir: Path, model_dir: Path, data: Path, steps: int) -> dict[str, dict]:
    """Per side: the CUDA plan and the CPU run (resolved, written under workdir/plan and workdir/runs)."""
    lengths = token_lengths(JOB, model_dir, data, workdir, True, {})  # tokenized as training does
    sides = {}
    for side in SIDES:
        plan_dir, run_dir = workdir / "plan" / side, fresh_dir(workdir / "runs" / side)
        cuda = resolve_side(JOB, side, model_dir, data, plan_dir, steps, 80.0, lengths, write=False)
        cpu = resolve_cpu(side, model_dir, data, run_dir, steps, cuda.config)
        sides[side] = {
            "cuda": cuda, "cpu": cpu,
            "moved": differing_keys({"cuda": cuda.config, "cpu": cpu.config}, {"cuda": plan_dir, "cpu": run_dir}),
        }  # fmt: skip
    return sides


def summary(sides: dict[str, dict]) -> dict[str, dict]:
    """Per side: the settings that decide throughput, as the CPU runs them."""
    out = {}
    for side, s in sides.items():
        c = s["cpu"].config
        out[side] = {name: config_value(c, path) for name, path in PINNED.items()} | {
            "compile": c.get("compile"), "dtype": c.get("dtype"), "device": c.get("device"),
            "moved_from_cuda_plan": sorted(s["moved"]),
        }  # fmt: skip
    return out


def print_plan(sides: dict[str, dict], echo=print) -> None:
    rows = summary(sides)
    keys = [k for k in next(iter(rows.values())) if k != "moved_from_cuda_plan"]
    echo(f"{'key':32}" + "".join(f"{s:>12}" for s in SIDES))
    for key in keys:
        echo(f"{key:32}" + "".join(f"{json.dumps(rows[s][key]):>12}" for s in SIDES))
    for side in SIDES:
        echo(f"{side}: changed from its CUDA plan: {', '.join(rows[side]['moved_from_cuda_plan'])}")
    defaults = next((c for c in sides["defaults"]["cuda"].defaults if c.setting == "max_seq_len"), None)
    if defaults:
        echo(f"defaults' max_seq_len: {defaults.reason}")


def step_rates(metrics_path: Path, warm_up: int = 2) -> list[tuple[float, float]]:
    """(trained tokens/s, seconds) of each logged step after `warm_up`, in step order."""
    from kfp_finetune.components._shared.metrics_file import read_metrics_file
    from kfp_finetune.components.torchtune_finetune.throughput import STEP_SECONDS

    return [
        (s.tokens_per_second, s.values[STEP_SECONDS])
        for s in read_metrics_file(metrics_path)[warm_up:]
        if s.tokens_per_second and s.values.get(STEP_SECONDS)
    ]


def least_disturbed(repeats: list[list[tuple[float, float]]]) -> float:
    """Trained tokens/s with each step timed at its fastest repeat: same seed, so step i trains the same tokens in
    every repeat, and the fastest is the one other processes disturbed least. Sum of each step's tokens (median over
    repeats of rate x seconds) over the sum of its shortest time (tokens / best rate)."""
    tokens = seconds = 0.0
    for same_step in zip(*repeats, strict=False):
        step_tokens = median([rate * secs for rate, secs in same_step])
        tokens += step_tokens
        seconds += step_tokens / max(rate for rate, _ in same_step)
    return round(tokens / seconds, 1) if seconds else float("nan")


def run(s: Settings, echo=print) -> dict:
    """benchmarks.run's entry: the three sides, `repeats` times each (default 2), alternating order."""
    steps = int(s.extra.get("tiny_steps", STEPS))
    rows = int(s.extra.get("tiny_rows", ROWS))
    repeats = max(2, int(s.extra.get("tiny_repeats", REPEATS)))
    workdir = s.workdir / NAME
    model_dir, data = fixtures(workdir, rows)
    sides = plan(workdir, model_dir, data, steps)
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    for repeat in range(repeats):
        for side in SIDES if repeat % 2 == 0 else tuple(reversed(SIDES)):
            # A fresh folder per run (the same settings as the plan's CPU run): no metrics or checkpoints carried over.
            run_dir = fresh_dir(workdir / "runs" / f"{side}-{repeat + 1}")
            resolved = resolve_cpu(side, model_dir, data, run_dir, steps, sides[side]["cuda"].config)
            result = timed_run(resolved, run_dir.parent / f"{side}-{repeat + 1}.log")
            if "error" in result:
                raise RuntimeError(f"{side}: {result['error']}")
            result["step_rates"] = step_rates(resolved.metrics_path)
            runs[side].append(result)
            echo(f"  {side} #{repeat + 1}: {result['trained_tokens_per_second']:.0f} trained tok/s, "
                 f"first step at {result['first_step_seconds']:.1f}s")  # fmt: skip
    results: dict = {}
    for side in SIDES:
        results[side] = {
            key: spread([r[key] for r in runs[side]])
            for key in ("trained_tokens_per_second", "first_step_seconds")
        }
        # Unpacked batches are padded to their longest row and torchtune logs no padded count: not measured.
        packed = sides[side]["cpu"].config["dataset"].get("packed")
        results[side]["processed_tokens_per_second"] = (
            spread([r["processed_tokens_per_second"] for r in runs[side]]) if packed else UNPACKED
        )
        results[side]["least_disturbed_tokens_per_second"] = least_disturbed(
            [r["step_rates"] for r in runs[side]]
        )
    trained = {side: results[side]["trained_tokens_per_second"]["median"] for side in SIDES}
    calm = {side: results[side]["least_disturbed_tokens_per_second"] for side in SIDES}
    processed = {
        side: results[side]["processed_tokens_per_second"]["median"] for side in ("defaults", "expert")
    }
    results["defaults_vs_expert"] = round(trained["defaults"] / trained["expert"], 3)
    results["kubeflow_vs_expert"] = round(trained["kubeflow"] / trained["expert"], 3)
    results["defaults_vs_expert_processed"] = round(processed["defaults"] / processed["expert"], 3)
    results["defaults_vs_expert_least_disturbed"] = round(calm["defaults"] / calm["expert"], 3)
    results["kubeflow_vs_expert_least_disturbed"] = round(calm["kubeflow"] / calm["expert"], 3)
    results["configs"] = summary(sides)
    return {
        "name": NAME, "title": TITLE, "target": TARGET, "met": None,
        "headline": f"trained tokens/s defaults/expert {results['defaults_vs_expert']:.2f} (median; least "
                    f"disturbed {results['defaults_vs_expert_least_disturbed']:.2f}), kubeflow/expert "
                    f"{results['kubeflow_vs_expert']:.2f} (least disturbed "
                    f"{results['kubeflow_vs_expert_least_disturbed']:.2f}); medians {trained['defaults']:.0f} / "
                    f"{trained['expert']:.0f} / {trained['kubeflow']:.0f} tok/s",
        "results": results,
        "settings": {"model": f"tiny llama3_2 {MODEL}, LoRA", "rows": rows, "steps": steps, "repeats": repeats,
                     "on_cpu": ON_CPU, "median_of_steps": f"steps 3-{steps}"},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_tiny_defaults", description=__doc__.split("\n")[0]
    )
    p.add_argument("--plan", action="store_true", help="print each side's settings (no training; seconds)")
    p.add_argument("--workdir", default=str(ROOT / ".bench"), help="scratch folder (default .bench/)")
    p.add_argument(
        "--output", default=str(ROOT / ".bench" / "results-tiny-defaults"), help="results.json folder"
    )
    p.add_argument("--rows", type=int, default=ROWS, help=f"long-tailed rows (default {ROWS})")
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run (default {STEPS})")
    p.add_argument(
        "--repeats", type=int, default=REPEATS, help=f"runs per side, at least 2 (default {REPEATS})"
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workdir = Path(args.workdir).resolve()
    if args.plan:
        logging.disable(
            logging.INFO
        )  # the defaults' reasons, one line each: see `kfp-finetune resolve-config`
        try:
            model_dir, data = fixtures(workdir / NAME, args.rows)
            print_plan(plan(workdir / NAME, model_dir, data, args.steps))
        finally:
            logging.disable(logging.NOTSET)
        return 0
    extra = {"tiny_rows": str(args.rows), "tiny_steps": str(args.steps), "tiny_repeats": str(args.repeats)}
    report = run(Settings(workdir=workdir, extra=extra))
    write_json(Path(args.output) / "results.json", report)
    print(report["headline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
