"""5. Packing: trained tokens/s with `packed=True` vs `packed=False` on a long-tailed length distribution.

Data: instruct rows whose answer lengths are log-normal (median ~24 words, sigma 1, capped), so batches padded to
their longest row waste most of their compute. Same model, LoRA settings, batch size, max_seq_len (truncation
limit and pack size), seed and number of steps on both sides; only `dataset.packed` differs. Each side is a plain
`tune run` of a YAML resolved by the component's engine; sides alternate. tokens/s is torchtune's per-step
number (unmasked tokens only, first step skipped, median). torchtune packs the whole dataset before step 1, so
wall time (also reported) includes packing.

Part 2 ("once", issue 18): dataset-initialize's tokenize-and-pack step (_shared/torchtune/packing.py) on CPU.
- Packing rate: `pack_rows` rows (default 1M) tokenized by torchtune's own instruct builder with the tiny kit's
  tokenizer in `pack_procs` processes (default 2) and packed (max_seq_len from the data): rows/s, for the tiny
  kit's task rows (about 12 tokens) and for long-tailed rows (median about 80 tokens). Target: >= 20k rows/s.
- Time from process start to the end of step 1 (`tune run`, 1 step, wall): training on the packs vs torchtune
  packing `start_rows` long-tailed rows itself (tokenized and packed in the trainer process, on every rank).
  Same model, data, max_seq_len, seed.
Only part 2: `--only packing --set packing_parts=once`.

Part 3 ("fill", issue 27): how full dataset-initialize's packs of whole rows are, greedy in row order (the packer
before bin_packing.py) vs best-fit decreasing (bin_packing.py), at max_seq_len 1024 / 2048 / 4096 / 8192, on the
GPU suite's rows (bench_gpu_suite.suite_data: `fill_rows`, default 20,000) tokenized by torchtune's instruct builder
with the tiny kit's llama3_2 tokenizer; a row longer than the pack counts as cut to it. Fill: the rows' tokens over
packs x max_seq_len. Also the planning rate (rows/s) of both for `fill_plan_rows` (default 1M) lengths drawn from
those, and dataset-initialize's whole pack step (`pack_split`, tokenizing included) on the suite's rows at 2048:
its packs (the plan's, as rows are cut by the tokenizer) and seconds. Only part 3: `--only packing --set packing_parts=fill`.
Part 4 ("procs", issue 27): dataset-initialize's tokenize-and-pack rate against its number of processes.
- `procs_rows` rows (default 200k) of each kind (tiny kit task rows, long-tailed rows), tokenized and packed as
  in part 2 with `procs_counts` processes (default: 1, 2, this machine's CPUs and twice them, which shows what
  oversubscribing the CPUs costs); counts alternate order between repeats. rows/s of the whole pack_split.
- Memory: each run is a fresh spawned interpreter; its peak RSS (the step) and the largest peak RSS of its
  tokenizing processes (forks: the pages they share with the step copy on write count in full, so this is an
  upper bound of what one more process costs) — the figure behind _shared/cpus.py's PROCESS_MEMORY.
Only part 4: `--only packing --set packing_parts=procs`.
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.common import (
    Settings,
    fresh_dir,
    long_tailed_data,
    long_tailed_rows,
    median,
    spread,
    tiny_model,
    torchtune_run,
    tune_run,
)

NAME = "packing"
TITLE = "5. Packing (packed vs unpacked on long-tailed lengths)"


def run(s: Settings, echo=print) -> dict:
    parts = str(s.extra.get("packing_parts", "gain,once,fill")).split(",")
    result = (
        run_gain(s, echo)
        if "gain" in parts
        else {"name": NAME, "title": TITLE, "results": {}, "settings": {}}
    )
    if "procs" in parts:
        procs = run_procs(s, echo)
        result["results"]["procs"] = procs
        rates = ", ".join(f"{n}: {r['median']:.0f}" for n, r in procs["long_tailed_rows_per_second"].items())
        headline = f"tokenize + pack, long-tailed rows/s by processes: {rates}"
        result["headline"] = f"{result['headline']}; {headline}" if result.get("headline") else headline
    if "once" in parts:
        once = run_once(s, echo)
        result["results"]["once"] = once
        headline = (
            f"pack once: {once['tiny_rows_per_second']:.0f} rows/s (tiny kit rows), "
            f"{once['long_tailed_rows_per_second']:.0f} rows/s (long-tailed); start to step 1 "
            f"{once['start_to_step1_packs_seconds']['median']:.1f}s on packs vs "
            f"{once['start_to_step1_torchtune_seconds']['median']:.1f}s torchtune packing"
        )
        result["headline"] = f"{result['headline']}; {headline}" if result.get("headline") else headline
        result.setdefault("target", ">= 20k rows/s packing on 2 cores (tiny tokenizer)")
        result["met"] = once["tiny_rows_per_second"] >= 20_000
    if "fill" in parts:
        fill = run_fill(s, echo)
        result["results"]["fill"] = fill
        headline = "fill greedy -> best-fit decreasing: " + ", ".join(
            f"{n} {f['greedy']:.3f} -> {f['best_fit_decreasing']:.3f}" for n, f in fill["fill"].items()
        )
        result["headline"] = f"{result['headline']}; {headline}" if result.get("headline") else headline
        result.setdefault("target", ">= 0.98 of each pack filled at max_seq_len 2048-8192 (GPU suite's rows)")
        if result.get("met") is not False:
            result["met"] = all(
                fill["fill"][n]["best_fit_decreasing"] >= 0.98 for n in ("2048", "4096", "8192")
            )
    return result


FILL_LENGTHS = (1024, 2048, 4096, 8192)


def _greedy_packs(lengths, max_seq_len: int) -> int:
    """The number of packs of the greedy in-order packer bin_packing.py replaced (torchtune's PackedDataset with
    split_across_pack=False): a pack closes when the next row does not fit."""
    packs, filled = 0, max_seq_len
    for n in lengths.tolist():
        if filled + n > max_seq_len:
            packs, filled = packs + 1, 0
        filled += n
    return packs


def run_fill(s: Settings, echo=print) -> dict:
    import numpy as np

    from benchmarks.bench_gpu_suite import suite_data
    from kfp_finetune.components._shared.bin_packing import plan_packs
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
    from kfp_finetune.components._shared.torchtune.packing import pack_split, sft_node, tokenize

    rows = int(s.extra.get("fill_rows", 20_000))
    plan_rows = int(s.extra.get("fill_plan_rows", 1_000_000))
    model_dir = tiny_model(s.workdir)
    base = fresh_dir(s.workdir / f"{NAME}-fill")
    data = _parquet(s.workdir / "data" / f"suite-{rows}.parquet", _jsonl_rows(suite_data(s.workdir, rows)))
    node = sft_node({"dataset_type": "instruct", "data_style": "input_output"}, [str(data)])
    tokenizer_node = inspect_model_dir(model_dir).tokenizer_node(None)
    lengths = tokenize(tokenizer_node, node, num_proc=2).lengths()
    echo(f"  {rows} suite rows: tokens p50 {int(np.median(lengths))}, max {int(lengths.max())}")
    fill, rates = {}, {}
    drawn = np.random.default_rng(0).choice(lengths, plan_rows)
    for max_seq_len in FILL_LENGTHS:
        cut = np.minimum(lengths, max_seq_len)
        greedy, best = _greedy_packs(cut, max_seq_len), len(plan_packs(cut, max_seq_len))
        fill[str(max_seq_len)] = {
            "greedy": round(float(cut.sum() / (greedy * max_seq_len)), 4),
            "best_fit_decreasing": round(float(cut.sum() / (best * max_seq_len)), 4),
            "greedy_packs": greedy,
            "best_fit_decreasing_packs": best,
        }
        cut = np.minimum(drawn, max_seq_len)
        started = time.perf_counter()
        _greedy_packs(cut, max_seq_len)
        greedy_seconds = time.perf_counter() - started
        started = time.perf_counter()
        plan_packs(cut, max_seq_len)
        best_seconds = time.perf_counter() - started
        rates[str(max_seq_len)] = {
            "greedy_rows_per_second": round(plan_rows / greedy_seconds),
            "best_fit_decreasing_rows_per_second": round(plan_rows / best_seconds),
        }
        echo(
            f"  max_seq_len {max_seq_len}: fill {fill[str(max_seq_len)]}, {plan_rows} rows {rates[str(max_seq_len)]}"
        )
    result = pack_split(tokenizer_node, node, base / "packs", max_seq_len=2048, num_proc=2)
    cut = np.minimum(lengths, 2048)
    return {
        "rows": rows,
        "data": f"bench_gpu_suite.suite_data ({data.name}), tiny llama3_2 tokenizer, instruct builder",
        "token_stats": dict(
            zip(("p50", "p90", "p99", "max"), np.percentile(lengths, [50, 90, 99, 100]).tolist(), strict=True)
        ),
        "fill": fill,
        "plan_rows": plan_rows,
        "plan_rates": rates,
        "pack_split_2048": {
            "rows": result.stats["count"],
            "packs": result.num_packs,
            "truncated_rows": result.truncated_rows,
            "fill": round(float(cut.sum() / (result.num_packs * 2048)), 4),
            "tokenize_seconds": round(result.tokenize_seconds, 2),
            "pack_seconds": round(result.pack_seconds, 2),
        },  # fmt: skip
    }


def _jsonl_rows(path: Path):
    import json

    with path.open() as f:
        yield from (json.loads(line) for line in f)


def _parquet(path: Path, rows) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


def _pack_rate(model_dir: Path, data: Path, out: Path, procs: int) -> dict:
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
    from kfp_finetune.components._shared.torchtune.packing import pack_split, sft_node

    model = inspect_model_dir(model_dir)
    node = sft_node({"dataset_type": "instruct", "data_style": "input_output"}, [str(data)])
    started = time.monotonic()
    result = pack_split(
        model.tokenizer_node(None), node, fresh_dir(out), num_proc=procs,
        max_position_embeddings=model.hf_config.get("max_position_embeddings"),
    )  # fmt: skip
    wall = time.monotonic() - started
    rows = result.stats["count"]
    return {
        "rows": rows, "seconds": round(wall, 2), "rows_per_second": round(rows / wall),
        "tokenize_seconds": round(result.tokenize_seconds, 2), "pack_seconds": round(result.pack_seconds, 2),
        "packs": result.num_packs, "max_seq_len": result.max_seq_len, "token_stats": result.stats,
    }  # fmt: skip


def _measured_pack_rate(model_dir: Path, data: Path, out: Path, procs: int) -> dict:
    """_pack_rate in this (spawned) interpreter, with its peak RSS and its processes' largest, in MiB."""
    import resource

    rate = _pack_rate(model_dir, data, out, procs)
    return {
        **rate,
        "step_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
    }


