"""torchtune-finetune with backend=trainjob survives a preempted or lost node pod: the stand-in in execute mode
runs the TrainJob's node command for real, preempts its pod at a random step (DisruptionTarget, SIGTERM, SIGKILL
after the grace period) or loses its node (SIGKILL), and the Job's podFailurePolicy (runtimes/torchtune-cpu.yaml:
DisruptionTarget -> Ignore) starts a replacement pod, whose command resumes from the run folder's checkpoint. The
steps, the learning rate and the loss at every step must be an uninterrupted run's (CPU fp32 on the tiny kit is
bitwise reproducible)."""

from __future__ import annotations

import json
import os
import random
import sys
import threading
from pathlib import Path

import pytest
import yaml
from kfp.dsl import HTML, Artifact, Dataset, Metrics, Model, TaskConfig
from kubernetes import client, watch

from kfp_finetune.components._shared.metrics_file import read_metrics_file, resume_points
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import trainjob_name
from kfp_finetune.components.torchtune_finetune.finetune import run_component
from tests.support import kube_standin as standin
from tests.support.kube_standin import Scenario

pytestmark = pytest.mark.slow
kube_standin = standin.kube_standin

RUNTIME = Path(__file__).resolve().parents[3] / "runtimes" / "torchtune-cpu.yaml"
TASK = "torchtune-finetune"
WORKSPACE_PVC = "run-7a11ce55-kfp-workspace"
STEP_POD, STEP_NODE = "finetune-step-pod", "kfp-node-a"
STEPS = 8  # 2 epochs x 4 steps
SEEDS = {"full": 2601, "lora": 2602, "lost": 2603, "kueue": 2604}
TRAINING = {"device": "cpu", "batch_size": 4, "gradient_accumulation_steps": 1, "max_steps_per_epoch": 4,
            "epochs": 2, "seed": 0, "learning_rate": 1e-3, "checkpoint_every_steps": 2}  # fmt: skip


def make_inputs(tiny_llama, tiny_dataset, root: Path) -> tuple[Path, Model, Dataset]:
    """A workspace filled by the real initializers, and their output artifacts."""
    workspace = root / "workspace"
    model = Model(uri=str(root / "artifacts" / "base_model"))
    train = Dataset(uri=str(root / "artifacts" / "train"))
    held_out = Dataset(uri=str(root / "artifacts" / "eval"))
    initialize_model(str(tiny_llama), str(workspace), name="base", output_model=model)
    initialize_dataset(str(tiny_dataset["train.jsonl"]), str(workspace), name="reverse", eval_fraction=0.1,
                       output_train=train, output_eval=held_out)  # fmt: skip
    return workspace, model, train


@pytest.fixture
def inputs(tiny_llama, tiny_dataset, tmp_path):
    return make_inputs(tiny_llama, tiny_dataset, tmp_path)


@pytest.fixture(scope="module")
def uninterrupted(tiny_llama, tiny_dataset, tmp_path_factory):
    """method -> (step, loss, lr) of an uninterrupted run with the same settings (backend=local, its own
    workspace), trained once per method for the module."""
    curves: dict[str, list] = {}

    def of(method: str) -> list:
        if method not in curves:
            root = tmp_path_factory.mktemp(f"uninterrupted-{method}")
            workspace, model, train = make_inputs(tiny_llama, tiny_dataset, root)
            _, run_dir = fine_tune(workspace, model, train, root, f"whole-{method}", method, backend="local")
            text = (run_dir / "logs" / "metrics.txt").read_text().splitlines()
            assert resume_points(text) == []
            curves[method] = curve(run_dir)
            assert len(curves[method]) == STEPS
        return curves[method]

    return of


