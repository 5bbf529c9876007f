"""13. The two engines on the same tiny model and data, on this CPU (issue 28 item 7: "the same tiny model and data
through both engines on this machine (trained tokens/s, loss after N steps)").

    python -m benchmarks.run --only engines           # ~3-5 min on 2 cores
    python -m benchmarks.run --only engines --set engines_steps=16 --set engines_rows=2000

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

NAME = "engines"
TITLE = "13. The two engines on the same tiny model and data (CPU)"
ENGINES = ("torchtune", "transformers")


def _prepare(s: Settings, base: Path) -> dict:
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    from kfp_finetune.components.model_initialize.initialize import initialize_model

    model_dir = tiny_model(s.workdir, dim=64, layers=2, heads=4, kv_heads=2)
    data = long_tailed_data(s.workdir, rows=int(s.extra.get("engines_rows", 2000)))
    workspace = base / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    ds = initialize_dataset(str(data), str(workspace), "rows", dataset_type="instruct")
    model = initialize_model(str(model_dir), str(workspace), "tiny")
    steps = int(s.extra.get("engines_steps", s.train_steps))
    settings = {
        "method": "lora", "device": "cpu", "dtype": "fp32", "batch_size": 8, "gradient_accumulation_steps": 1,
        "max_seq_len": 512, "max_steps_per_epoch": steps, "learning_rate": 3e-3, "seed": 0, "lora_rank": 16,
        "lora_alpha": 32.0,
    }  # fmt: skip
    return {"workspace": str(workspace), "train_metadata": ds.train_metadata, "model_metadata": model.metadata,
            "settings": settings, "steps": steps}  # fmt: skip


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
    losses = [s.loss for s in steps if s.loss is not None]
    return {
        "tokens_per_second": median(steady([s.tokens_per_second for s in steps if s.tokens_per_second])),
        "last_loss": losses[-1],
        "last3_loss": sum(losses[-3:]) / len(losses[-3:]),
        "steps": len(steps),
        "training_wall_seconds": result["training_wall_seconds"],
    }


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
            "model": "tiny llama3_2 dim 64, 2 layers",
            "data": "long-tailed instruct rows",
            "repeats": s.repeats,
            **args["settings"],
        },  # fmt: skip
    }
