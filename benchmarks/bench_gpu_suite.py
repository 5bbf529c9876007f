"""GPU reference suite: our defaults vs an expert-tuned config vs Kubeflow's torchtune runtime settings.

    python -m benchmarks.bench_gpu_suite --plan     # no training: the job matrix and each job's differing keys
    python -m benchmarks.bench_gpu_suite --smoke    # 3 steps per side on 2 000 rows: minutes on one GPU
    python -m benchmarks.bench_gpu_suite            # on GPUs: every job that fits them, 3 configs each
    python -m benchmarks.run --only gpu_suite       # the same, inside the suite's report
    (--jobs / --sides: a selection; --steps, --rows, --run-timeout, --deadline; --fresh forgets earlier results)

On a bare GPU machine the Python packages come as wheels: benchmarks/gpu_setup.sh (download here, install there).
Without a GPU the run machinery trains the tiny kit's model on the CPU instead (what the test suite runs).

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

Measured per run (`tune run` on the resolved YAML; torchrun flags for several GPUs; stopped once it has logged its
steps, before any checkpoint: gpu_suite_runs.py): trained tokens/s per GPU (torchtune's; the headline compares
these, as pack padding is no work), processed tokens/s per GPU and MFU (components/torchtune_finetune/throughput.py,
median step time after warm-up), peak memory (torchtune's peak_memory_*), time from process start to the first
logged step. A job needing more GPUs (or nodes) than present is listed as skipped with the reason. results.json
is rewritten after every run; a second invocation skips the runs recorded there.
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

from benchmarks.common import ROOT, Settings, bench_env, fresh_dir, long_tailed_rows, tiny_model
from benchmarks.gpu_suite_runs import ResultsStore, gpus_present, run_measured

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
    device = (
        "cuda" if torch.cuda.is_available() else "cpu"
    )  # 8B normal samples: seconds on a GPU, minutes here
    generator = torch.Generator(device).manual_seed(0)
    for shard in sorted(set(plan.values())):
        tensors = {}
        for name in (n for n, s in plan.items() if s == shard):
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shapes[name], dtype=torch.bfloat16)
            else:
                t = torch.empty(shapes[name], dtype=torch.float32, device=device)
                tensors[name] = t.normal_(0.0, 0.02, generator=generator).to(torch.bfloat16).cpu()
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

    cfg = from_flat(side_settings_here(job, side, steps))
    return resolve_run(
        cfg, model_dir, data, run_dir, devices=job.gpus, nodes=job.nodes, write=write,
        gpu_memory_gib=gpu_memory_gib, token_lengths=lengths,
    )  # fmt: skip


def token_lengths(job: Job, model_dir: Path, data: Path, workdir: Path, tokenize: bool, cache: dict):
    """The data's token lengths for the job's tokenizer, sampled once per model (as the step does per run): the
    plan tokenizes too, so that plan and run resolve the same configuration."""
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


def plan(workdir: Path, steps: int, rows: int, gpus: int = 0, gpu_memory_gib: float = 80.0) -> dict:
    """Each job: whether it runs here (and why not) and the keys its three resolved configs differ in, resolved
    from the same data, token lengths and steps as the run (`steps` + 2: the run's spare steps)."""
    data = suite_data(workdir, rows)
    jobs, cache = {}, {}
    for job in JOBS:
        model_dir = model_folder(workdir, job, weights=False)
        lengths = token_lengths(job, model_dir, data, workdir, True, cache)
        configs, run_dirs = {}, {}
        for side in SIDES:
            run_dirs[side] = workdir / "plan" / job.name / side
            resolved = resolve_side(
                job, side, model_dir, data, run_dirs[side], steps + 2, gpu_memory_gib, lengths
            )
            configs[side] = resolved.config
        jobs[job.name] = {
            "recipe": resolved.recipe, "config": resolved.config_name, "nodes": job.nodes, "gpus": job.gpus,
            "skipped": fits(job, gpus), "differing": differing_keys(configs, run_dirs),
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

SMOKE_STEPS, SMOKE_ROWS, SMOKE_RUN_TIMEOUT = 3, 2000, 300.0
STEPS, ROWS, RUN_TIMEOUT = 30, 20000, 1200.0
# Without a GPU (the test suite's CPU smoke): the tiny kit's Llama-3.2-style model, every side on the CPU.
TINY_JOB = Job(
    "tiny-llama3_2-lora-cpu", "tiny", "llama3_2", {}, "lora", 1, 1,
    {"packed": True, "max_seq_len": 1024, "batch_size": 4, "gradient_accumulation_steps": 1,
     "enable_activation_checkpointing": False},
)  # fmt: skip
ON_CPU = {"device": "cpu", "dtype": "fp32", "compile": False}
TINY_MAX_POSITIONS = 2048
KEY_SETTINGS = {
    "packed": ("dataset", "packed"), "max_seq_len": ("tokenizer", "max_seq_len"), "batch_size": ("batch_size",),
    "gradient_accumulation_steps": ("gradient_accumulation_steps",), "compile": ("compile",),
    "enable_activation_checkpointing": ("enable_activation_checkpointing",),
}  # fmt: skip


def config_value(config: dict, path: tuple[str, ...]):
    """The value at a dotted path of a resolved config (None where any key is missing)."""
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config


def prepare_model(workdir: Path, job: Job) -> Path:
    """The job's model folder with weights, written by a child process (on the GPU where there is one: 8B random
    weights are minutes of CPU work) so that this process never holds a CUDA context."""
    if job is TINY_JOB:
        return tiny_model(workdir)
    out = workdir / "models" / job.model
    if not (out / ".complete").is_file():
        subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_gpu_suite", "--write-weights", job.name,
             "--workdir", str(workdir.parent)],
            check=True, env=bench_env(), cwd=workdir,
        )  # fmt: skip
    return out


