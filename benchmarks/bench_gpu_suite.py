"""GPU reference suite: our defaults vs an expert-tuned config vs Kubeflow's torchtune runtime settings.

    python -m benchmarks.bench_gpu_suite --plan     # no training: the job matrix and each job's differing keys
    python -m benchmarks.bench_gpu_suite --smoke    # 3 steps per side on 2 000 rows: minutes on one GPU
    python -m benchmarks.bench_gpu_suite            # on GPUs: every job that fits them, 3 configs each
    python -m benchmarks.bench_gpu_suite --data cliff --jobs llama3.1-8b-lora-1gpu   # at max_seq_len 2304 / 3072
    python -m benchmarks.run --only gpu_suite       # the same, inside the suite's report
    (--jobs / --sides: a selection; --steps, --rows, --run-timeout, --deadline; --serial: one run at a time;
    --fresh forgets earlier results)

On a bare GPU machine the Python packages come as wheels: benchmarks/gpu_setup.sh (download here, install there).
Without a GPU the run machinery trains the tiny kit's model on the CPU instead (what the test suite runs).

Jobs, model folders, data and the expert's rule: gpu_suite_jobs.py (real model shapes, random weights; long-tailed
instruct rows, or with `--data cliff` two data sets whose data-derived max_seq_len is 2304 and 3072).

Three configs per job, all resolved by our resolver (one `tune run` YAML each) with the same steps and seed:
- defaults: what the pipeline runs (device=cuda): dataset-initialize packs the rows with the model's tokenizer
  (initialize_dataset, max_seq_len from the data) and the fine-tune's resolve trains on those packs with the
  lengths dataset-initialize recorded (finetune.recorded_lengths, packs.use_packs), as the pipeline's two steps
  do; compile, activation checkpointing and the micro-batch from the memory model (defaults.py);
- expert: what a torchtune expert writes by hand for that GPU (gpu_suite_jobs.expert_settings: packed at 4096 by
  torchtune, micro-batch and gradient accumulation from GPU memory and model size, compile on, activation
  checkpointing only when one pack does not fit without it), not our memory model's output;
- kubeflow: Kubeflow's torchtune ClusterTrainingRuntimes (kubeflow/trainer manifests, reference/runtimes) run
  `tune run [--rdzv_endpoint] <recipe> --config <model>/<size>_<method>` overriding only the dataset, paths and
  tokenizer: torchtune's base config as shipped (packed False, max_seq_len null, compile False, the config's
  activation checkpointing and batch size). Here: our resolve without `device` (so none of the CUDA defaults);
  its schedule defaults (warmup cap) remain and do not change the step time.
`--plan` resolves exactly what the run resolves (the same data, dataset-initialize's packs and recorded lengths,
the same tokenized sample for the other sides) and prints the keys the sides differ in and each side's packing,
max_seq_len, micro-batch, accumulation, compile and activation checkpointing.

Scheduling: on a machine with N GPUs the one-GPU runs go N at a time, each `tune run` with CUDA_VISIBLE_DEVICES
of its own GPU (gpu_suite_runs.schedule; the parent records every result as it comes); multi-GPU jobs run after,
alone. The side order alternates per job (defaults first on one, last on the next), so warm-up or thermal order
does not favour a side. Without GPUs, GPU_SUITE_FAKE_GPUS=N runs the tiny kit's sides N at a time (the
scheduling, not a measurement). `--serial` runs one at a time.

Scaling (gpu_suite_scaling.py): the 8-GPU full fine-tune's defaults side as a TrainJob through the project's own
backend on the Kubernetes stand-in in execute mode, 1 node x 8 GPUs then 2 local nodes x 4 (each node pod its own
GPUs, as the device plugin assigns them); scaling efficiency = 2-node / 1-node trained tokens/s per GPU. It runs
after the other jobs, on every GPU; with fewer than 8 it is recorded as skipped with why.

Measured per run (`tune run` on the resolved YAML; torchrun flags for several GPUs; stopped once it has logged its
steps, before any checkpoint: gpu_suite_runs.py): trained tokens/s per GPU (torchtune's; the headline compares
these, as pack padding is no work), processed tokens/s per GPU and MFU (components/torchtune_finetune/throughput.py,
median step time after warm-up; attention over the tokenized sample's row lengths on every side), peak memory
(torchtune's peak_memory_*), time from process start to the first logged step. A job needing more GPUs (or nodes)
than present is listed as skipped with the reason. results.json is rewritten after every run; a second invocation
skips the runs recorded there.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import ROOT, Settings, bench_env, fresh_dir, tiny_model
from benchmarks.gpu_suite_jobs import (
    DATA_VARIANTS,
    JOBS,
    TINY_JOB,
    Job,
    data_sets,
    expert_settings,
    model_folder,
    suite_data,
)
from benchmarks.gpu_suite_runs import ResultsStore, gpus_present, run_measured, schedule
from benchmarks.gpu_suite_scaling import SCALING_BASE, SCALING_JOB, run_scaling, scaling_skipped

__all__ = [
    "JOBS",
    "TINY_JOB",
    "Job",
    "suite_data",
]  # imported from here by bench_tiny_defaults / bench_packing

NAME = "gpu_suite"
TITLE = "GPU reference suite: defaults vs expert vs Kubeflow runtime"
TARGET = "defaults >= 80 % of the expert config's processed tokens/s on every job"
SIDES = ("defaults", "expert", "kubeflow")
FAKE_GPUS_ENV = "GPU_SUITE_FAKE_GPUS"


# --- the three configs ------------------------------------------------------------------------------------------


def side_settings(job: Job, side: str, steps: int, gpu_memory_gib: float = 80.0) -> dict:
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
    return {**settings, **expert_settings(job, gpu_memory_gib)} if side == "expert" else settings


@dataclass
class DefaultsData:
    """The defaults side's data as the pipeline hands it over: dataset-initialize's written split and packs."""

    train_dir: Path
    split: object  # contract.DatasetSplit
    workspace: Path


def resolve_side(job: Job, side: str, model_dir: Path, data: Path, run_dir: Path, steps: int,
                 gpu_memory_gib: float, lengths, write: bool = True, packed: DefaultsData | None = None):  # fmt: skip
    """The side's resolved run; with `packed` (the defaults side) on dataset-initialize's split, its recorded
    lengths and its packs, as the fine-tune step resolves it."""
    from kfp_finetune.components._shared.torchtune.config import from_flat
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    cfg = from_flat(side_settings_here(job, side, steps, gpu_memory_gib))
    hook = None
    if packed is not None:
        from kfp_finetune.components.torchtune_finetune.finetune import recorded_lengths
        from kfp_finetune.components.torchtune_finetune.packs import use_packs

        data, lengths = packed.train_dir, recorded_lengths(packed.split)
        hook = functools.partial(use_packs, split=packed.split, workspace=packed.workspace)
    return resolve_run(
        cfg, model_dir, data, run_dir, devices=job.gpus, nodes=job.nodes, write=write,
        gpu_memory_gib=gpu_memory_gib, token_lengths=lengths, packs=hook,
    )  # fmt: skip


def token_lengths(job: Job, model_dir: Path, data: Path, workdir: Path, tokenize: bool, cache: dict):
    """The data's token lengths for the job's tokenizer, sampled once per model and data (as the step does per run):
    the plan tokenizes too, so that plan and run resolve the same configuration."""
    from kfp_finetune.components._shared.torchtune.defaults import sample_token_lengths

    key = (job.model, str(data))
    if key not in cache:  # the kubeflow side applies no CUDA defaults: nothing is sampled there
        bare = resolve_side(job, "kubeflow", model_dir, data, workdir / "lengths", 1, 80.0, None, write=False)
        cache[key] = sample_token_lengths(bare.config, tokenize=tokenize)
    return cache[key]


def defaults_data(job: Job, model_dir: Path, data: Path, workdir: Path, cache: dict) -> DefaultsData:
    """dataset-initialize's split of `data`, tokenized and packed with the job's tokenizer (max_seq_len from the
    data), as the pipeline's dataset step writes it; reused across plan and run (same tokenizer, same packs)."""
    from kfp_finetune.components._shared.contract import DatasetSplit
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset

    key = (job.family, str(data))
    if key not in cache:
        workspace = workdir / "workspace"
        init = initialize_dataset(
            str(data), str(workspace), name=f"{data.stem}-{job.family}", base_model_path=model_dir
        )
        split = DatasetSplit.from_metadata(init.train_metadata, input_name="train_data")
        cache[key] = DefaultsData(init.path / "train", split, workspace)
    return cache[key]


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


