"""The transformers engine in a TrainJob (issue 28): the fine-tune step launches the engine's command through the
node entrypoint (`--engine transformers`), on the engine's own runtime when none is named, and the stand-in's
execute mode runs that command for real. Same inputs and seed as the local backend, same losses; a run the node's
checks refuse fails the TrainJob with one line before training."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from kfp.dsl import HTML, Artifact, Dataset, Metrics, Model, TaskConfig

from kfp_finetune.components._shared.transformers.plan import MODULE as TRAIN_MODULE
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobFailed
from kfp_finetune.components.torchtune_finetune.entrypoint import MODULE as ENTRYPOINT
from kfp_finetune.components.torchtune_finetune.finetune import run_component
from tests.support import kube_standin as standin

pytest.importorskip("trl")
pytestmark = pytest.mark.slow
kube_standin = standin.kube_standin

RUN_ID = "7e3f-transformers"
WORKSPACE_PVC = "run-7e3f-kfp-workspace"
STEP_POD, STEP_NODE = "finetune-step-pod", "kfp-node-a"
RUNTIMES = Path(__file__).resolve().parents[3] / "runtimes"
TRAINING = {"method": "lora", "device": "cpu", "batch_size": 4, "max_steps_per_epoch": 3, "seed": 0,
            "learning_rate": 1e-3}  # fmt: skip


@pytest.fixture
def inputs(tiny_dataset, tmp_path):
    """A workspace with the tiny Qwen3-MoE (torchtune cannot serve it) and the data, by the real initializers."""
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    workspace = tmp_path / "workspace"
    model = Model(uri=str(tmp_path / "artifacts" / "base_model"))
    train = Dataset(uri=str(tmp_path / "artifacts" / "train"))
    initialize_model(str(build_tiny_hf_model(tmp_path / "moe", "qwen3_moe")), str(workspace), name="base",
                     output_model=model)  # fmt: skip
    initialize_dataset(str(tiny_dataset["train.jsonl"]), str(workspace), name="reverse", eval_fraction=0.1,
                       output_train=train, output_eval=Dataset(uri=str(tmp_path / "artifacts" / "eval")))  # fmt: skip
    return workspace, model, train


@pytest.fixture
def cluster(kube_standin, inputs, monkeypatch):
    return serve_workspace(kube_standin, inputs[0], monkeypatch)


def serve_workspace(kube_standin, workspace: Path, monkeypatch, access_mode: str = "ReadWriteOnce"):
    """The transformers-cpu runtime; this process as the step pod holding the workspace; node commands executed."""
    kube_standin.add_object(yaml.safe_load((RUNTIMES / "transformers-cpu.yaml").read_text()))
    kube_standin.add_claim(WORKSPACE_PVC, access_mode)
    kube_standin.add_running_pod(STEP_POD, STEP_NODE, claims=(WORKSPACE_PVC,))
    monkeypatch.setenv("KFP_POD_NAME", STEP_POD)
    monkeypatch.setenv("KUBECONFIG", str(kube_standin.kubeconfig_path))
    kube_standin.execute(
        {WORKSPACE_PVC: workspace},
        extra_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"},
    )
    return kube_standin


def fine_tune(inputs, tmp_path, backend, config, **params):
    workspace, base_model, train = inputs
    outputs = tmp_path / f"outputs-{backend}"
    artifacts = {
        "model": Model(uri=str(outputs / "model")),
        "metrics": Metrics(uri=str(outputs / "metrics")),
        "report": HTML(uri=str(outputs / "report")),
        "train_config": Artifact(uri=str(outputs / "train_config")),
    }
    step = {"backend": backend, "runtime_name": "transformers-cpu", "runtime_kind": "ClusterTrainingRuntime",
            "num_nodes": 1, "num_proc_per_node": 0, "timeout_seconds": 600, "cleanup_policy": "on-success",
            "trainer_image": "", "run_id": f"{RUN_ID}-{backend}", "task_name": "torchtune-finetune"}  # fmt: skip
    result = run_component(
        workspace_path=str(workspace), train_data=train, base_model=base_model, eval_data=None,
        kubernetes_config=config, **artifacts, **{**step, **TRAINING, **params},
    )  # fmt: skip
    return result, artifacts


def task_config(workspace: Path) -> TaskConfig:
    return TaskConfig(
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": str(workspace)}],
        resources={"requests": {"cpu": "2", "memory": "4Gi"}},
    )


def initialized(tmp_path: Path, model_kind: str, source: Path, **dataset) -> tuple:
    """A tiny HF model (hf_models.py `model_kind`) and the data at `source`, by the real initializers: (workspace,
    base_model, train_data)."""
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    workspace = tmp_path / "workspace"
    model = Model(uri=str(tmp_path / "artifacts" / "base_model"))
    train = Dataset(uri=str(tmp_path / "artifacts" / "train"))
    initialize_model(str(build_tiny_hf_model(tmp_path / model_kind, model_kind)), str(workspace), name=model_kind,
                     output_model=model)  # fmt: skip
    initialize_dataset(str(source), str(workspace), eval_fraction=0.1, output_train=train,
                       output_eval=Dataset(uri=str(tmp_path / "artifacts" / "eval")), **dataset)  # fmt: skip
    return workspace, model, train


@pytest.fixture
def classifier_inputs(tmp_path):
    """The tiny BERT classifier and star-rated reviews as classification data."""
    from kfp_finetune.tiny.reviews import write_reviews

    reviews = write_reviews(tmp_path / "yelp.jsonl", count=60)
    return initialized(tmp_path, "bert_classifier", reviews, name="yelp", dataset_type="classification")


def test_a_sequence_classifier_trains_in_a_trainjob_as_it_does_locally(
    classifier_inputs, kube_standin, monkeypatch, tmp_path
):
    """Classification data: the node pod checks that its transformers has the classifier class, then trains
    transformers' Trainer; the losses are the local run's."""
    serve_workspace(kube_standin, classifier_inputs[0], monkeypatch)
    remote, artifacts = fine_tune(classifier_inputs, tmp_path, "trainjob", task_config(classifier_inputs[0]))
    local, _ = fine_tune(classifier_inputs, tmp_path, "local", TaskConfig())
    meta = artifacts["model"].metadata
    assert (meta["engine"], meta["task"], meta["backend"]) == ("transformers", "classification", "trainjob")
    assert [round(s.loss, 4) for s in remote.steps] == [round(s.loss, 4) for s in local.steps]
    merged = json.loads((Path(classifier_inputs[0]) / meta["merged_path"] / "config.json").read_text())
    assert merged["architectures"] == ["BertForSequenceClassification"] and len(merged["id2label"]) == 5


@pytest.fixture
def picture_inputs(tmp_path):
    """The tiny Gemma 3 VLM and pictures of colours as multimodal data."""
    from kfp_finetune.tiny.pictures import IMAGE_DIR, write_pictures

    pictures = write_pictures(tmp_path / "pictures", count=40)
    return initialized(
        tmp_path, "gemma3_vlm", pictures, name="pictures", dataset_type="multimodal", image_dir=IMAGE_DIR
    )


def test_a_vision_language_model_trains_in_a_trainjob_as_it_does_locally(
    picture_inputs, kube_standin, monkeypatch, tmp_path
):
    """Image + text rows: the node pod checks that its transformers has the image-text-to-text class, then TRL
    trains on the pictures; the losses are the local run's."""
    serve_workspace(kube_standin, picture_inputs[0], monkeypatch)
    remote, artifacts = fine_tune(picture_inputs, tmp_path, "trainjob", task_config(picture_inputs[0]))
    local, _ = fine_tune(picture_inputs, tmp_path, "local", TaskConfig())
    meta = artifacts["model"].metadata
    assert (meta["engine"], meta["task"], meta["backend"]) == (
        "transformers",
        "image-text-to-text",
        "trainjob",
    )
    assert [round(s.loss, 4) for s in remote.steps] == [round(s.loss, 4) for s in local.steps]
    merged = json.loads((Path(picture_inputs[0]) / meta["merged_path"] / "config.json").read_text())
    assert merged["architectures"] == ["Gemma3ForConditionalGeneration"] and "vision_config" in merged