def run_suite(workdir: Path, output: Path, job_names: list[str], sides: list[str], steps: int, rows: int,
              run_timeout: float, deadline: float | None, fresh: bool, echo=print) -> dict:  # fmt: skip
    """Every chosen job x side that fits the GPUs here, in order; results.json rewritten after each run and runs
    already recorded there skipped. Without GPUs, the tiny kit's job on the CPU (the machinery, not a result)."""
    gpus, memory, gpu_name = gpus_present()
    jobs = [job for job in JOBS if job.name in job_names] if gpus else [TINY_JOB]
    device = {"name": gpu_name or "cpu", "count": max(gpus, 1), "cuda": bool(gpus)}
    store = ResultsStore(output / "results.json", fresh)
    store.data["settings"] = {"steps": steps, "rows": rows, "gpus": gpus, "gpu": gpu_name,
                              "gpu_memory_gib": round(memory, 1), "run_timeout_s": run_timeout}  # fmt: skip
    data = suite_data(workdir, rows)
    started, cache = time.monotonic(), {}
    for job in jobs:
        why = fits(job, gpus or 1)
        for side in sides:
            if store.done(job.name, side):
                echo(f"  {job.name} {side}: recorded earlier, skipped")
                continue
            left = deadline - (time.monotonic() - started) if deadline else run_timeout
            if why or left < 60:
                store.record(job.name, side, {"status": "skipped", "why": why} if why
                             else {"status": "not run", "why": "the suite's --deadline"})  # fmt: skip
                continue
            result = _run_side(job, side, workdir, data, steps, memory, min(run_timeout, left), cache, device)
            store.record(job.name, side, result)
            echo(f"  {job.name} {side}: {_line(result)}")
    store.data["headline"] = headline(store.data["runs"])
    store.save()
    return store.data


def _run_side(job: Job, side: str, workdir: Path, data: Path, steps: int, memory: float, timeout: float,
              cache: dict, device: dict) -> dict:  # fmt: skip
    model_dir = prepare_model(workdir, job)
    lengths = token_lengths(job, model_dir, data, workdir, True, cache)  # tokenized as training does
    run_dir = fresh_dir(workdir / "runs" / job.name / side)
    # Two spare steps: the epoch (and its checkpoint) cannot end before the run is stopped at `steps`.
    resolved = resolve_side(job, side, model_dir, data, run_dir, steps + 2, memory, lengths)
    settings = {name: config_value(resolved.config, path) for name, path in KEY_SETTINGS.items()}
    log = workdir / "logs" / f"{job.name}-{side}.log"
    return {"settings": settings, **run_measured(resolved, job.gpus, job.nodes, steps, timeout, log, device)}


def _line(result: dict) -> str:
    if result.get("trained_tokens_per_second"):
        mfu = f", MFU {result['mfu']:.2f}" if result.get("mfu") else ""
        return (f"{result['status']}: {result['trained_tokens_per_second']:.0f} trained tok/s per GPU{mfu}, "
                f"first step at {result['first_step_seconds']:.0f} s")  # fmt: skip
    return f"{result['status']}" + (f" ({result['why']})" if result.get("why") else "")


