"""6. Efficiency vs the machine's limit: achieved training FLOP/s ÷ measured fp32 matmul peak.

Peak: `torch.mm` of two square fp32 matrices (default 2048) with torch's default thread count, the best of
several timed batches, measured before and after the training runs (the higher is used). Training: full and LoRA
fine-tunes of the small model (~30M parameters by default) with packed rows of `max_seq_len` tokens and
`train_on_input=True`, so nearly every processed token is a trained token. Achieved FLOP/s = k·N·(trained
tokens/s) with k = 6 (full) or 4 (LoRA: forward + activation gradients, no weight gradients), N = unique model
parameters (tied embedding/output counted once); attention's sequence-length term is not counted.
"""

from __future__ import annotations

import time

from benchmarks.common import (
    Settings,
    count_parameters,
    fresh_dir,
    long_tailed_data,
    median,
    spread,
    tiny_model,
    torchtune_run,
)

NAME = "efficiency"
TITLE = "6. Training efficiency vs fp32 matmul peak"
FLOPS_PER_TOKEN = {"full": 6, "lora": 4}


def matmul_peak(size: int = 2048, batches: int = 5, per_batch: int = 5) -> float:
    """Best fp32 torch.mm FLOP/s over `batches` timed batches."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):
        torch.mm(a, b)
    best = 0.0
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(per_batch):
            torch.mm(a, b)
        best = max(best, 2 * size**3 * per_batch / (time.perf_counter() - start))
    return best


def run(s: Settings, echo=print) -> dict:
    import torch

    model_dir = tiny_model(s.workdir, s.big_dim, s.big_layers, s.big_heads, s.big_kv_heads)
    params = count_parameters(model_dir)
    data = long_tailed_data(s.workdir, rows=int(s.extra.get("packing_rows", 2000)))
    base = fresh_dir(s.workdir / NAME)
    size = int(s.extra.get("matmul_size", 2048))
    peaks = [matmul_peak(size)]
    echo(
        f"  matmul peak: {peaks[0] / 1e9:.1f} GFLOP/s ({torch.get_num_threads()} threads), model {params / 1e6:.1f}M"
    )
    settings = {
        "batch_size": s.batch_size, "gradient_accumulation_steps": 1, "max_seq_len": s.seq_len, "max_steps_per_epoch": s.train_steps,
        "packed": True, "train_on_input": True, "learning_rate": 3e-4, "num_warmup_steps": 0,
        "enable_activation_checkpointing": False,
    }  # fmt: skip
    runs: dict[str, list[dict]] = {"full": [], "lora": []}
    for repeat in range(s.repeats):
        for method in ("full", "lora") if repeat % 2 == 0 else ("lora", "full"):
            result = torchtune_run(model_dir, data, base / method, method=method, **settings)
            runs[method].append(result)
            echo(f"  {method}: {result['tokens_per_second']:.0f} tok/s, wall {result['wall_seconds']:.1f}s")
    peaks.append(matmul_peak(size))
    peak = max(peaks)
    results: dict = {"parameters": params, "matmul_peak_gflops": spread([p / 1e9 for p in peaks])}
    for method, method_runs in runs.items():
        tps = median([r["tokens_per_second"] for r in method_runs])
        achieved = FLOPS_PER_TOKEN[method] * params * tps
        results[method] = {
            "tokens_per_second": spread([r["tokens_per_second"] for r in method_runs]),
            "achieved_gflops": round(achieved / 1e9, 3),
            "fraction_of_peak": round(achieved / peak, 4),
        }
    return {
        "name": NAME,
        "title": TITLE,
        "target": "report achieved FLOP/s ÷ measured fp32 matmul peak",
        "met": None,
        "headline": f"full {100 * results['full']['fraction_of_peak']:.1f} % and LoRA "
        f"{100 * results['lora']['fraction_of_peak']:.1f} % of a {peak / 1e9:.1f} GFLOP/s fp32 matmul peak "
        f"({params / 1e6:.1f}M parameters)",
        "results": results,
        "settings": {
            "model": f"tiny llama3_2 dim {s.big_dim}, {s.big_layers} layers, {s.big_heads} heads, "
            f"{s.big_kv_heads} kv heads",
            "matmul_size": size,
            "steps": s.train_steps,
            "repeats": s.repeats,
            "torch_threads": torch.get_num_threads(),
            **settings,
        },  # fmt: skip
    }
