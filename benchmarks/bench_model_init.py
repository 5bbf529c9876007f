"""4. Model initialize re-run: the second `initialize_model` with the same inputs (skip-if-present) vs the first.

Source: the small benchmark model's HF folder (a local path, the same files as measurement 6). Each repeat starts
from an empty workspace: cold run (list, copy, sha256 every file, verify, manifest), then the warm run (list,
compare the manifest's fingerprint and file sizes, skip). Both in this process.
"""

from __future__ import annotations

from benchmarks.common import Settings, Timer, fresh_dir, median, spread, tiny_model

NAME = "model_init"
TITLE = "4. Model initialize re-run (skip-if-present vs cold)"


def run(s: Settings, echo=print) -> dict:
    from kfp_finetune.components.model_initialize.initialize import initialize_model

    model_dir = tiny_model(s.workdir, s.big_dim, s.big_layers, s.big_heads, s.big_kv_heads)
    size = sum(p.stat().st_size for p in model_dir.rglob("*") if p.is_file())
    base = s.workdir / NAME
    cold, warm = [], []
    for _ in range(s.repeats):
        workspace = fresh_dir(base)
        with Timer() as t1:
            first = initialize_model(str(model_dir), str(workspace), "small")
        with Timer() as t2:
            second = initialize_model(str(model_dir), str(workspace), "small")
        assert not first.skipped and second.skipped
        cold.append(t1.seconds)
        warm.append(t2.seconds)
        echo(f"  cold {t1.seconds:.3f}s, re-run {t2.seconds:.4f}s ({100 * t2.seconds / t1.seconds:.2f}%)")
    fraction = median(warm) / median(cold)
    return {
        "name": NAME,
        "title": TITLE,
        "target": "re-run <= 5 % of cold",
        "met": fraction <= 0.05,
        "headline": f"re-run {median(warm) * 1000:.1f} ms vs cold {median(cold):.2f} s: {100 * fraction:.2f} %",
        "results": {
            "rerun_fraction_of_cold": round(fraction, 5),
            "cold_seconds": spread(cold),
            "rerun_seconds": spread(warm),
        },
        "settings": {"source": f"local folder, {size / 2**20:.1f} MiB", "repeats": s.repeats},
    }
