"""runtimes/rbac.yaml against what the trainjob backend really calls: full launches (and the placement checks) run
with the stand-in enforcing RBAC from the file, and every call the stand-in recorded must have been granted."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from kfp_finetune.components._shared.kube.client import Backoff
from kfp_finetune.components.torchtune_finetune.backends.trainjob import (
    TrainJobFailed,
    TrainJobLauncher,
    placement,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from tests.support.kube_standin import KubeStandin, Scenario

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "runtimes" / "rbac.yaml"
NAMESPACE, ACCOUNT = "kubeflow", "pipeline-runner"  # where runtimes/rbac.yaml binds its roles
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"


def rbac_documents() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(RBAC.read_text()) if doc]


def granted(documents: list[dict]) -> set[tuple[str, str, str]]:
    """(verb, apiGroup, resource[/subresource]) that the roles in `documents` name."""
    return {
        (verb, group, resource)
        for doc in documents
        if doc["kind"] in ("Role", "ClusterRole")
        for rule in doc["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def manifest(task: str, runtime: str = "torchtune-cpu", **kwargs) -> dict:
    return tj.build_trainjob(
        tj.trainjob_name("run-rbac", task),
        ["tune", "run", "lora_finetune_single_device", "--config", "/kfp-workspace/runs/r/config.yaml"],
        runtime=runtime,
        run_id="run-rbac",
        task_name=task,
        **kwargs,
    )


def launch(kube: KubeStandin, job: dict, **options):
    settings = dict(
        namespace=NAMESPACE,
        tick=0.02,
        watch_timeout=1,
        pending_warning_after=0.1,
        log_drain_timeout=3,
        handle_signals=False,
        backoff=Backoff(initial=0.01, maximum=0.05, sleep=lambda _: None),
    )
    return TrainJobLauncher(job, kube.api_client(), **{**settings, **options}).run()


def full_launches(kube: KubeStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the backend does on a cluster, in each of its paths."""
    kube.add_object(yaml.safe_load((REPO / "runtimes" / "torchtune-cpu.yaml").read_text()))
    kube.add_runtime("namespaced-torch", kind="TrainingRuntime", namespace=NAMESPACE)
    # Placement (before the launch): the workspace claim's access mode and this step's node.
    kube.add_claim("workspace", "ReadWriteOnce")
    kube.add_running_pod("step-pod", "node-a", claims=("workspace",))
    monkeypatch.setenv(placement.POD_NAME_ENV, "step-pod")
    volume, mount = tj.workspace_volume("workspace", "/kfp-workspace")
    placed = placement.place_node_pods(
        tj.NodePodSettings(volumes=[volume], volume_mounts=[mount]),
        api_client=kube.api_client(),
        namespace=NAMESPACE,
        num_nodes=1,
    )
    assert placed.affinity  # pinned to node-a: both reads were allowed
    # Create, slow start (events of the pending pods), watch, stream the log, finish, delete.
    kube.scenario(None, Scenario.success(pending_seconds=0.3))
    assert launch(kube, manifest("success")).deleted
    # A KFP retry after a failed attempt replaces it.
    kube.add_object(manifest("failed-before"), scenario=Scenario.failure(log_lines=[], pending_seconds=0))
    kube.wait_for_trainjob(
        manifest("failed-before")["metadata"]["name"], condition="Failed", namespace=NAMESPACE
    )
    kube.scenario(manifest("failed-before")["metadata"]["name"], Scenario.success())
    assert launch(kube, manifest("failed-before")).created  # 409, get, delete, wait until gone, create again
    # A failure with a namespaced runtime and no log lines (the tail is fetched), deleted by the cleanup policy.
    kube.scenario(None, Scenario.failure(log_lines=[]))
    with pytest.raises(TrainJobFailed):
        launch(
            kube,
            manifest("fails", runtime="namespaced-torch", runtime_kind="TrainingRuntime"),
            cleanup="always",
        )
    # A KFP retry attaches to the TrainJob it launched before.
    kube.scenario(None, Scenario.success())
    kube.add_object(manifest("attach"))
    assert not launch(kube, manifest("attach")).created
    # A TrainJob in a Kueue queue: the LocalQueue is read before creating, the Workload and its position in the
    # queue (Kueue's visibility API) while it waits.
    kube.add_local_queue("team-queue", namespace=NAMESPACE)
    queued = manifest("queued", queue_name="team-queue")

    def admit_once_waiting() -> None:
        kube.wait_for_request("GET", "workloads")
        kube.wait_for_request("GET", where=lambda r: r.path.endswith("/pendingworkloads"))
        kube.admit(queued["metadata"]["name"], namespace=NAMESPACE)

    admitter = threading.Thread(target=admit_once_waiting, daemon=True)
    admitter.start()
    assert launch(kube, queued, queue_report_interval=0.05).deleted
    admitter.join()


@pytest.mark.slow
def test_every_call_of_the_trainjob_backend_is_granted_by_rbac_yaml(monkeypatch):
    documents = rbac_documents()
    with KubeStandin(namespace=NAMESPACE) as kube:
        assert kube.enforce_rbac(documents, service_account=f"{NAMESPACE}:{ACCOUNT}") == USER
        full_launches(kube, monkeypatch)
        decisions = kube.authorizations
        denied = sorted({d.attributes.key for d in decisions if not d.allowed})
        assert not denied, f"runtimes/rbac.yaml does not grant {USER}: {denied}"
        assert {d.user for d in decisions} == {USER}
        used = {
            (a.verb, a.group, f"{a.resource}/{a.subresource}" if a.subresource else a.resource)
            for a in (d.attributes for d in decisions)
        }
    # Least privilege: nothing is granted that the backend never uses.
    assert granted(documents) - used == set()


@pytest.mark.slow
def test_a_call_rbac_yaml_does_not_grant_is_caught(monkeypatch):
    """Without `list` on events, the slow start's diagnostics are denied: the same launches fail the check."""
    documents = rbac_documents()
    for doc in documents:
        for rule in doc.get("rules", []):
            if rule["resources"] == ["events"]:
                rule["verbs"] = ["get"]
    with KubeStandin(namespace=NAMESPACE) as kube:
        kube.enforce_rbac(documents, service_account=f"{NAMESPACE}:{ACCOUNT}")
        full_launches(kube, monkeypatch)
        denied = {d.attributes.key for d in kube.authorizations if not d.allowed}
        (forbidden,) = [r for r in kube.requests_for("GET", "events") if r.status == 403][:1]
    assert denied == {("list", "", "events", "", NAMESPACE)}
    assert forbidden.path == f"/api/v1/namespaces/{NAMESPACE}/events"
