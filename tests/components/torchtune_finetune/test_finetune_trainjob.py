"""torchtune-finetune with backend=trainjob: the component's own code path (run_component) against the
Kubernetes API stand-in. Execute mode runs the TrainJob's node command for real, so the outputs can be compared
with backend=local on the same inputs and seed."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from kfp.dsl import HTML, Artifact, Dataset, Metrics, Model, TaskConfig

from kfp_finetune.components._shared.errors import usage_errors
from kfp_finetune.components._shared.workspace import cache_lock_path
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.components.torchtune_finetune.backends import TrainingOutcome
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobFailed
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name
from kfp_finetune.components.torchtune_finetune.finetune import (
    USAGE_ERRORS,
    ArtifactInput,
    run_component,
    run_finetune,
)
from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged, run_metrics
from kfp_finetune.components.torchtune_finetune.warm_start import COMPILE_CACHE_ENV
from tests.support import kube_standin as standin

pytestmark = pytest.mark.slow
kube_standin = standin.kube_standin

RUN_ID = "0d1c7a5e-run"
WORKSPACE_PVC = "run-0d1c7a5e-kfp-workspace"
STEP_POD, STEP_NODE = "finetune-step-pod", "kfp-node-a"
TRAINING = {"method": "lora", "device": "cpu", "batch_size": 4, "gradient_accumulation_steps": 1,
            "max_steps_per_epoch": 4, "seed": 0, "learning_rate": 1e-3}  # fmt: skip


@pytest.fixture
def inputs(tiny_llama, tiny_dataset, tmp_path):
    """A workspace filled by the real initializers, and their output artifacts."""
    workspace = tmp_path / "workspace"
    model = Model(uri=str(tmp_path / "artifacts" / "base_model"))
    train, held_out = (
        Dataset(uri=str(tmp_path / "artifacts" / "train")),
        Dataset(uri=str(tmp_path / "artifacts" / "eval")),
    )
    initialize_model(str(tiny_llama), str(workspace), name="base", output_model=model)
    initialize_dataset(str(tiny_dataset["train.jsonl"]), str(workspace), name="reverse", eval_fraction=0.1,
                       output_train=train, output_eval=held_out)  # fmt: skip
    return workspace, model, train


def task_config(workspace: Path, **extra) -> TaskConfig:
    """What the KFP driver injects: the workspace PVC (mounted where this pod sees it) plus the task's settings."""
    return TaskConfig(
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": str(workspace)}],
        **extra,
    )


def call_component(workspace, base_model, train, tmp_path, backend, config, **params):
    outputs = tmp_path / f"outputs-{backend}"
    artifacts = {
        "model": Model(uri=str(outputs / "model")),
        "metrics": Metrics(uri=str(outputs / "metrics")),
        "report": HTML(uri=str(outputs / "report")),
        "train_config": Artifact(uri=str(outputs / "train_config")),
    }
    step = {"backend": backend, "runtime_name": "torchtune-cpu", "runtime_kind": "ClusterTrainingRuntime",
            "num_nodes": 1, "num_proc_per_node": 0, "timeout_seconds": 600, "cleanup_policy": "on-success",
            "trainer_image": "", "run_id": f"{RUN_ID}-{backend}", "task_name": "torchtune-finetune"}  # fmt: skip
    result = run_component(
        workspace_path=str(workspace), train_data=train, base_model=base_model, eval_data=None,
        kubernetes_config=config, **artifacts, **{**step, **TRAINING, **params},
    )  # fmt: skip
    return result, artifacts


@pytest.fixture
def cpu_runtime(kube_standin, monkeypatch):
    """The CPU runtime, and this process as the KFP step pod on STEP_NODE holding the run workspace: a
    ReadWriteOnce claim (many clusters' default storage class), so node pods can only start on STEP_NODE."""
    runtime = Path(__file__).resolve().parents[3] / "runtimes" / "torchtune-cpu.yaml"
    import yaml

    kube_standin.add_object(yaml.safe_load(runtime.read_text()))
    kube_standin.add_claim(WORKSPACE_PVC, "ReadWriteOnce")
    kube_standin.add_running_pod(STEP_POD, STEP_NODE, claims=(WORKSPACE_PVC,))
    monkeypatch.setenv("KFP_POD_NAME", STEP_POD)  # what KFP sets in every step pod
    return kube_standin