def run_procs(s: Settings, echo=print) -> dict:
    import multiprocessing
    import os
    import random
    from concurrent.futures import ProcessPoolExecutor

    from kfp_finetune.tiny.dataset import make_example

    rows = int(s.extra.get("procs_rows", 200_000))
    cpus = len(os.sched_getaffinity(0))
    counts = sorted({int(c) for c in str(s.extra.get("procs_counts", f"1,2,{cpus},{2 * cpus}")).split(",")})
    model_dir = tiny_model(s.workdir)
    base = fresh_dir(s.workdir / f"{NAME}-procs")
    rng = random.Random(0)
    tiny_rows = ({"input": i, "output": o} for i, o in (make_example(rng) for _ in range(rows)))
    data = {
        "tiny": _parquet(s.workdir / "data" / f"tiny-task-{rows}.parquet", tiny_rows),
        "long_tailed": _parquet(
            s.workdir / "data" / f"long-tailed-{rows}.parquet", long_tailed_rows(rows, 0)
        ),
    }
    runs: dict[str, dict[int, list[dict]]] = {kind: {n: [] for n in counts} for kind in data}
    spawn = multiprocessing.get_context("spawn")
    for repeat in range(s.repeats):
        for n in counts if repeat % 2 == 0 else counts[::-1]:
            for kind, path in data.items():
                # A fresh interpreter per run: its peak RSS is this run's alone.
                with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                    run = pool.submit(_measured_pack_rate, model_dir, path, base / f"{kind}-{n}", n).result()
                runs[kind][n].append(run)
                echo(f"  {kind}, {n} processes: {run}")

    def per_count(kind: str, summarize) -> dict:
        return {n: summarize(runs[kind][n]) for n in counts}

    return {
        "rows": rows,
        "cpus": cpus,
        "process_counts": counts,
        **{
            f"{kind}_rows_per_second": per_count(kind, lambda rs: spread([r["rows_per_second"] for r in rs]))
            for kind in data
        },
        **{
            key: {kind: per_count(kind, lambda rs, k=key: max(r[k] for r in rs)) for kind in data}
            for key in ("step_peak_rss_mib", "process_peak_rss_mib")
        },
        "runs": runs,
    }