def _runs(jobs: list[Job], workdir: Path, rows: int, variant: str) -> list[tuple[Job, str, Path]]:
    """(job, results key, data) for every chosen job and data set of the variant."""
    sets = data_sets(workdir, rows, variant)
    return [
        (job, f"{job.name}/{label}" if label else job.name, data)
        for job in jobs
        for label, data in sets.items()
    ]


def plan(workdir: Path, steps: int, rows: int, gpus: int = 0, gpu_memory_gib: float = 80.0,
         variant: str = "long-tailed", job_names: list[str] | None = None) -> dict:  # fmt: skip
    """Each job (and data set): whether it runs here (and why not), the keys its three resolved configs differ in
    and each side's KEY_SETTINGS, resolved from the same data, token lengths, packs and steps as the run (`steps`
    + 2: the run's spare steps)."""
    chosen = [job for job in JOBS if job_names is None or job.name in job_names]
    jobs, cache = {}, {}
    for job, key, data in _runs(chosen, workdir, rows, variant):
        model_dir = model_folder(workdir, job, weights=False)
        lengths = token_lengths(job, model_dir, data, workdir, True, cache)
        packed = defaults_data(job, model_dir, data, workdir, cache)
        configs, run_dirs = {}, {}
        for side in SIDES:
            run_dirs[side] = workdir / "plan" / key / side
            resolved = resolve_side(job, side, model_dir, data, run_dirs[side], steps + 2, gpu_memory_gib, lengths,
                                    packed=packed if side == "defaults" else None)  # fmt: skip
            configs[side] = resolved.config
        jobs[key] = {
            "recipe": resolved.recipe, "config": resolved.config_name, "nodes": job.nodes, "gpus": job.gpus,
            "skipped": fits(job, gpus), "differing": differing_keys(configs, run_dirs),
            "settings": {side: key_settings(configs[side]) for side in SIDES},
        }  # fmt: skip
    if job_names is None or SCALING_JOB in job_names:  # its layouts train the defaults side only: no table
        jobs[SCALING_JOB] = {"recipe": "full_finetune_distributed", "config": "llama3_1/8B_full", "nodes": 2,
                             "gpus": SCALING_BASE.gpus // 2, "skipped": scaling_skipped(gpus), "differing": {},
                             "settings": {}}  # fmt: skip
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
        if not job["settings"]:
            continue
        width = max(map(len, [*job["differing"], *KEY_SETTINGS]), default=0)
        echo(f"  {'key':{width}}  " + "  ".join(f"{s:>30}" for s in SIDES))
        for key, values in job["differing"].items():
            echo(f"  {key:{width}}  " + "  ".join(f"{_short(values[s]):>30}" for s in SIDES))
        echo("  settings:")
        for key in KEY_SETTINGS:
            echo(f"  {key:{width}}  " + "  ".join(f"{_short(job['settings'][s][key]):>30}" for s in SIDES))


