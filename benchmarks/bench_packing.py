"""5. Packing: trained tokens/s with `packed=True` vs `packed=False` on a long-tailed length distribution.

Data: instruct rows whose answer lengths are log-normal (median ~24 words, sigma 1, capped), so batches padded to
their longest row waste most of their compute. Same model, LoRA settings, batch size, max_seq_len (truncation
limit and pack size), seed and number of steps on both sides; only `dataset.packed` differs. Each side is a plain
`tune run` of a YAML resolved by the component's engine; sides alternate. tokens/s is torchtune's per-step
number (unmasked tokens only, first step skipped, median). torchtune packs the whole dataset before step 1, so
wall time (also reported) includes packing.
"""

from __future__ import annotations

from benchmarks.common import Settings, fresh_dir, long_tailed_data, median, spread, tiny_model, torchtune_run

NAME = "packing"
TITLE = "5. Packing (packed vs unpacked on long-tailed lengths)"


def run(s: Settings, echo=print) -> dict:
    dim = int(s.extra.get("packing_dim", 256))
    layers = int(s.extra.get("packing_layers", 4))
    model_dir = tiny_model(s.workdir, dim=dim, layers=layers, heads=4, kv_heads=2)
    data = long_tailed_data(s.workdir, rows=int(s.extra.get("packing_rows", 2000)))
    base = fresh_dir(s.workdir / NAME)
    settings = {
        "method": "lora", "batch_size": s.batch_size, "gradient_accumulation_steps": 1, "max_seq_len": s.seq_len, "max_steps_per_epoch": s.train_steps,
        "learning_rate": 3e-4, "num_warmup_steps": 0, "enable_activation_checkpointing": False,
    }  # fmt: skip
    runs: dict[bool, list[dict]] = {True: [], False: []}
    for repeat in range(s.repeats):
        for packed in (False, True) if repeat % 2 == 0 else (True, False):
            result = torchtune_run(model_dir, data, base / f"packed-{packed}", packed=packed, **settings)
            runs[packed].append(result)
            echo(
                f"  packed={packed}: {result['tokens_per_second']:.0f} tok/s, wall {result['wall_seconds']:.1f}s"
            )
    packed_tps = median([r["tokens_per_second"] for r in runs[True]])
    unpacked_tps = median([r["tokens_per_second"] for r in runs[False]])
    gain = packed_tps / unpacked_tps
    return {
        "name": NAME,
        "title": TITLE,
        "target": "report the gain (packed / unpacked tokens/s)",
        "met": None,
        "headline": f"packed {packed_tps:.0f} vs unpacked {unpacked_tps:.0f} trained tokens/s: gain x{gain:.2f}",
        "results": {
            "gain": round(gain, 4),
            "packed_tokens_per_second": spread([r["tokens_per_second"] for r in runs[True]]),
            "unpacked_tokens_per_second": spread([r["tokens_per_second"] for r in runs[False]]),
            "packed_wall_seconds": spread([r["wall_seconds"] for r in runs[True]]),
            "unpacked_wall_seconds": spread([r["wall_seconds"] for r in runs[False]]),
        },
        "settings": {
            "model": f"tiny llama3_2 dim {dim}, {layers} layers",
            "data": f"{data.name} (log-normal answer lengths)",
            "steps": s.train_steps,
            "repeats": s.repeats,
            **settings,
        },  # fmt: skip
    }
