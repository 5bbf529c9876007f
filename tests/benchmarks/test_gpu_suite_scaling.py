"""The GPU suite's scaling job without a GPU. torchtune's distributed recipes cannot run on the CPU, so the 2-node
layout is checked as far as its launch assembly (the TrainJobs the project's backend builds for 1 x G and 2 x G/2);
the launch, follow and measurement path runs for real on the CPU with the tiny kit's model as a 1-node TrainJob
through the backend and the Kubernetes stand-in in execute mode."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import bench_gpu_suite, gpu_suite_jobs, gpu_suite_scaling
from benchmarks.common import ROOT, tiny_model

TINY_FULL = dataclasses.replace(bench_gpu_suite.TINY_JOB, method="full", gpus=2)


def test_the_layouts_are_one_node_of_all_gpus_and_two_of_half():
    assert [(job.nodes, job.gpus) for job in gpu_suite_scaling.layouts()] == [(1, 8), (2, 4)]
    assert [gpu_suite_scaling.layout_name(job) for job in gpu_suite_scaling.layouts()] == ["1x8", "2x4"]
    assert {job.model for job in gpu_suite_scaling.layouts()} == {"llama3.1-8b"}
    assert gpu_suite_scaling.scaling_skipped(8) == ""
    assert gpu_suite_scaling.scaling_skipped(1) == (
        "needs 8 GPUs on this machine (1 node x 8, then 2 local nodes x 4 through the TrainJob backend), 1 present"
    )
    skipped = gpu_suite_scaling.run_scaling(
        1, ROOT, None, 3, 60.0, {}
    )  # nothing prepared, no stand-in started
    assert skipped == {"status": "skipped", "why": gpu_suite_scaling.scaling_skipped(1)}
    with pytest.raises(ValueError, match="even number of GPUs per node"):
        gpu_suite_scaling.layouts(dataclasses.replace(TINY_FULL, gpus=3))
    runs = {"1x8": {"trained_tokens_per_second": 4000.0}, "2x4": {"trained_tokens_per_second": 3600.0}}
    assert gpu_suite_scaling.efficiency(runs) == pytest.approx(0.9)
    assert gpu_suite_scaling.efficiency({**runs, "2x4": {"status": "failed"}}) is None


@pytest.mark.slow
def test_the_backend_sends_each_layout_as_a_trainjob_of_its_nodes_and_gpus(tmp_path):
    data = next(iter(gpu_suite_jobs.data_sets(tmp_path, 200).values()))
    model = tiny_model(tmp_path)
    manifests = {}
    for job in gpu_suite_scaling.layouts(TINY_FULL):
        name = gpu_suite_scaling.layout_name(job)
        resolved = bench_gpu_suite.resolve_side(job, "expert", model, data, tmp_path / name, 5, 80.0, None)
        backend = gpu_suite_scaling.trainjob_backend(job, tmp_path, f"scaling-{name}", 600, "torchtune")
        assert resolved.distributed and resolved.recipe.endswith("full_finetune_distributed")
        manifests[name] = backend.manifest(resolved)
    # One machine's "nodes" share its interconnect: the 2-node TrainJob says so, as the RDMA check asks.
    slow = "kfp-finetune.io/allow-slow-network"
    assert (manifests["2x1"]["metadata"].get("annotations") or {}).get(slow) == "true"
    assert slow not in (manifests["1x2"]["metadata"].get("annotations") or {})
    one, two = manifests["1x2"]["spec"], manifests["2x1"]["spec"]
    assert (one["trainer"]["numNodes"], one["trainer"]["numProcPerNode"]) == (1, 2)
    assert (two["trainer"]["numNodes"], two["trainer"]["numProcPerNode"]) == (2, 1)
    assert one["trainer"]["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "2"}
    assert two["trainer"]["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "1"}
    for spec in (one, two):  # torchrun over the Trainer's PET_* env: the stand-in's nodes meet on 127.0.0.1
        command = " ".join(spec["trainer"]["command"])
        assert "--nnodes $(PET_NNODES) --nproc_per_node $(PET_NPROC_PER_NODE)" in command
        patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod = patch["template"]["spec"]["template"]["spec"]
        assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == gpu_suite_scaling.WORKSPACE_CLAIM
        assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == str(tmp_path)


@pytest.mark.slow
def test_a_layout_runs_as_a_trainjob_through_the_backend_and_is_measured(tmp_path, monkeypatch):
    """The tiny kit's model, 1 node x 1 process on the CPU runtime: placed, created, followed to its end by the
    backend, the node command run by the stand-in, trained tokens/s read from the run's metrics."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    workdir = tmp_path / "gpu_suite"
    data = next(iter(gpu_suite_jobs.data_sets(workdir, 200).values()))
    unit = bench_gpu_suite._prepare(bench_gpu_suite.TINY_JOB, "scaling", "expert", workdir, data, 3, 80.0, {})
    device = {"name": "cpu", "count": 1, "cuda": False}
    with gpu_suite_scaling.local_cluster(workdir, [], ROOT / "runtimes" / "torchtune-cpu.yaml") as runtime:
        result = gpu_suite_scaling.run_layout(unit, workdir, runtime, 3, 600, device)
    assert result["status"] == "ok", json.dumps(result, default=str)
    assert (result["nodes"], result["gpus_per_node"]) == (1, 1)
    assert result["trained_tokens_per_second"] > 0 and result["steps_measured"] == 1  # 3 steps, 2 warm-up
    assert not unit.resolved.run_dir.exists()  # the checkpoint it ended with is gone