def cluster(kube, workspace: Path, monkeypatch, access_mode: str, *, grace: int = 5) -> None:
    """The CPU runtime (with a short terminationGracePeriodSeconds), the workspace claim, this process as the
    step pod on STEP_NODE, and execute mode running node commands with this interpreter's environment."""
    runtime = yaml.safe_load(RUNTIME.read_text())
    node_job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    node_job["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = grace
    kube.add_object(runtime)
    kube.add_claim(WORKSPACE_PVC, access_mode)
    kube.add_running_pod(STEP_POD, STEP_NODE, claims=(WORKSPACE_PVC,))
    monkeypatch.setenv("KFP_POD_NAME", STEP_POD)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    kube.execute(
        {WORKSPACE_PVC: workspace}, extra_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    )


def fine_tune(
    workspace: Path, base_model, train, tmp_path: Path, run_id: str, method: str, backend: str = "trainjob",
    **launch,
):  # fmt: skip
    """The component's body; returns its result and the run folder."""
    outputs = tmp_path / f"outputs-{run_id}"
    config = TaskConfig(
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": WORKSPACE_PVC}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": str(workspace)}],
    )
    if backend == "local":
        config = TaskConfig()
    step = {"backend": backend, "runtime_name": "torchtune-cpu", "runtime_kind": "ClusterTrainingRuntime",
            "num_nodes": 1, "num_proc_per_node": 0, "timeout_seconds": 600, "cleanup_policy": "never",
            "trainer_image": "", "run_id": run_id, "task_name": TASK, **launch}  # fmt: skip
    result = run_component(
        workspace_path=str(workspace), train_data=train, base_model=base_model, eval_data=None,
        kubernetes_config=config, model=Model(uri=str(outputs / "model")),
        metrics=Metrics(uri=str(outputs / "metrics")), report=HTML(uri=str(outputs / "report")),
        train_config=Artifact(uri=str(outputs / "train_config")), method=method, **step, **TRAINING,
    )  # fmt: skip
    return result, workspace / "runs" / trainjob_name(run_id, TASK)


def curve(run_dir: Path) -> list[tuple[int, float | None, float | None]]:
    """(step, loss, lr) at every step of the run's metrics file, re-trained steps dropped."""
    return [(s.step, s.loss, s.values.get("lr")) for s in read_metrics_file(run_dir / "logs" / "metrics.txt")]


def pods_version(kube) -> str:
    return client.CoreV1Api(kube.api_client()).list_namespaced_pod(kube.namespace).metadata.resource_version


def pod_history(kube, job: str, since: str) -> list[dict]:
    """Every state the TrainJob's pods went through since resourceVersion ``since`` (a watch, as a client sees
    it: the disrupted pod is deleted once the Job has counted it)."""
    response = client.CoreV1Api(kube.api_client()).list_namespaced_pod(
        kube.namespace,
        label_selector=f"jobset.sigs.k8s.io/jobset-name={job}",
        watch=True,
        resource_version=since,
        timeout_seconds=1,
        _preload_content=False,
    )
    return [json.loads(line)["object"] for line in watch.watch.iter_resp_lines(response)]


def disruption_of(pod: dict) -> dict | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"), None)


def check_disrupted_run(
    kube, run_id: str, since: str, reason: str, exit_code: int | None, where: str
) -> list[dict]:
    """The TrainJob's first pod ended disrupted (``reason``; ``exit_code``, None: never reported) and a second pod
    finished the run; returns the first one's last state and the second one."""
    job = trainjob_name(run_id, TASK)
    states = pod_history(kube, job, since)
    uids = list(dict.fromkeys(p["metadata"]["uid"] for p in states))
    assert len(uids) == 2, f"{where}: one pod, then its replacement: {uids}"
    original = [p for p in states if p["metadata"]["uid"] == uids[0]][-1]
    condition = disruption_of(original)
    assert condition is not None and condition["reason"] == reason, f"{where}: {original['status']}"
    assert original["status"]["phase"] == "Failed", where
    state = original["status"]["containerStatuses"][0]["state"]
    assert (state.get("terminated") or {}).get("exitCode") == exit_code, f"{where}: {state}"
    (replacement,) = kube.pods(job)
    assert replacement["metadata"]["uid"] == uids[1], where
    assert replacement["status"]["phase"] == "Succeeded" and disruption_of(replacement) is None, where
    assert kube.trainjob(job)["status"]["conditions"][-1]["type"] == "Complete", where
    return [original, replacement]


@pytest.mark.parametrize("method", ["full", "lora"])
def test_a_preempted_node_pod_is_replaced_and_training_resumes_exactly(
    method, inputs, uninterrupted, kube_standin, tmp_path, monkeypatch
):
    workspace, base_model, train = inputs
    seed = SEEDS[method]
    preempt_at = random.Random(seed).randint(1, STEPS - 2)
    where = f"method {method}, preempted at step {preempt_at} (random.Random({seed}))"
    cluster(kube_standin, workspace, monkeypatch, "ReadWriteOnce")
    preempted_id = f"preempted-{method}"
    kube_standin.scenario(
        trainjob_name(preempted_id, TASK), Scenario(execute=True, preempt_on_line=f"Step {preempt_at} |")
    )

    since = pods_version(kube_standin)
    result, run_dir = fine_tune(workspace, base_model, train, tmp_path, preempted_id, method)

    expected = uninterrupted(method)
    assert curve(run_dir) == expected, where
    assert [s.loss for s in result.steps] == [loss for _, loss, _ in expected], where
    (resumed,) = resume_points((run_dir / "logs" / "metrics.txt").read_text().splitlines())
    assert preempt_at <= resumed < STEPS, f"{where}: the SIGTERM checkpoint is at or after the preempted step"
    original, replacement = check_disrupted_run(
        kube_standin, preempted_id, since, "PreemptionByScheduler", 143, where
    )
    # The runtime's preStop hook asked for the checkpoint before the kubelet's SIGTERM (stop_request.py).
    assert "(the pod is stopping): a retry resumes from it" in kube_standin.pod_log(
        original["metadata"]["name"]
    ), where
    assert f"Resumed after step {resumed}" in kube_standin.pod_log(replacement["metadata"]["name"]), where


