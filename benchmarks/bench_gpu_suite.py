"""GPU reference suite: our defaults vs an expert-tuned config vs Kubeflow's torchtune runtime settings.

    python -m benchmarks.bench_gpu_suite --plan     # CPU, seconds: the job matrix and each job's differing keys
    python -m benchmarks.bench_gpu_suite            # on GPUs: every job that fits them, 3 configs each
    python -m benchmarks.run --only gpu_suite       # the same, inside the suite's report

Jobs (real model shapes, random weights: nothing is downloaded): Llama-3.2-1B LoRA on 1 GPU, Llama-3.1-8B LoRA on
1 GPU, Llama-3.1-8B full on 8 GPUs, Qwen2.5-7B full on 2 nodes x 8 GPUs, Llama-3.1-8B QLoRA on 1 GPU. Each model
folder holds a config.json with the published dims, random bf16 safetensors of those shapes (made here, sharded
with an index, as a hub download would be) and the tiny kit's tokenizer of the family (tokenizer speed does not
enter the step time); the data are synthetic long-tailed instruct rows (benchmarks.common.long_tailed_rows) of
about 300 tokens median, a few up to ~4k, like instruction-tuning sets.

Three configs per job, all resolved by our resolver (one `tune run` YAML each) with the same steps and seed:
- defaults: what the fine-tune step runs (device=cuda: packing + max_seq_len from the data, compile, activation
  checkpointing from the memory model, ~8-16k-token micro-batches: defaults.py);
- expert: what an expert sets by hand (JOBS below: packing at 4096, compile, activation checkpointing off where
  the memory allows, 8-16k-token micro-batches; the base configs already fuse AdamW);
- kubeflow: Kubeflow's torchtune ClusterTrainingRuntimes (kubeflow/trainer manifests, reference/runtimes) run
  `tune run [--rdzv_endpoint] <recipe> --config <model>/<size>_<method>` overriding only the dataset, paths and
  tokenizer: torchtune's base config as shipped (packed False, max_seq_len null, compile False, the config's
  activation checkpointing and batch size). Here: our resolve without `device` (so none of the CUDA defaults);
  its schedule defaults (warmup cap) remain and do not change the step time.

Measured per run (`tune run` on the resolved YAML; torchrun flags for several GPUs): trained tokens/s per GPU
(torchtune's), processed tokens/s per GPU and MFU (components/torchtune_finetune/throughput.py, median step time
after warm-up), peak memory (torchtune's peak_memory_*), time from process start to the first logged step.
A job needing more GPUs (or nodes) than present is listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, Settings, bench_env, fresh_dir, long_tailed_rows, median, write_json

NAME = "gpu_suite"
TITLE = "GPU reference suite: defaults vs expert vs Kubeflow runtime"
TARGET = "defaults >= 80 % of the expert config's processed tokens/s on every job"
SIDES = ("defaults", "expert", "kubeflow")

_LLAMA_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
# Published config.json dims (meta-llama/Llama-3.2-1B, meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-7B).
LLAMA_3_2_1B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 8192,
    "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {**_LLAMA_ROPE, "factor": 32.0}, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
}  # fmt: skip
LLAMA_3_1_8B = {
    **LLAMA_3_2_1B, "hidden_size": 4096, "num_hidden_layers": 32, "head_dim": 128, "intermediate_size": 14336,
    "rope_scaling": {**_LLAMA_ROPE, "factor": 8.0}, "tie_word_embeddings": False,
}  # fmt: skip
QWEN_2_5_7B = {
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944, "vocab_size": 152064,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 131072,
    "use_sliding_window": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}  # fmt: skip


@dataclass(frozen=True)
class Job:
    name: str
    model: str  # folder name under models/
    family: str  # the tiny kit's tokenizer family
    hf_config: dict
    method: str
    nodes: int
    gpus: int  # per node
    expert: dict  # the expert's explicit settings (on top of the defaults side's)


def _expert(batch_size: int) -> dict:
    # torchtune's optimisation ladder (packing, compile, no activation checkpointing where memory allows) with
    # micro-batches of batch_size x 4096 tokens and one optimizer step per micro-batch per GPU.
    return {"packed": True, "max_seq_len": 4096, "compile": True, "batch_size": batch_size,
            "gradient_accumulation_steps": 1, "enable_activation_checkpointing": False,
            "enable_activation_offloading": False}  # fmt: skip


JOBS = (
    # 1B: 16k tokens per micro-batch without activation checkpointing fit easily in 80 GiB.
    Job("llama3.2-1b-lora-1gpu", "llama3.2-1b", "llama3_2", LLAMA_3_2_1B, "lora", 1, 1, _expert(4)),
    # 7-8B: ~6 GiB of activations per 1k tokens without checkpointing: 8k-token micro-batches (2 x 4096) fit
    # beside 16 GiB of bf16 weights (LoRA), ~11 GiB of FSDP-sharded weights/grads/AdamW state (full, 8-16 GPUs)
    # or ~5 GiB of NF4 weights (QLoRA, where compile is the largest gain: ~3.4x).
    Job("llama3.1-8b-lora-1gpu", "llama3.1-8b", "llama3_2", LLAMA_3_1_8B, "lora", 1, 1, _expert(2)),
    Job("llama3.1-8b-full-8gpu", "llama3.1-8b", "llama3_2", LLAMA_3_1_8B, "full", 1, 8, _expert(2)),
    Job("qwen2.5-7b-full-2x8gpu", "qwen2.5-7b", "qwen2_5", QWEN_2_5_7B, "full", 2, 8, _expert(2)),
    Job("llama3.1-8b-qlora-1gpu", "llama3.1-8b", "llama3_2", LLAMA_3_1_8B, "qlora", 1, 1, _expert(2)),
)


# --- model folders and data -----------------------------------------------------------------------------------


def _shapes(c: dict) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a Llama / Qwen2 checkpoint with config.json `c`."""
    dim, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim, inter = c.get("head_dim") or dim // heads, c["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab_size"], dim)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * head_dim, dim), p + "self_attn.k_proj.weight": (kv * head_dim, dim),
            p + "self_attn.v_proj.weight": (kv * head_dim, dim), p + "self_attn.o_proj.weight": (dim, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, dim), p + "mlp.up_proj.weight": (inter, dim),
            p + "mlp.down_proj.weight": (dim, inter),
            p + "input_layernorm.weight": (dim,), p + "post_attention_layernorm.weight": (dim,),
        })  # fmt: skip
        if c["model_type"] == "qwen2":  # q/k/v biases
            shapes.update({p + "self_attn.q_proj.bias": (heads * head_dim,),
                           p + "self_attn.k_proj.bias": (kv * head_dim,), p + "self_attn.v_proj.bias": (kv * head_dim,)})  # fmt: skip
    shapes["model.norm.weight"] = (dim,)
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (c["vocab_size"], dim)
    return shapes