def test_trainjob_backend_matches_local_backend(inputs, cpu_runtime, tmp_path, monkeypatch):
    kube = cpu_runtime
    workspace, base_model, train = inputs
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    kube.execute(
        {WORKSPACE_PVC: workspace}, extra_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    )
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    config = task_config(
        workspace,
        resources={"requests": {"cpu": "2", "memory": "4Gi"}},
        tolerations=[toleration],
        node_selector={"pool": "training"},
        env=[{"name": "HF_HUB_OFFLINE", "value": "1"}],
    )
    remote, remote_artifacts = call_component(workspace, base_model, train, tmp_path, "trainjob", config)
    local, _ = call_component(workspace, base_model, train, tmp_path, "local", TaskConfig())

    # Same inputs and seed, same numbers: the TrainJob ran the same resolved YAML.
    assert [round(s.loss, 5) for s in remote.steps] == [round(s.loss, 5) for s in local.steps]
    assert len(remote.steps) == 4
    assert {Path(p).name for p in remote.checkpoint.files} == {Path(p).name for p in local.checkpoint.files}

    name = trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune")
    created = kube.requests_for("POST", "trainjobs")[0].body
    spec = created["spec"]
    assert spec["trainer"]["command"][3:8] == [
        "--engine",
        "torchtune",
        "tune",
        "run",
        "kfp_finetune/components/torchtune_finetune/recipe.py",
    ]  # our recipe module (resume)
    assert spec["trainer"]["resourcesPerNode"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert {"name": "HF_HUB_OFFLINE", "value": "1"} in spec["trainer"]["env"]
    pod_patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod_spec = pod_patch["template"]["spec"]["template"]["spec"]
    assert pod_spec["tolerations"] == [toleration] and pod_spec["nodeSelector"] == {"pool": "training"}
    assert pod_spec["volumes"][0]["persistentVolumeClaim"]["claimName"] == WORKSPACE_PVC
    # The ReadWriteOnce workspace is attached to the step's node: the node pod was pinned there and ran there.
    node_terms = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert node_terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [STEP_NODE]}]}
    ]
    assert [e for e in kube.events() if e["reason"] == "FailedAttachVolume"] == []
    assert created["metadata"]["name"] == name
    assert kube.trainjob(name) is None, "a successful TrainJob is deleted (cleanup_policy=on-success)"

    files = sorted(p.name for p in Path(remote_artifacts["train_config"].path).iterdir())
    assert files == ["torchtune_config.yaml", "trainjob.yaml"]
    assert remote_artifacts["model"].metadata["backend"] == "trainjob"
    assert remote_artifacts["metrics"].metadata["steps"] == 4


def test_trainjob_failure_surfaces_reason_and_keeps_the_job(inputs, cpu_runtime, tmp_path, monkeypatch):
    kube = cpu_runtime
    workspace, base_model, train = inputs
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    kube.scenario(None, standin.Scenario.oom())
    with pytest.raises(TrainJobFailed, match="OOMKilled"):
        call_component(workspace, base_model, train, tmp_path, "trainjob", task_config(workspace))
    name = trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune")
    assert kube.trainjob(name) is not None, "failed TrainJobs are kept for debugging"


@pytest.mark.parametrize("backend", ["local", "trainjob"])
def test_diverged_training_fails_the_step_in_one_line_and_hands_on_nothing(
    backend, inputs, cpu_runtime, tmp_path, monkeypatch, capsys
):
    """local: real torchtune at a learning rate of 1e12 (nan at step 2 of 200); trainjob: a rank-0 log whose loss
    turns to nan at step 3. Either way the step fails with one line, and no model or metrics claim success."""
    kube = cpu_runtime
    workspace, base_model, train = inputs
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    lines = ["Step 1 | loss:2.3", "Step 2 | loss:9e+30", *(f"Step {i} | loss:nan" for i in range(3, 401))]
    kube.scenario(None, standin.Scenario.success(lines, line_interval=0.05))
    config = task_config(workspace) if backend == "trainjob" else TaskConfig()
    with pytest.raises(SystemExit) as exited, usage_errors(*USAGE_ERRORS):
        call_component(
            workspace, base_model, train, tmp_path, backend, config,
            learning_rate=1e12, num_warmup_steps=0, max_steps_per_epoch=200,
        )  # fmt: skip
    assert exited.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    step, where = (2, "") if backend == "local" else (3, " in TrainJob ")
    assert len(errors) == 1 and errors[0].startswith(f"error: loss diverged at step {step} (loss=nan){where}")
    assert "tune_learning_rate" in errors[0]

    outputs = tmp_path / f"outputs-{backend}"
    assert not (outputs / "model").exists() and not (outputs / "metrics").exists()
    run_dir = workspace / "runs" / trainjob_name(f"{RUN_ID}-{backend}", "torchtune-finetune")
    assert not (run_dir / "merged").exists() and not (run_dir / "adapter").exists()
    if backend == "trainjob":
        assert kube.trainjob(run_dir.name) is None, (
            "a diverged, still running TrainJob is deleted (on-success)"
        )