def test_a_lost_node_pod_is_replaced_and_training_resumes_from_the_last_interval_checkpoint(
    inputs, uninterrupted, kube_standin, tmp_path, monkeypatch
):
    workspace, base_model, train = inputs
    seed = SEEDS["lost"]
    lost_at = random.Random(seed).randint(3, STEPS - 2)  # after the first interval checkpoint (step 2)
    where = f"node lost at step {lost_at} (random.Random({seed}))"
    cluster(kube_standin, workspace, monkeypatch, "ReadWriteMany")  # the replacement may run on another node
    lost_id = "lost-node"
    scenario = Scenario(execute=True, lose_node_on_line=f"Step {lost_at} |")
    kube_standin.scenario(trainjob_name(lost_id, TASK), scenario)

    since = pods_version(kube_standin)
    result, run_dir = fine_tune(workspace, base_model, train, tmp_path, lost_id, "lora")

    assert curve(run_dir) == uninterrupted("lora"), where
    assert len(result.steps) == STEPS, where
    # SIGKILL at once: no checkpoint of its own; the newest complete interval one (every 2 steps) from before
    (resumed,) = resume_points((run_dir / "logs" / "metrics.txt").read_text().splitlines())
    assert resumed % 2 == 0 and 2 <= resumed <= lost_at, f"{where}: resumed after step {resumed}"
    original, _ = check_disrupted_run(kube_standin, lost_id, since, "DeletionByPodGC", None, where)
    assert "stopping after the checkpoint" not in kube_standin.pod_log(original["metadata"]["name"]), where


def test_a_trainjob_kueue_preempts_saves_through_the_stop_hook_and_resumes_exactly_once_readmitted(
    inputs, uninterrupted, kube_standin, tmp_path, monkeypatch
):
    """Kueue preempts the queued TrainJob while it trains: it is suspended, the Job deletes its pod and the kubelet
    runs the runtime's preStop hook, so the training saves and exits before its SIGTERM; once Kueue admits the
    TrainJob again its new pod resumes from that checkpoint, with an uninterrupted run's steps and losses."""
    workspace, base_model, train = inputs
    cluster(kube_standin, workspace, monkeypatch, "ReadWriteOnce")
    kube_standin.add_local_queue("team-queue")
    run_id = "kueue-preempted"
    job = trainjob_name(run_id, TASK)
    preempt_at = random.Random(SEEDS["kueue"]).randint(1, STEPS - 2)
    where = f"Kueue preempted at step {preempt_at} (random.Random({SEEDS['kueue']}))"
    kube_standin.scenario(job, Scenario(execute=True, kueue_preempt_on_line=f"Step {preempt_at} |"))
    ran: dict = {}

    def step() -> None:
        ran["result"], ran["run_dir"] = fine_tune(
            workspace, base_model, train, tmp_path, run_id, "lora", queue_name="team-queue"
        )

    running = threading.Thread(target=step)
    running.start()
    kube_standin.wait_for_trainjob(job, timeout=300)
    kube_standin.admit(job)
    first = kube_standin.wait_for_pod(job, lambda pod: "deletionTimestamp" in pod["metadata"], timeout=300)
    kube_standin.scenario(job, Scenario(execute=True))  # the second start runs to its end
    kube_standin.admit(job)  # its pods start once the old one has stopped
    running.join(timeout=600)

    assert "result" in ran, f"{where}: the step did not finish"
    run_dir = ran["run_dir"]
    assert curve(run_dir) == uninterrupted("lora"), where
    (resumed,) = resume_points((run_dir / "logs" / "metrics.txt").read_text().splitlines())
    assert preempt_at <= resumed < STEPS, where
    log = kube_standin.pod_log(first["metadata"]["name"])
    assert f"stopping after the checkpoint at step {resumed} (the pod is stopping)" in log, log[-2000:]
    assert ran["result"].metrics["resumes"] == 1.0, where