def _shard_plan(c: dict, shard_bytes: int = 4 << 30) -> dict[str, str]:
    """Tensor name -> shard file (bf16, about `shard_bytes` each), as in a hub model's index."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in _shapes(c).items():
        nbytes = 2 * math.prod(shape)
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    n = len(groups)
    return {name: f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i, g in enumerate(groups) for name in g}


def model_folder(root: Path, job: Job, weights: bool) -> Path:
    """The job's model folder: config.json, the family's tokenizer, the shard index and its shards. Without
    `weights` (the plan) the shards are empty files in a separate folder: resolving reads no weights."""
    from kfp_finetune.tiny.tokenizer import write_tokenizer

    out = root / ("models" if weights else "plan-models") / job.model
    if (out / ".complete").is_file():
        return out
    fresh_dir(out)
    tokens = write_tokenizer(out, job.family)
    config = dict(job.hf_config)
    specials = tokens.special_tokens
    if job.family == "llama3_2":
        config.update(bos_token_id=specials["<|begin_of_text|>"], eos_token_id=specials["<|eot_id|>"])
    else:
        config.update(bos_token_id=specials["<|endoftext|>"], eos_token_id=specials["<|im_end|>"])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    plan = _shard_plan(config)
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": plan}, indent=2)
    )
    if weights:
        _write_random_shards(out, config, plan)
    else:
        for shard in set(plan.values()):
            (out / shard).touch()
    (out / ".complete").touch()
    return out


def _write_random_shards(out: Path, config: dict, plan: dict[str, str]) -> None:
    import torch
    from safetensors.torch import save_file

    shapes = _shapes(config)
    generator = torch.Generator().manual_seed(0)
    for shard in sorted(set(plan.values())):
        tensors = {}
        for name in (n for n, s in plan.items() if s == shard):
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                t = torch.empty(shapes[name], dtype=torch.float32).normal_(0.0, 0.02, generator=generator)
                tensors[name] = t.to(torch.bfloat16)
        save_file(tensors, str(out / shard), metadata={"format": "pt"})


def suite_data(workdir: Path, rows: int) -> Path:
    out = workdir / "data" / f"long-tailed-{rows}.jsonl"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        with tmp.open("w") as f:
            for row in long_tailed_rows(rows, seed=0, median_words=150.0, sigma=0.8, cap=2000):
                f.write(json.dumps(row) + "\n")
        tmp.replace(out)
    return out


# --- the three configs ------------------------------------------------------------------------------------------


def side_settings(job: Job, side: str, steps: int) -> dict:
    common = {
        "method": job.method,
        "seed": 0,
        "max_steps_per_epoch": steps,
        "epochs": 1,
        "log_every_n_steps": 1,
    }
    if side == "kubeflow":  # no device: the base config's throughput settings, as Kubeflow's runtimes run it
        return {**common, "overrides": {"tokenizer.max_seq_len": None}}  # its null, not our cut length
    settings = {**common, "device": "cuda", "dtype": "bf16"}
    return {**settings, **job.expert} if side == "expert" else settings


def resolve_side(job: Job, side: str, model_dir: Path, data: Path, run_dir: Path, steps: int,
                 gpu_memory_gib: float, lengths, write: bool = True):  # fmt: skip
    from kfp_finetune.components._shared.torchtune.config import from_flat
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    cfg = from_flat(side_settings(job, side, steps))
    return resolve_run(
        cfg, model_dir, data, run_dir, devices=job.gpus, nodes=job.nodes, write=write,
        gpu_memory_gib=gpu_memory_gib, token_lengths=lengths,
    )  # fmt: skip


def token_lengths(job: Job, model_dir: Path, data: Path, workdir: Path, tokenize: bool, cache: dict):
    """The data's token lengths for the job's tokenizer, sampled once per model (as the step does per run)."""
    from kfp_finetune.components._shared.torchtune.defaults import sample_token_lengths

    if job.model not in cache:  # the kubeflow side applies no CUDA defaults: nothing is sampled there
        bare = resolve_side(job, "kubeflow", model_dir, data, workdir / "lengths", 1, 80.0, None, write=False)
        cache[job.model] = sample_token_lengths(bare.config, tokenize=tokenize)
    return cache[job.model]


def _flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for key, sub in value.items():
            out.update(_flatten(sub, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def differing_keys(configs: dict[str, dict], run_dirs: dict[str, Path]) -> dict[str, dict[str, object]]:
    """Dotted keys whose values differ between the sides (run folders replaced by <run>)."""
    flat = {}
    for side, config in configs.items():
        # The run folder as a whole path only: a sibling such as "<run folder>x/..." stays as it is.
        run = str(run_dirs[side])
        text = json.dumps(config, default=str).replace(run + "/", "<run>/").replace(f'"{run}"', '"<run>"')
        flat[side] = _flatten(json.loads(text))
    keys = sorted(set().union(*flat.values()))
    missing = "(unset)"
    return {
        k: {side: flat[side].get(k, missing) for side in flat}
        for k in keys
        if len({json.dumps(flat[side].get(k, missing), default=str) for side in flat}) > 1
    }


def fits(job: Job, gpus_present: int, nodes_present: int = 1) -> str:
    """'' when the job can run here, else why not."""
    if job.nodes > nodes_present:
        return f"needs {job.nodes} nodes x {job.gpus} GPUs; this benchmark runs on one machine"
    if job.gpus > gpus_present:
        return f"needs {job.gpus} GPU(s), {gpus_present} present"
    return ""


def plan(workdir: Path, steps: int = 30, gpus_present: int = 0, gpu_memory_gib: float = 80.0) -> dict:
    """Each job: whether it runs here (and why not) and the keys its three resolved configs differ in."""
    data = suite_data(workdir, rows=1000)
    jobs, cache = {}, {}
    for job in JOBS:
        model_dir = model_folder(workdir, job, weights=False)
        lengths = token_lengths(job, model_dir, data, workdir, False, cache)  # estimated: no torch needed
        configs, run_dirs = {}, {}
        for side in SIDES:
            run_dirs[side] = workdir / "plan" / job.name / side
            resolved = resolve_side(
                job, side, model_dir, data, run_dirs[side], steps, gpu_memory_gib, lengths
            )
            configs[side] = resolved.config
        jobs[job.name] = {
            "recipe": resolved.recipe, "config": resolved.config_name, "nodes": job.nodes, "gpus": job.gpus,
            "skipped": fits(job, gpus_present), "differing": differing_keys(configs, run_dirs),
        }  # fmt: skip
    return jobs


def _short(value: object) -> str:
    """A value for the plan's table: components by their last name."""
    if isinstance(value, str) and value.count(".") > 1:
        return value.rsplit(".", 1)[-1]
    return value if isinstance(value, str) else json.dumps(value)


