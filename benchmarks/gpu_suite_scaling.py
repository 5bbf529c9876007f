"""The GPU suite's scaling job: one full fine-tune as a TrainJob through the project's own backend, once as
1 node x G GPUs and once as 2 nodes x G/2, on one machine.

The Kubernetes API is the project's stand-in (tests/support/kube_standin, as other benchmarks use the test support's
stand-ins) in execute mode: the TrainJobBackend (components/torchtune_finetune/backends/trainjob) places, creates
and follows the TrainJob exactly as the fine-tune step does, and each node pod's command (entrypoint, `tune run`
with the torchrun flags from the Trainer's PET_* env) runs as a local process. The stand-in hands each node pod its
`nvidia.com/gpu` limit's worth of this machine's GPUs as CUDA_VISIBLE_DEVICES, as the NVIDIA device plugin does per
container, so the two local "nodes" train on disjoint GPUs and meet over the c10d rendezvous on 127.0.0.1. The run
workspace (the suite's work folder, holding model, data and run folders) is a ReadWriteMany claim mounted at its own
path. What this measures is the TrainJob launch and the torchrun layout (two process groups, two rendezvous members,
inter-"node" traffic over the local interconnect), not a real cluster's network between machines.

Each layout trains the defaults side of the job's model (what the pipeline runs) for the suite's steps and runs to
its end (the backend follows the TrainJob to completion, its checkpoint included; the run folder is deleted after);
trained tokens/s per GPU comes from the run's metrics file (gpu_suite_runs.measured, its first `steps` steps).
Scaling efficiency = 2-node tokens/s per GPU / 1-node tokens/s per GPU. Fewer than G GPUs here: skipped, with why.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from benchmarks.common import ROOT
from benchmarks.gpu_suite_jobs import JOBS, Job
from benchmarks.gpu_suite_runs import measured

SCALING_JOB = "llama3.1-8b-full-trainjob-1x8-vs-2x4"
SCALING_BASE = next(job for job in JOBS if job.name == "llama3.1-8b-full-8gpu")  # its model, method and G
NAMESPACE = "bench"
WORKSPACE_CLAIM = "bench-workspace"
GPU_RUNTIME = ROOT / "runtimes" / "torchtune.yaml"


def layouts(base: Job = SCALING_BASE) -> list[Job]:
    """The base job as 1 node x G GPUs and as 2 nodes x G/2 (its name kept: the model folder is the base's)."""
    if base.gpus < 2 or base.gpus % 2:
        raise ValueError(f"the scaling job needs an even number of GPUs per node >= 2 (got {base.gpus})")
    return [
        dataclasses.replace(base, nodes=nodes, gpus=gpus)
        for nodes, gpus in ((1, base.gpus), (2, base.gpus // 2))
    ]


def layout_name(job: Job) -> str:
    """ "1x8", "2x4": nodes x GPUs per node."""
    return f"{job.nodes}x{job.gpus}"


def scaling_skipped(gpus_present: int, base: Job = SCALING_BASE) -> str:
    """'' when both layouts fit this machine's GPUs, else why the job is not run."""
    if gpus_present >= base.gpus:
        return ""
    return (
        f"needs {base.gpus} GPUs on this machine (1 node x {base.gpus}, then 2 local nodes x {base.gpus // 2} "
        f"through the TrainJob backend), {gpus_present} present"
    )


def trainjob_backend(job: Job, workspace: Path, run_id: str, timeout: int, runtime: str):
    """The project's TrainJob backend for `job`'s layout: `job.gpus` GPUs and processes per node pod, the
    workspace claim mounted at the workspace's own path (so every path in the resolved run is the same there)."""
    from kfp_finetune.components.torchtune_finetune.backends import backend_for
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import NodePodSettings

    pod = NodePodSettings(
        resources={"limits": {"nvidia.com/gpu": job.gpus}},
        env=[{"name": "HF_HUB_OFFLINE", "value": "1"}],
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_CLAIM}}],
        volume_mounts=[{"name": "workspace", "mountPath": str(workspace)}],
    )
    # One machine's "nodes" share its interconnect: the multi-node RDMA check (network.py) does not apply.
    return backend_for(
        "trainjob", devices=job.gpus, nodes=job.nodes, pod=pod, workspace_path=str(workspace), runtime=runtime,
        timeout=timeout, cleanup="always", run_id=run_id, task_name="scaling", allow_slow_network=job.nodes > 1,
    )  # fmt: skip


@contextlib.contextmanager
def local_cluster(workspace: Path, gpus: list[int], runtime: Path = GPU_RUNTIME) -> Iterator[str]:
    """The stand-in in execute mode with `runtime` (yields its name), the workspace claim mapped to `workspace` and
    `gpus` as the host GPUs node pods get; KUBECONFIG points at it meanwhile (the backend's own lookup)."""
    from tests.support.kube_standin import KubeStandin

    document = yaml.safe_load(runtime.read_text())
    with KubeStandin(namespace=NAMESPACE) as kube, _env("KUBECONFIG", str(kube.kubeconfig_path)):
        kube.add_object(document)
        kube.add_claim(WORKSPACE_CLAIM, "ReadWriteMany")
        # `python` in the node command is this interpreter (the pods' image would bring its own).
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        kube.execute({WORKSPACE_CLAIM: workspace}, extra_env={"PATH": path}, gpus=gpus)
        yield document["metadata"]["name"]


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def run_layout(unit, workspace: Path, runtime: str, steps: int, timeout: float, device: dict) -> dict:
    """`unit` (a resolved side of one layout) as a TrainJob to its end, measured over its first `steps` steps."""
    from kfp_finetune.components._shared.errors import ConfigError
    from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobError

    job, resolved = unit.job, unit.resolved
    backend = trainjob_backend(job, workspace, f"scaling-{layout_name(job)}", int(timeout), runtime)
    try:
        backend.run(resolved, total_steps=steps)
        result = {"status": "ok", **measured(resolved, steps, device, job.world_size, unit.lengths)}
    except (ConfigError, TrainJobError) as error:
        result = {"status": "failed", "why": str(error)}
    finally:
        shutil.rmtree(resolved.run_dir, ignore_errors=True)
    return {"nodes": job.nodes, "gpus_per_node": job.gpus, **result}


def efficiency(runs: dict[str, dict]) -> float | None:
    """2-node over 1-node trained tokens/s per GPU (None unless both measured)."""
    one, two = (runs.get(layout_name(job), {}).get("trained_tokens_per_second") for job in layouts())
    return two / one if one and two else None


def run_scaling(gpus: int, workspace: Path, prepare: Callable[[Job, str], object], steps: int, timeout: float,
                device: dict, echo=print) -> dict:  # fmt: skip
    """The scaling job's result: each layout's run and the scaling efficiency, or skipped with why (`prepare`:
    (layout, results key) -> the layout's resolved defaults side, as the suite prepares every run)."""
    if why := scaling_skipped(gpus):
        return {"status": "skipped", "why": why}
    runs = {}
    with local_cluster(workspace, list(range(SCALING_BASE.gpus))) as runtime:
        for job in layouts():
            unit = prepare(job, f"{SCALING_JOB}/{layout_name(job)}")
            runs[layout_name(job)] = run = run_layout(unit, workspace, runtime, steps, timeout, device)
            echo(f"  {SCALING_JOB} {layout_name(job)}: {run['status']}")
    ratio = efficiency(runs)
    return {"status": "ok" if ratio else "failed", "scaling_efficiency": ratio, "layouts": runs}
