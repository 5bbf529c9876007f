"""12. Resume (issue 26): the overhead of interval checkpoints, and the training time a preemption costs.

Model: the tiny kit's Llama-3.2 layout at `big_dim` x `big_layers` (full fine-tune: every weight and its AdamW
state is checkpointed — the heaviest case), CPU, `train_steps` x 3 optimizer steps of `batch_size` x `seq_len`.

- Overhead: the same run with `checkpoint_every_steps` = 0 (SIGTERM-only: nothing written unless stopped), 10, 5
  and 1; wall time from the first to the last step line, and each checkpoint's write time and size as recorded
  by recipe.py. Overhead = (wall with / wall without) - 1.
- Time lost per preemption: a run SIGTERMed after step K saves and exits; the retry's time from its start to its
  first new step is the restart cost (start-up, model load, state restore). With a grace period nothing trained is
  lost; without one (SIGKILL, node loss), the steps since the last interval checkpoint are trained again: on
  average half an interval. Lost = restart + interval / 2 x step time, per interval.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT, Settings, fresh_dir, median

NAME = "training_resume"
TITLE = "12. Resume: interval checkpoint overhead, time lost per preemption"
_WRITTEN = re.compile(r"checkpoint at step (\d+) .* written in ([\d.]+)s")
_STEP = re.compile(r"Step (\d+) \|")


def _resolved(model: Path, data: Path, run_dir: Path, steps: int, s: Settings, every: int):
    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    cfg = TorchtuneConfig(
        device="cpu", method="full", batch_size=s.batch_size, gradient_accumulation_steps=1, epochs=1,
        max_steps_per_epoch=steps, max_seq_len=s.seq_len, seed=0, checkpoint_every_steps=every,
        checkpoint_every_minutes=0, log_every_n_steps=1,
    )  # fmt: skip
    return resolve_run(cfg, model, data, run_dir)


def _train(run, kill_after: int | None = None) -> dict:
    """One `tune run` as the local backend runs it: step line times, checkpoint writes, exit code."""
    from kfp_finetune.components._shared.torchtune.resolve import tune_command

    command = tune_command(run.recipe, run.yaml_path)
    command[0] = str(Path(sys.executable).parent / "tune")
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=run.run_dir
    )
    steps, writes = {}, []
    for line in process.stdout:
        if match := _STEP.search(line):
            steps.setdefault(int(match.group(1)), time.perf_counter() - started)
            if kill_after == int(match.group(1)):
                process.send_signal(signal.SIGTERM)
        if match := _WRITTEN.search(line):
            writes.append(float(match.group(2)))
    return {"code": process.wait(), "steps": steps, "writes": writes, "wall": time.perf_counter() - started}


def run(s: Settings, echo=print) -> dict:
    sys.path.insert(0, str(ROOT))
    from kfp_finetune.components._shared.torchtune import resume
    from kfp_finetune.tiny.dataset import build_tiny_dataset
    from kfp_finetune.tiny.model import build_tiny_model

    base = fresh_dir(s.workdir / NAME)
    model = build_tiny_model(base / "model", dim=s.big_dim, num_layers=s.big_layers, num_heads=s.big_heads,
                             num_kv_heads=s.big_kv_heads)  # fmt: skip
    data = build_tiny_dataset(base / "data")["train.jsonl"]
    steps = s.train_steps * 3
    intervals = [0, 10, 5, 1]
    runs: dict[int, list[dict]] = {every: [] for every in intervals}
    sizes: dict[int, int] = {}
    for repeat in range(s.repeats):
        for every in intervals if repeat % 2 == 0 else intervals[::-1]:  # sides alternate
            run_dir = fresh_dir(base / f"run-{every}-{repeat}")
            outcome = _train(_resolved(model, data, run_dir, steps, s, every))
            if outcome["code"] != 0:
                raise RuntimeError(f"training with checkpoint_every_steps={every} failed ({outcome['code']})")
            first, last = outcome["steps"][1], outcome["steps"][steps]
            outcome["train_seconds"] = last - first
            runs[every].append(outcome)
            point = resume.latest(run_dir)
            if point is not None:
                sizes[every] = sum(p.stat().st_size for p in point.path.rglob("*") if p.is_file())
        echo(f"  repeat {repeat + 1}: " + ", ".join(
            f"every {e or '-'}: {runs[e][-1]['train_seconds']:.1f}s" for e in intervals))  # fmt: skip

    base_wall = median([r["train_seconds"] for r in runs[0]])
    step_seconds = base_wall / (steps - 1)
    overhead = {e: median([r["train_seconds"] for r in runs[e]]) / base_wall - 1 for e in intervals if e}
    write_seconds = median([w for e in intervals if e for r in runs[e] for w in r["writes"]])

    # Restart cost: SIGTERM after step K, then the retry's start to its first new step, vs a fresh start's.
    restarts, fresh_starts = [], [r["steps"][1] for r in runs[0]]
    for repeat in range(s.repeats):
        run_dir = fresh_dir(base / f"preempted-{repeat}")
        killed = _train(_resolved(model, data, run_dir, steps, s, 0), kill_after=steps // 2)
        if killed["code"] != 128 + signal.SIGTERM:
            raise RuntimeError(f"the SIGTERMed run exited {killed['code']}, not 143")
        point = resume.latest(run_dir)
        again = _train(_resolved(model, data, run_dir, steps, s, 0))
        restarts.append(again["steps"][point.step + 1])
    restart = median(restarts)
    lost = {e: restart + e / 2 * step_seconds for e in intervals if e}
    echo(f"  step {step_seconds:.2f}s, checkpoint write {write_seconds:.2f}s ({max(sizes.values()) / 2**20:.0f} MiB), "
         f"restart to first new step {restart:.1f}s (fresh start {median(fresh_starts):.1f}s)")  # fmt: skip
    return {
        "name": NAME,
        "title": TITLE,
        "target": "report: overhead per interval; training time lost per preemption (SIGTERM and SIGKILL)",
        "met": None,
        "settings": {
            "model": f"llama3_2 layout dim {s.big_dim}, {s.big_layers} layers, full fine-tune",
            "steps": steps,
            "batch": f"{s.batch_size} x {s.seq_len}",
            "repeats": s.repeats,
            "intervals": intervals,
        },  # fmt: skip
        "headline": (
            f"checkpoint every 10 / 5 / 1 steps: +{100 * overhead[10]:.1f} / +{100 * overhead[5]:.1f} / "
            f"+{100 * overhead[1]:.1f} % wall ({write_seconds:.2f} s a write, step {step_seconds:.2f} s); a "
            f"preemption with grace costs the restart, {restart:.1f} s; without, + half an interval of steps"
        ),
        "results": {
            "steps": steps,
            "step_seconds": step_seconds,
            "train_seconds": {e: [r["train_seconds"] for r in runs[e]] for e in intervals},
            "overhead": overhead,
            "checkpoint_write_seconds": write_seconds,
            "checkpoint_bytes": sizes,
            "restart_to_first_new_step_seconds": restarts,
            "fresh_start_to_first_step_seconds": fresh_starts,
            "lost_per_preemption_seconds": {
                "sigterm": restart,
                **{f"sigkill_every_{e}": v for e, v in lost.items()},
            },
        },
    }