def print_plan(jobs: dict, echo=print) -> None:
    for name, job in jobs.items():
        where = f"skipped: {job['skipped']}" if job["skipped"] else "runs here"
        echo(
            f"{name}: {job['recipe']} ({job['config']}), {job['nodes']} node(s) x {job['gpus']} GPU(s); {where}"
        )
        width = max(map(len, job["differing"]), default=0)
        echo(f"  {'key':{width}}  " + "  ".join(f"{s:>30}" for s in SIDES))
        for key, values in job["differing"].items():
            echo(f"  {key:{width}}  " + "  ".join(f"{_short(values[s]):>30}" for s in SIDES))


# --- the runs ---------------------------------------------------------------------------------------------------


def tune_run_timed(resolved, gpus: int, log_path: Path) -> float | None:
    """`tune run` on the resolved YAML; seconds from process start to the first logged step (None: none)."""
    from kfp_finetune.components._shared.metrics_file import parse_metric_line

    tune = str(Path(sys.executable).parent / "tune")
    torchrun = ["--nproc_per_node", str(gpus)] if resolved.distributed else []
    command = [tune, "run", *torchrun, resolved.recipe, "--config", str(resolved.yaml_path)]
    started, first = time.perf_counter(), None
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   cwd=resolved.run_dir, env=bench_env())  # fmt: skip
        for line in process.stdout:
            log.write(line)
            if first is None and parse_metric_line(line):
                first = time.perf_counter() - started
        if process.wait():
            raise subprocess.CalledProcessError(process.returncode, command)
    return first