def test_a_run_the_node_refuses_fails_the_trainjob_with_the_reason_before_training(inputs, cluster, tmp_path):
    """The launcher (no torch) cannot know that this image's CUDA sees no GPU: the node's TRL checks can."""
    with pytest.raises(TrainJobFailed) as failed:
        fine_tune(inputs, tmp_path, "trainjob", task_config(inputs[0]), device="cuda")
    assert "kfp-finetune: the run cannot train (node 0): tune_device is cuda, but CUDA sees no GPU" in str(
        failed.value
    )
    assert not list(Path(inputs[0]).glob("runs/*/logs/metrics.txt")), "training never started"


def test_two_nodes_train_data_parallel_and_resume_together_when_one_is_preempted(
    inputs, kube_standin, monkeypatch, tmp_path
):
    """Two node pods: `torchrun` from Trainer's PET_* environment trains at world size 2 (KEP-2839 found `accelerate
    launch` silently trained at world size 1). The scheduler preempts rank 1's pod: its preStop hook asks for the
    stop, both pods save the checkpoint at the same step; rank 0's pod, whose own pod is not stopping, exits 75,
    which the runtime's podFailurePolicy ignores as it ignores the preempted pod's DisruptionTarget (with 143 its
    FailJob rule would fail the TrainJob). The Job replaces both pods, which resume from that checkpoint together;
    every step is trained once."""
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name

    cluster = serve_workspace(kube_standin, inputs[0], monkeypatch, "ReadWriteMany")
    job = trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune")
    cluster.scenario(job, standin.Scenario(execute=True, preempt_on_line="Step 2 |", preempted_rank=1))
    result, artifacts = fine_tune(
        inputs, tmp_path, "trainjob", task_config(inputs[0]), num_nodes=2, max_steps_per_epoch=6,
        cleanup_policy="never",
    )  # fmt: skip

    spec = cluster.requests_for("POST", "trainjobs")[0].body["spec"]
    command = spec["trainer"]["command"]
    assert command[5] == "torchrun" and command[-3:-1] == ["-m", TRAIN_MODULE]
    assert spec["trainer"]["numNodes"] == 2
    resolved = json.loads(
        (Path(inputs[0]) / artifacts["model"].metadata["run_dir"] / "trl_config.json").read_text()
    )
    assert resolved["world_size"] == 2
    assert [s.step for s in result.steps] == list(range(1, 7)) and result.metrics["resumes"] == 1.0
    (preempted,) = [e["involvedObject"]["name"] for e in cluster.events() if e["reason"] == "Preempted"]
    assert "-node-0-1-" in preempted
    pods = cluster.pods(job)  # the failed pod stays (restartPolicy Never); the preempted one was deleted
    (other,) = [p for p in pods if p["status"]["phase"] == "Failed"]
    state = other["status"]["containerStatuses"][0]["state"]["terminated"]
    assert "-node-0-0-" in other["metadata"]["name"] and state["exitCode"] == 75
    log = cluster.pod_log(other["metadata"]["name"])
    assert "the training processes stopped (another node's pod is stopping): exit code 75" in log, log[-3000:]
    replacements = [p for p in pods if p["status"]["phase"] == "Succeeded"]
    assert len(replacements) == 2
    saved = int(re.search(r"stopped \(another node's pod is stopping\) at step (\d+)", log)[1])
    resumed = f"an earlier start of this run saved checkpoint-{saved}: training resumes from it"
    assert 2 <= saved < 6 and any(resumed in cluster.pod_log(p["metadata"]["name"]) for p in replacements)
    assert f"stopped (the pod is stopping) at step {saved}" in cluster.pod_log(preempted)
    assert cluster.trainjob(job)["status"]["conditions"][-1]["type"] == "Complete"
    assert not [e for e in cluster.events() if e["reason"] in ("PodFailurePolicy", "FailedPreStopHook")]