class MetricLinesOnly:
    """A backend whose "training" writes only torchtune's metric file: what run_finetune makes of its lines."""

    name, devices, nodes = "lines-only", 1, 1

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def gpus_available(self) -> bool:
        return False

    def prepare(self, run_dir: Path, *, resume_point=None) -> None:
        pass

    def run(self, resolved, *, total_steps):
        resolved.metrics_path.parent.mkdir(parents=True, exist_ok=True)
        resolved.metrics_path.write_text("".join(f"{line}\n" for line in self.lines))
        return TrainingOutcome()


@pytest.mark.parametrize(
    ("lines", "step"),
    [(["Step 1 | loss:2.0", "Step 2 | loss:inf"], 2), (["Step 1 | loss:nan", "Step 2 | loss:nan"], 1)],
)
def test_a_metrics_file_with_a_non_finite_loss_is_a_divergence_not_a_model(inputs, tmp_path, lines, step):
    """Whatever a backend let through: no KeyError when no loss is finite, and nothing is finalized."""
    workspace, base_model, train = inputs
    with pytest.raises(LossDiverged, match=rf"^loss diverged at step {step} "):
        run_finetune(
            workspace=workspace, train_data=ArtifactInput(dict(train.metadata)),
            base_model=ArtifactInput(dict(base_model.metadata)), settings=TRAINING, run_id="r", task_name="t",
            backend=MetricLinesOnly(lines),
        )  # fmt: skip
    assert not list((workspace / "runs").glob("*/merged")) and not list(
        (workspace / "runs").glob("*/adapter")
    )


def test_metrics_without_a_finite_loss_report_none():
    metrics = run_metrics({"logged_steps": 2.0, "tokens_per_second": 5.0}, [], 2.0)
    assert "final_loss" not in metrics and metrics["steps"] == 0.0 and metrics["tokens_per_second"] == 5.0


def test_bad_parameters_fail_before_any_trainjob(inputs, cpu_runtime, tmp_path, monkeypatch):
    kube = cpu_runtime
    workspace, base_model, train = inputs
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    with pytest.raises(ValueError, match="lora_rank must be at least 1"):
        call_component(
            workspace, base_model, train, tmp_path, "trainjob", task_config(workspace), lora_rank=-3
        )
    with pytest.raises(ValueError, match="workspace .* is not among the volumes"):
        call_component(workspace, base_model, train, tmp_path, "trainjob", TaskConfig())
    gpu_nodes = task_config(workspace, resources={"limits": {"nvidia.com/gpu": "1"}})
    with pytest.raises(ValueError, match="backend=local trains in this step's own pod, which has no GPU"):
        call_component(workspace, base_model, train, tmp_path, "local", gpu_nodes)
    with pytest.raises(ValueError, match="backend must be one of"):
        call_component(workspace, base_model, train, tmp_path, "slurm", task_config(workspace))
    with pytest.raises(ValueError, match="num_nodes=2 needs a workspace every node can mount.*ReadWriteOnce"):
        call_component(
            workspace, base_model, train, tmp_path, "trainjob", gpu_nodes, num_nodes=2, device="cuda"
        )
    assert kube.requests_for("POST", "trainjobs") == []


def test_a_base_model_used_in_place_from_an_unmounted_cache_is_refused_before_launch(
    tiny_llama, inputs, cpu_runtime, tmp_path, monkeypatch
):
    """model-initialize's cache on another volume (EXDEV: used in place, absolute workspace_path): the node pods
    must mount that cache too, else the TrainJob would start and fail to find the weights."""
    import errno

    from kfp_finetune.components.model_initialize import cache

    def cross_device(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src))

    monkeypatch.setattr(cache, "link_file", cross_device)
    monkeypatch.setenv("KUBECONFIG", str(cpu_runtime.kubeconfig_path))
    workspace, _, train = inputs
    cached = Model(uri=str(tmp_path / "artifacts" / "cached_model"))
    model_cache = tmp_path / "model-cache"
    initialize_model(
        str(tiny_llama), str(workspace), name="cached", cache_path=str(model_cache), output_model=cached
    )
    assert cached.metadata["workspace_path"].startswith(str(model_cache))
    with pytest.raises(
        ValueError, match=r"used in place from a model cache .*mount the model cache PVC on the fine-tune"
    ):
        call_component(workspace, cached, train, tmp_path, "trainjob", task_config(workspace))
    assert cpu_runtime.requests_for("POST", "trainjobs") == []