# --- the runs ---------------------------------------------------------------------------------------------------

SMOKE_STEPS, SMOKE_ROWS, SMOKE_RUN_TIMEOUT = 3, 2000, 300.0
STEPS, ROWS, RUN_TIMEOUT = 30, 20000, 1200.0
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


def key_settings(config: dict) -> dict:
    return {name: config_value(config, path) for name, path in KEY_SETTINGS.items()}


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


@dataclass
class Unit:
    """One side of one job on one data set, resolved and ready to run."""

    job: Job
    key: str  # results.json's job key
    side: str
    resolved: object = None
    lengths: object = None

    @property
    def gpus(self) -> int:
        return self.job.world_size


def run_order(runs: list, sides: list[str]) -> list[tuple[object, str]]:
    """(run, side) in launch order: the sides as given for the first run, reversed for the next, and so on."""
    return [(run, side) for i, run in enumerate(runs) for side in (sides if i % 2 == 0 else sides[::-1])]


def run_suite(workdir: Path, output: Path, job_names: list[str], sides: list[str], steps: int, rows: int,
              run_timeout: float, deadline: float | None, fresh: bool, echo=print, variant: str = "long-tailed",
              serial: bool = False) -> dict:  # fmt: skip
    """Every chosen job x side that fits the GPUs here, one-GPU runs in parallel (one per GPU); results.json
    rewritten after each run and runs already recorded there skipped. Without GPUs, the tiny kit's job on the CPU
    (the machinery, not a result; GPU_SUITE_FAKE_GPUS parallel slots)."""
    gpus, memory, gpu_name = gpus_present()
    jobs = [job for job in JOBS if job.name in job_names] if gpus else [TINY_JOB]
    slots = gpus or _fake_gpus()
    device = {"name": gpu_name or "cpu", "count": max(gpus, 1), "cuda": bool(gpus)}
    store = ResultsStore(output / "results.json", fresh)
    store.data["settings"] = {"steps": steps, "rows": rows, "data": variant, "gpus": gpus, "gpu": gpu_name,
                              "gpu_memory_gib": round(memory, 1), "run_timeout_s": run_timeout,
                              "parallel_slots": 1 if serial else slots}  # fmt: skip
    started, cache, units = time.monotonic(), {}, []
    for (job, key, data), side in run_order(_runs(jobs, workdir, rows, variant), sides):
        why = fits(job, gpus or 1)
        if store.done(key, side):
            echo(f"  {key} {side}: recorded earlier, skipped")
        elif why:
            store.record(key, side, {"status": "skipped", "why": why})
        else:
            units.append(_prepare(job, key, side, workdir, data, steps, memory, cache))

    def execute(unit: Unit, visible: str) -> dict:
        left = deadline - (time.monotonic() - started) if deadline else run_timeout
        if left < 60:
            shutil.rmtree(unit.resolved.run_dir, ignore_errors=True)
            return {"status": "not run", "why": "the suite's --deadline"}
        log = workdir / "logs" / f"{unit.key.replace('/', '-')}-{unit.side}.log"
        run = run_measured(unit.resolved, unit.job.gpus, unit.job.nodes, steps, min(run_timeout, left), log, device,
                           env={"CUDA_VISIBLE_DEVICES": visible}, lengths=unit.lengths)  # fmt: skip
        return {"settings": key_settings(unit.resolved.config), "gpus": visible, **run}

    def record(unit: Unit, result: dict) -> None:
        store.record(unit.key, unit.side, result)
        echo(f"  {unit.key} {unit.side}: {_line(result)}")

    schedule(units, 1 if serial else slots, execute, record)
    # The scaling job after the rest: it takes every GPU.
    if gpus and SCALING_JOB in job_names and not store.done(SCALING_JOB, "trainjob"):
        data = next(iter(data_sets(workdir, rows, variant).values()))
        prepare = functools.partial(_prepare, side="defaults", workdir=workdir, data=data, steps=steps,
                                    memory=memory, cache=cache)  # fmt: skip
        store.record(
            SCALING_JOB, "trainjob", run_scaling(gpus, workdir, prepare, steps, run_timeout, device, echo)
        )
    store.data["headline"] = headline(store.data["runs"])
    store.save()
    return store.data