def test_two_nodes_where_one_node_is_lost_fail_as_the_infrastructures_for_the_steps_retry(
    inputs, kube_standin, monkeypatch, tmp_path
):
    """Rank 1's node is lost at step 2: rank 0's collectives fail with the vanished peer and its pod crashes, which
    the runtime's FailJob rule makes the TrainJob's failure, while PodGC's lost pod is being replaced. The failure
    names the lost pod, so the step's KFP retry takes it for the infrastructure's and trains again from the newest
    checkpoint (a crash of its own would not be retried)."""
    from kfp_finetune.components.torchtune_finetune import attempts
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name

    cluster = serve_workspace(kube_standin, inputs[0], monkeypatch, "ReadWriteMany")
    job = trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune")
    cluster.scenario(job, standin.Scenario(execute=True, lose_node_on_line="Step 2 |", lost_node_rank=1))
    with pytest.raises(TrainJobFailed) as failed:
        fine_tune(
            inputs, tmp_path, "trainjob", task_config(inputs[0]), num_nodes=2, max_steps_per_epoch=6,
            cleanup_policy="never",
        )  # fmt: skip

    assert re.search(r"-node-0-1-\w+ \(rank 1\): disrupted \(DeletionByPodGC", str(failed.value)), str(
        failed.value
    )
    recorded = attempts.read(Path(inputs[0]) / "runs" / job)
    assert recorded is not None and recorded.outcome == attempts.INFRASTRUCTURE, recorded


