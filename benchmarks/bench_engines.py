"""13. The two engines on the same tiny model and data, on this CPU (issue 28 item 7: "the same tiny model and data
through both engines on this machine (trained tokens/s, loss after N steps)").

    python -m benchmarks.run --only engines           # ~3-5 min on 2 cores
    python -m benchmarks.run --only engines --set engines_steps=16 --set engines_rows=2000
    python -m benchmarks.run --only engines --set engines_job=llama3.2-1b-lora-1gpu   # a GPU reference job

With `engines_job` (a job of the GPU suite, benchmarks/gpu_suite_jobs.py: its real model shape with random weights
and its long-tailed rows) each engine gets only what a user sets — model, data, method, device cuda and the steps
— and chooses everything else itself (micro-batch, max_seq_len, packing, checkpointing, learning rate, and on
several GPUs DDP or FSDP2); each side's choices are recorded beside its tokens/s. `engines_job=tiny` does the same
with the tiny model on the CPU (the mode's own check).

The fine-tune step's implementation (run_finetune, local backend, in a child process as benchmarks.drivers runs
it) trains the tiny kit's Llama-3.2-style model (benchmarks.common.tiny_model; both engines serve it) on the
long-tailed instruct rows (benchmarks.common.long_tailed_rows) once with `engine=torchtune` and once with
`engine=transformers`. Both get the same step settings — LoRA rank 16 / alpha 32, batch 8, max_seq_len 512,
learning rate 3e-3, seed 0, device cpu, fp32 (this CPU has no bf16 instructions), N optimizer steps — and
everything else from each engine's own defaults on CPU (torchtune: unpacked batches, its base config's LoRA
targets; transformers: rows grouped by length, LoRA on every linear layer). Measured: trained tokens/s (each
engine's `tokens_per_second_per_gpu`: label positions in the loss, prompts masked; median after the first step),
the loss at the last step and the mean of the last three, and the training process's wall time. Sides alternate
order between repeats; medians over repeats.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.common import (
    PY,
    ROOT,
    Settings,
    bench_env,
    fresh_dir,
    long_tailed_data,
    median,
    spread,
    steady,
    tiny_model,
)
from benchmarks.drivers import parse_result
from kfp_finetune.components._shared import engines

NAME = "engines"
TITLE = "13. The two engines on the same tiny model and data (CPU)"
ENGINES = ("torchtune", "transformers")


def _prepare(s: Settings, base: Path) -> dict:
    from benchmarks import gpu_suite_jobs
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    from kfp_finetune.components.model_initialize.initialize import initialize_model

    rows = int(s.extra.get("engines_rows", 2000))
    steps = int(s.extra.get("engines_steps", s.train_steps))
    job_name = str(s.extra.get("engines_job", ""))
    if job_name and job_name != "tiny":
        job = next((job for job in gpu_suite_jobs.JOBS if job.name == job_name), None)
        if job is None:
            raise ValueError(
                f"engines_job={job_name}: not a GPU suite job ({', '.join(j.name for j in gpu_suite_jobs.JOBS)})"
            )
        model_dir = gpu_suite_jobs.model_folder(s.workdir, job, weights=True)
        data = gpu_suite_jobs.suite_data(s.workdir, rows)
        settings = {"method": job.method, "device": "cuda", "max_steps_per_epoch": steps, "seed": 0}
    else:
        model_dir = tiny_model(s.workdir, dim=64, layers=2, heads=4, kv_heads=2)
        data = long_tailed_data(s.workdir, rows=rows)
        settings = {
            "method": "lora",
            "device": "cpu",
            "dtype": "fp32",
            "max_steps_per_epoch": steps,
            "seed": 0,
        }
        if not job_name:  # the same explicit settings for both engines
            settings |= {"batch_size": 8, "gradient_accumulation_steps": 1, "max_seq_len": 512,
                         "learning_rate": 3e-3, "lora_rank": 16, "lora_alpha": 32.0}  # fmt: skip
    workspace = base / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    ds = initialize_dataset(str(data), str(workspace), "rows", dataset_type="instruct")
    model = initialize_model(str(model_dir), str(workspace), job_name or "tiny")
    return {"workspace": str(workspace), "train_metadata": ds.train_metadata, "model_metadata": model.metadata,
            "settings": settings, "steps": steps, "model": job_name or "tiny llama3_2 dim 64, 2 layers"}  # fmt: skip


def _side(args: dict, engine: str, base: Path, repeat: int) -> dict:
    from kfp_finetune.components._shared.metrics_file import read_metrics_file

    args_file = base / f"{engine}-{repeat}.json"
    args_file.write_text(json.dumps({**args, "engine": engine, "run_id": f"bench-{engine}-{repeat}"}))
    proc = subprocess.run(
        [PY, "-m", "benchmarks.drivers", "component", str(args_file)],
        cwd=ROOT, env=bench_env(), capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"{engine} run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = parse_result(proc.stdout)
    steps = read_metrics_file(Path(result["metrics_path"]))
    face = engines.face(engine)
    chosen = dict(face.hyperparameters(face.read_resolved_config(result["run_dir"])))
    losses = [s.loss for s in steps if s.loss is not None]
    return {
        "tokens_per_second": median(steady([s.tokens_per_second for s in steps if s.tokens_per_second])),
        "last_loss": losses[-1],
        "last3_loss": sum(losses[-3:]) / len(losses[-3:]),
        "steps": len(steps),
        "training_wall_seconds": result["training_wall_seconds"],
        "trained_with": {label: chosen.get(label) for label in _CHOICES},
    }


#: What each side's run trained with (its face's hyperparameters), recorded with its results.
_CHOICES = ("batch size", "gradient accumulation steps", "max sequence length", "packed", "learning rate")


def run(s: Settings, echo=print) -> dict:
    base = fresh_dir(s.workdir / NAME)
    args = _prepare(s, base)
    runs: dict[str, list[dict]] = {engine: [] for engine in ENGINES}
    for repeat in range(s.repeats):
        for engine in ENGINES if repeat % 2 == 0 else tuple(reversed(ENGINES)):
            found = _side(args, engine, base, repeat)
            runs[engine].append(found)
            echo(f"  {engine}: {found['tokens_per_second']:.0f} tok/s, loss {found['last_loss']:.3f} "
                 f"after {found['steps']} steps, {found['training_wall_seconds']:.1f}s")  # fmt: skip
    summary = {
        engine: {
            "tokens_per_second": spread([r["tokens_per_second"] for r in found]),
            "last_loss": median([r["last_loss"] for r in found]),
            "last3_loss": median([r["last3_loss"] for r in found]),
            "training_wall_seconds": spread([r["training_wall_seconds"] for r in found]),
            "trained_with": found[0]["trained_with"],
        }
        for engine, found in runs.items()
    }
    ratio = (
        summary["transformers"]["tokens_per_second"]["median"]
        / summary["torchtune"]["tokens_per_second"]["median"]
    )
    return {
        "name": NAME,
        "title": TITLE,
        "headline": f"trained tokens/s transformers/torchtune {ratio:.2f}; loss after {args['steps']} steps "
        f"{summary['torchtune']['last_loss']:.3f} (torchtune) vs {summary['transformers']['last_loss']:.3f} "
        "(transformers)",
        "results": {"tokens_per_second_ratio": round(ratio, 4), **summary},
        "settings": {
            "model": args["model"],
            "data": "long-tailed instruct rows",
            "repeats": s.repeats,
            **args["settings"],
        },  # fmt: skip
    }