def headline(runs: dict) -> str:
    """defaults / expert trained tokens/s over the jobs where both sides ran."""
    ratios = {
        job: sides["defaults"]["trained_tokens_per_second"] / sides["expert"]["trained_tokens_per_second"]
        for job, sides in runs.items()
        if all((sides.get(s) or {}).get("trained_tokens_per_second") for s in ("defaults", "expert"))
    }
    if not ratios:
        return "no job ran both the defaults and the expert side"
    return f"defaults / expert trained tokens/s: min {min(ratios.values()):.2f} over {len(ratios)} job(s)"


def side_settings_here(job: Job, side: str, steps: int) -> dict:
    """The side's settings, moved to the CPU for the tiny job (what cannot run on a CPU)."""
    settings = side_settings(job, side, steps)
    if job is not TINY_JOB:
        return settings
    if side == "kubeflow":  # the base config's null max_seq_len would pass the tiny model's 2048 positions
        settings = {**settings, "overrides": {"tokenizer.max_seq_len": TINY_MAX_POSITIONS}}
    return {**settings, **ON_CPU}


def run(s: Settings, echo=print) -> dict:
    """benchmarks.run's entry: every job that fits the GPUs here (without GPUs: the tiny kit's job on the CPU)."""
    workdir = s.workdir / NAME
    data = run_suite(
        workdir, workdir / "results", [job.name for job in JOBS], list(SIDES), int(s.extra.get("gpu_steps", STEPS)),
        int(s.extra.get("gpu_rows", ROWS)), RUN_TIMEOUT, None, fresh=True, echo=echo,
    )  # fmt: skip
    return {"name": NAME, "title": TITLE, "target": TARGET, "headline": data["headline"], "met": None,
            "results": data["runs"], "settings": data["settings"]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_gpu_suite", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--plan", action="store_true", help="print the job matrix and differing keys (no training)"
    )
    p.add_argument("--smoke", action="store_true",
                   help=f"{SMOKE_STEPS} steps per side on {SMOKE_ROWS} rows, {SMOKE_RUN_TIMEOUT:.0f} s per run")  # fmt: skip
    p.add_argument(
        "--jobs", default=",".join(j.name for j in JOBS), help="comma-separated job names (default all)"
    )
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated sides (default all three)")
    p.add_argument(
        "--steps", type=int, help=f"measured steps per run (default {STEPS}; --smoke {SMOKE_STEPS})"
    )
    p.add_argument("--rows", type=int, help=f"long-tailed rows (default {ROWS}; --smoke {SMOKE_ROWS})")
    p.add_argument("--run-timeout", type=float, help=f"seconds per run (default {RUN_TIMEOUT:.0f})")
    p.add_argument(
        "--deadline", type=float, help="seconds for the whole suite: later runs are recorded as not run"
    )
    p.add_argument(
        "--fresh", action="store_true", help="forget results.json's runs (default: skip those done)"
    )
    p.add_argument("--workdir", default=str(ROOT / ".bench"), help="scratch folder (default .bench/)")
    p.add_argument("--output", default=str(ROOT / ".bench" / "results-gpu"), help="folder for results.json")
    p.add_argument("--write-weights", metavar="JOB", help=argparse.SUPPRESS)  # the suite's own child process
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    workdir = Path(args.workdir).resolve() / NAME
    if args.write_weights:
        model_folder(workdir, next(j for j in JOBS if j.name == args.write_weights), weights=True)
        return 0
    steps = args.steps or (SMOKE_STEPS if args.smoke else STEPS)
    rows = args.rows or (SMOKE_ROWS if args.smoke else ROWS)
    if args.plan:
        logging.disable(
            logging.INFO
        )  # the defaults' reasons, one line each: see `kfp-finetune resolve-config`
        try:
            gpus, memory, _ = gpus_present()
            print_plan(plan(workdir, steps, rows, gpus, memory))
        finally:
            logging.disable(logging.NOTSET)
        return 0
    data = run_suite(
        workdir, Path(args.output), args.jobs.split(","), args.sides.split(","), steps, rows,
        args.run_timeout or (SMOKE_RUN_TIMEOUT if args.smoke else RUN_TIMEOUT), args.deadline, args.fresh,
    )  # fmt: skip
    print(data["headline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