def test_a_preempted_torchrun_pod_saves_its_checkpoint_before_torchrun_could_kill_its_workers(
    inputs, cluster, tmp_path, monkeypatch
):
    """torchrun SIGKILLs its workers a fixed time after it got SIGTERM (30 s before torch 2.12, which the trainer
    images have); here that time is 0, so a checkpoint saved on SIGTERM could never be written. The runtime's preStop
    hook asks both processes to save and exit first, and the kubelet's SIGTERM comes only after: the replacement pod
    resumes from that checkpoint and every step is trained once."""
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name

    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "0")  # the node pods' environment (execute mode)
    job = trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune")
    cluster.scenario(job, standin.Scenario(execute=True, preempt_on_line="Step 1 |"))
    result, _ = fine_tune(
        inputs, tmp_path, "trainjob", task_config(inputs[0]), num_proc_per_node=2, max_steps_per_epoch=6,
        cleanup_policy="never",
    )  # fmt: skip

    (preempted,) = [e["involvedObject"]["name"] for e in cluster.events() if e["reason"] == "Preempted"]
    stopped = re.search(r"stopped \(the pod is stopping\) at step (\d+)", cluster.pod_log(preempted))
    assert stopped, cluster.pod_log(preempted)[-3000:]
    # The pod exits as its workers did (143), not with torchrun's error for workers that exited non-zero.
    assert "the training processes stopped (this pod is stopping): exit code 143" in cluster.pod_log(
        preempted
    )
    saved = int(stopped[1])
    assert [s.step for s in result.steps] == list(range(1, len(result.steps) + 1))
    assert 1 < saved < len(result.steps) and result.metrics["resumes"] == 1.0
    (replacement,) = cluster.pods(job)
    log = cluster.pod_log(replacement["metadata"]["name"])
    assert f"an earlier start of this run saved checkpoint-{saved}: training resumes from it" in log
    assert not [e for e in cluster.events() if e["reason"] == "FailedPreStopHook"]


def test_the_engine_trains_in_a_trainjob_as_it_does_locally_through_a_preemption(inputs, cluster, tmp_path):
    """The fine-tune step launches the engine's command on its runtime; the scheduler preempts the node pod once it
    logged step 2: the kubelet's SIGTERM makes the run save a checkpoint and exit 143; the Job replaces the pod
    (DisruptionTarget: not a failure) and the new pod's run resumes from that checkpoint; every step is logged once
    and the losses are the local run's. (The classifier, picture and two-process runs go uninterrupted.)"""
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name

    steps = {"max_steps_per_epoch": 6}
    local, _ = fine_tune(inputs, tmp_path, "local", TaskConfig(), **steps)
    job = trainjob_name(f"{RUN_ID}-trainjob", "torchtune-finetune")
    cluster.scenario(job, standin.Scenario(execute=True, preempt_on_line="Step 2 |"))
    remote, artifacts = fine_tune(
        inputs, tmp_path, "trainjob", task_config(inputs[0]), cleanup_policy="never", **steps
    )

    assert artifacts["model"].metadata["engine"] == "transformers"
    assert artifacts["model"].metadata["backend"] == "trainjob"
    assert [s.step for s in remote.steps] == list(range(1, 7))
    assert [round(s.loss, 4) for s in remote.steps] == [round(s.loss, 4) for s in local.steps]
    (replacement,) = cluster.pods(job)
    log = cluster.pod_log(replacement["metadata"]["name"])
    assert "training resumes from it" in log, log[-2000:]
    assert remote.metrics["resumes"] == 1.0 and "resumes" not in local.metrics
    spec = cluster.requests_for("POST", "trainjobs")[0].body["spec"]
    assert spec["runtimeRef"]["name"] == "transformers-cpu"
    # The node pod checks with torch first (entrypoint --engine), then trains in the same process.
    settings = str(Path(remote.run.settings_path))
    assert spec["trainer"]["command"] == [
        "python", "-m", ENTRYPOINT, "--engine", "transformers", "python", "-m", TRAIN_MODULE, settings,
    ]  # fmt: skip
    assert sorted(p.name for p in Path(artifacts["train_config"].path).iterdir()) == [
        "sft_settings.json", "trainjob.yaml", "trl_config.json",
    ]  # fmt: skip
    merged = Path(inputs[0]) / artifacts["model"].metadata["merged_path"]
    assert (merged / "config.json").is_file()