def run_job(job: Job, side: str, workdir: Path, data: Path, steps: int, memory: float, cache: dict,
            echo=print) -> dict:  # fmt: skip
    model_dir = model_folder(workdir, job, weights=True)
    run_dir = fresh_dir(workdir / "runs" / job.name / side)
    lengths = token_lengths(job, model_dir, data, workdir, True, cache)  # tokenized as training does
    resolved = resolve_side(job, side, model_dir, data, run_dir, steps, memory, lengths)
    result = timed_run(resolved, run_dir.parent / f"{side}.log", job.gpus, job.nodes)
    echo(f"  {job.name} {side}: {json.dumps(result, default=str)}")
    return result


def timed_run(resolved, log_path: Path, gpus: int = 1, nodes: int = 1) -> dict:
    """`tune run` on a resolved run and its measurements: trained tokens/s (torchtune's, median after two warm-up
    steps), processed tokens/s and MFU (throughput.py), peak memory, seconds from process start to step 1."""
    from kfp_finetune.components._shared.metrics_file import read_metrics_file
    from kfp_finetune.components.torchtune_finetune.throughput import measure, record_device

    device = record_device(resolved.run_dir)
    try:
        first_step = tune_run_timed(resolved, gpus, log_path)
    except subprocess.CalledProcessError as error:
        return {"error": f"exit {error.returncode}: see {log_path}"}
    steps_logged = read_metrics_file(resolved.metrics_path)
    warm = steps_logged[2:] or steps_logged  # compile and warm-up steps left out
    speed = measure(resolved.config, resolved.model.hf_config, resolved.model.num_parameters, warm, device,
                    world_size=gpus * nodes)  # fmt: skip
    peaks = [v for s in steps_logged for k, v in s.values.items() if k.startswith("peak_memory")]
    return {
        "trained_tokens_per_second": median([s.tokens_per_second for s in warm if s.tokens_per_second]),
        "processed_tokens_per_second": speed.processed_tokens_per_second,
        "mfu": speed.mfu, "mfu_note": speed.mfu_note, "peak_memory_gib": max(peaks, default=None),
        "first_step_seconds": first_step, "steps": len(steps_logged), "device": speed.device,
    }  # fmt: skip