def _fake_gpus() -> int:
    value = os.environ.get(FAKE_GPUS_ENV) or "1"
    if not value.isdigit() or int(value) < 1:
        raise ValueError(
            f"{FAKE_GPUS_ENV} must be a whole number of parallel CPU runs, 1 or more (got {value!r})"
        )
    return int(value)


def _prepare(job: Job, key: str, side: str, workdir: Path, data: Path, steps: int, memory: float,
             cache: dict) -> Unit:  # fmt: skip
    model_dir = prepare_model(workdir, job)
    lengths = token_lengths(job, model_dir, data, workdir, True, cache)  # tokenized as training does
    packed = defaults_data(job, model_dir, data, workdir, cache) if side == "defaults" else None
    run_dir = fresh_dir(workdir / "runs" / key / side)
    # Two spare steps: the epoch (and its checkpoint) cannot end before the run is stopped at `steps`.
    resolved = resolve_side(job, side, model_dir, data, run_dir, steps + 2, memory, lengths, packed=packed)
    return Unit(job, key, side, resolved, lengths)


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


def side_settings_here(job: Job, side: str, steps: int, gpu_memory_gib: float = 80.0) -> dict:
    """The side's settings, moved to the CPU for the tiny job (what cannot run on a CPU)."""
    settings = side_settings(job, side, steps, gpu_memory_gib)
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
    p.add_argument("--jobs", default=",".join([*(j.name for j in JOBS), SCALING_JOB]),
                   help="comma-separated job names (default all)")  # fmt: skip
    p.add_argument("--sides", default=",".join(SIDES), help="comma-separated sides (default all three)")
    p.add_argument("--data", default="long-tailed", choices=DATA_VARIANTS,
                   help="long-tailed rows, or cliff: two data sets at max_seq_len 2304 and 3072 (default long-tailed)")  # fmt: skip
    p.add_argument(
        "--steps", type=int, help=f"measured steps per run (default {STEPS}; --smoke {SMOKE_STEPS})"
    )
    p.add_argument("--rows", type=int, help=f"rows per data set (default {ROWS}; --smoke {SMOKE_ROWS})")
    p.add_argument("--run-timeout", type=float, help=f"seconds per run (default {RUN_TIMEOUT:.0f})")
    p.add_argument(
        "--deadline", type=float, help="seconds for the whole suite: later runs are recorded as not run"
    )
    p.add_argument(
        "--serial", action="store_true", help="one run at a time (default: one-GPU runs, one per GPU)"
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
    known = {*(j.name for j in JOBS), SCALING_JOB}
    unknown = [name for name in args.jobs.split(",") if name not in known]
    if unknown:
        p.error(f"--jobs: unknown {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    unknown = [side for side in args.sides.split(",") if side not in SIDES]
    if unknown:
        p.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    steps = args.steps or (SMOKE_STEPS if args.smoke else STEPS)
    rows = args.rows or (SMOKE_ROWS if args.smoke else ROWS)
    if args.plan:
        logging.disable(
            logging.INFO
        )  # the defaults' reasons, one line each: see `kfp-finetune resolve-config`
        try:
            gpus, memory, _ = gpus_present()
            print_plan(plan(workdir, steps, rows, gpus, memory, args.data, args.jobs.split(",")))
        finally:
            logging.disable(logging.NOTSET)
        return 0
    data = run_suite(
        workdir, Path(args.output), args.jobs.split(","), args.sides.split(","), steps, rows,
        args.run_timeout or (SMOKE_RUN_TIMEOUT if args.smoke else RUN_TIMEOUT), args.deadline, args.fresh,
        variant=args.data, serial=args.serial,
    )  # fmt: skip
    print(data["headline"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