def test_a_base_model_from_the_model_cache_puts_the_compile_cache_beside_it_in_the_node_pods(
    tiny_llama, inputs, cpu_runtime, tmp_path, monkeypatch
):
    """The base model came through model-initialize's persistent cache, whose volume the step forwards to the node
    pods: the TrainJob tells the training process to keep torch.compile's kernels there (the next run starts warm)."""
    monkeypatch.setenv("KUBECONFIG", str(cpu_runtime.kubeconfig_path))
    # The TrainJob fails at once: only its manifest matters.
    cpu_runtime.scenario(None, standin.Scenario.oom())
    cpu_runtime.add_claim("model-cache", "ReadWriteMany")  # pipelines' KFP_FINETUNE_MODEL_CACHE_PVC
    workspace, _, train = inputs
    cached = Model(uri=str(tmp_path / "artifacts" / "cached_model"))
    model_cache = tmp_path / "model-cache"
    initialize_model(
        str(tiny_llama), str(workspace), name="cached", cache_path=str(model_cache), output_model=cached
    )
    cache_volume = {"name": "model-cache", "persistentVolumeClaim": {"claimName": "model-cache"}}
    config = task_config(workspace)
    config.volumes.append(cache_volume)
    config.volume_mounts.append({"name": "model-cache", "mountPath": str(model_cache)})
    lock = cache_lock_path(cached.metadata["cache"]["entry"])
    long_ago = time.time() - 40 * 24 * 3600
    os.utime(lock, (long_ago, long_ago))
    with pytest.raises(TrainJobFailed):
        call_component(workspace, cached, train, tmp_path, "trainjob", config)
    assert lock.stat().st_mtime > long_ago + 39 * 24 * 3600, (
        "the fine-tune marks the cache entry it reads used"
    )
    job = cpu_runtime.trainjob(trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune"))
    env = {item["name"]: item.get("value") for item in job["spec"]["trainer"]["env"]}
    assert env[COMPILE_CACHE_ENV] == str(model_cache / "compile")


def test_cancelling_the_step_deletes_the_trainjob(inputs, cpu_runtime, tmp_path):
    """SIGTERM to the step (KFP run cancelled, pod evicted) deletes the running TrainJob and fails the step."""

    kube = cpu_runtime
    workspace, base_model, train = inputs
    kube.add_claim("ws-pvc", "ReadWriteMany")
    kube.scenario(
        None, standin.Scenario(log_lines=[f"Step {i} | loss:2.0" for i in range(1, 600)], line_interval=0.1)
    )
    step = textwrap.dedent(f"""
        import json, sys
        from kfp.dsl import HTML, Artifact, Dataset, Metrics, Model, TaskConfig
        from kfp_finetune.components.torchtune_finetune.finetune import run_component
        base = Model(uri={str(base_model.path)!r}, metadata=json.loads({json.dumps(base_model.metadata)!r}))
        train = Dataset(uri={str(train.path)!r}, metadata=json.loads({json.dumps(train.metadata)!r}))
        out = {str(tmp_path / "out")!r}
        run_component(
            workspace_path={str(workspace)!r}, train_data=train, base_model=base, eval_data=None,
            kubernetes_config=TaskConfig(), workspace_pvc="ws-pvc",
            model=Model(uri=out + "/model"), metrics=Metrics(uri=out + "/metrics"), report=HTML(uri=out + "/report"),
            train_config=Artifact(uri=out + "/config"), backend="trainjob", runtime_name="torchtune-cpu",
            runtime_kind="ClusterTrainingRuntime", num_nodes=1, num_proc_per_node=0, timeout_seconds=600,
            cleanup_policy="never", trainer_image="", run_id="cancel-run", task_name="torchtune-finetune",
            **json.loads({json.dumps(TRAINING)!r}),
        )
    """)
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig_path)}
    process = subprocess.Popen(
        [sys.executable, "-c", step], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    name = trainjob_name("cancel-run", "torchtune-finetune")
    deadline = time.monotonic() + 60
    while not kube.pods(name):
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the TrainJob never started"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0
    deletes = kube.requests_for("DELETE", "trainjobs", name)
    assert deletes and deletes[0].param("propagationPolicy") == "Background", output[-2000:]
    assert kube.trainjob(name) is None, "cancelling deletes the TrainJob even with cleanup_policy=never"