def run(s: Settings, echo=print) -> dict:
    """benchmarks.run's entry: every job that fits the GPUs here; the others listed as skipped with the reason."""
    steps = int(s.extra.get("gpu_steps", 30))
    workdir = s.workdir / NAME
    gpus, memory = _gpus()
    jobs = plan(workdir, steps, gpus, memory)
    results: dict[str, dict] = {}
    cache: dict = {}
    data = suite_data(workdir, rows=int(s.extra.get("gpu_rows", 20000)))
    for job in JOBS:
        why = jobs[job.name]["skipped"]
        if why:
            results[job.name] = {"skipped": why}
            echo(f"  {job.name}: skipped ({why})")
            continue
        results[job.name] = {
            side: run_job(job, side, workdir, data, steps, memory, cache, echo) for side in SIDES
        }
        d, e = (results[job.name][k].get("processed_tokens_per_second") for k in ("defaults", "expert"))
        results[job.name]["defaults_vs_expert"] = d / e if d and e else None
    ratios = [r["defaults_vs_expert"] for r in results.values() if r.get("defaults_vs_expert")]
    ran = len(ratios)
    headline = (
        f"defaults / expert processed tokens/s: min {min(ratios):.2f} over {ran} job(s)"
        if ratios else f"no job ran ({gpus} GPU(s) here): ready to run on GPUs"
    )  # fmt: skip
    return {
        "name": NAME, "title": TITLE, "target": TARGET, "headline": headline,
        "met": (min(ratios) >= 0.8) if ratios else None, "results": results,
        "settings": {"steps": steps, "gpus": gpus, "gpu_memory_gib": memory},
    }  # fmt: skip


def _gpus() -> tuple[int, float]:
    try:
        import torch
    except ImportError:
        return 0, 80.0
    if not torch.cuda.is_available():
        return 0, 80.0
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory / 2**30


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_gpu_suite", description=__doc__.split("\n")[0]
    )
    p.add_argument("--plan", action="store_true", help="print the job matrix and differing keys (CPU, quick)")
    p.add_argument("--workdir", default=str(ROOT / ".bench"), help="scratch folder (default .bench/)")
    p.add_argument("--output", default=str(ROOT / ".bench" / "results-gpu"), help="folder for results.json")
    p.add_argument("--steps", type=int, default=30, help="training steps per run (default 30)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workdir = Path(args.workdir).resolve()
    if args.plan:
        logging.disable(
            logging.INFO
        )  # the defaults' reasons, one line each: see `kfp-finetune resolve-config`
        try:
            print_plan(plan(workdir / NAME, args.steps, *_gpus()))
        finally:
            logging.disable(logging.NOTSET)
        return 0
    settings = Settings(workdir=workdir, repeats=1, quick=False, extra={"gpu_steps": str(args.steps)})
    report = run(settings)
    write_json(Path(args.output) / "results.json", report)
    print(report["headline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