def run_once(s: Settings, echo=print) -> dict:
    import random

    from kfp_finetune.components._shared.contract import DatasetSplit
    from kfp_finetune.components._shared.torchtune.config import from_flat
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    from kfp_finetune.components.torchtune_finetune.packs import use_packs
    from kfp_finetune.tiny.dataset import make_example

    rows = int(s.extra.get("pack_rows", 1_000_000))
    procs = int(s.extra.get("pack_procs", 2))
    start_rows = int(s.extra.get("start_rows", 50_000))
    model_dir = tiny_model(s.workdir)
    base = fresh_dir(s.workdir / f"{NAME}-once")
    rng = random.Random(0)
    tiny_rows = ({"input": i, "output": o} for i, o in (make_example(rng) for _ in range(rows)))
    tiny = _parquet(s.workdir / "data" / f"tiny-task-{rows}.parquet", tiny_rows)
    rates = {"tiny": _pack_rate(model_dir, tiny, base / "tiny", procs)}
    echo(f"  tiny kit rows: {rates['tiny']}")
    tailed = _parquet(s.workdir / "data" / f"long-tailed-{rows}.parquet", long_tailed_rows(rows, 0))
    rates["long_tailed"] = _pack_rate(model_dir, tailed, base / "tailed", procs)
    echo(f"  long-tailed rows: {rates['long_tailed']}")

    # Start to step 1: dataset-initialize's packs vs torchtune's own packing in the trainer.
    data = long_tailed_data(s.workdir, rows=start_rows)
    init_started = time.monotonic()
    init = initialize_dataset(
        str(data), str(base / "ws"), base_model_path=model_dir, max_seq_len=s.seq_len, num_proc=procs
    )
    init_seconds = time.monotonic() - init_started
    split = DatasetSplit.from_metadata(init.train_metadata, input_name="train_data")
    values = {
        "device": "cpu", "dtype": "fp32", "seed": 0, "compile": False, "log_every_n_steps": 1, "method": "lora",
        "batch_size": s.batch_size, "max_seq_len": s.seq_len, "packed": True, "max_steps_per_epoch": 1,
    }  # fmt: skip
    walls: dict[str, list[float]] = {"packs": [], "torchtune": []}
    for repeat in range(s.repeats):
        for side in ("torchtune", "packs") if repeat % 2 == 0 else ("packs", "torchtune"):
            run_dir = fresh_dir(base / f"run-{side}")
            hook = (lambda c: use_packs(c, split, base / "ws")) if side == "packs" else None
            resolved = resolve_run(from_flat(values), model_dir, init.path / "train", run_dir, packs=hook)
            wall = tune_run(resolved.yaml_path, resolved.recipe, base / f"{side}-{repeat}.log", cwd=run_dir)
            walls[side].append(wall)
            echo(f"  start to step 1, {side}: {wall:.1f}s")
    return {
        "pack_rows": rows,
        "processes": procs,
        "tiny_rows_per_second": rates["tiny"]["rows_per_second"],
        "long_tailed_rows_per_second": rates["long_tailed"]["rows_per_second"],
        "rates": rates,
        "start_rows": start_rows,
        "dataset_initialize_seconds": round(init_seconds, 2),
        "start_to_step1_packs_seconds": spread(walls["packs"]),
        "start_to_step1_torchtune_seconds": spread(walls["torchtune"]),
    }


def run_gain(s: Settings, echo=print) -> dict:
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
