"""What the launcher does when it cannot do everything: permissions checked before anything is created, and watch
or log threads that fail degrade (say why, re-list, stop following the log) instead of deleting training."""

from __future__ import annotations

import re
import time

import pytest
import yaml

from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobError, TrainJobFailed
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.components.torchtune_finetune.test_trainjob_lifecycle import Running, requests_after
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube
user_log = base.user_log
ACCOUNT = "team-a:pipeline-runner"


def rbac_documents(without: tuple[str, str] | None = None) -> list[dict]:
    """runtimes/rbac.yaml bound in team-a, less one (resource, verb) grant."""
    text = (
        (base.REPO / "runtimes" / "rbac.yaml").read_text().replace("namespace: kubeflow", "namespace: team-a")
    )
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    for doc in documents:
        for rule in doc.get("rules", []):
            if without and without[0] in rule["resources"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != without[1]]
    return documents


def test_a_role_without_pods_log_runs_the_training_without_its_log(kube, user_log):
    """Today's fault: the log stream's 403 made the launcher delete a healthy TrainJob 0.1 s after creating it."""
    kube.enforce_rbac(rbac_documents(without=("pods/log", "get")), service_account=ACCOUNT)
    kube.scenario(None, Scenario.success(["Step 1 | loss:1.0", "Step 2 | loss:0.9"]))
    result = base.launcher(kube, cleanup="never").run()
    assert result.status == "Complete" and result.created
    assert not kube.requests_for("DELETE", "trainjobs")
    assert not [r for r in kube.requests if r.subresource == "log"]  # not even tried
    assert "may not get pods/log in namespace team-a: the rank-0 log is not streamed" in user_log.text
    assert "lost track" not in user_log.text


@pytest.mark.parametrize(
    ("resource", "verb", "named"),
    [
        ("trainjobs", "delete", "delete trainjobs (trainer.kubeflow.org)"),
        ("pods", "watch", "watch pods"),
        ("trainjobs", "create", "create trainjobs (trainer.kubeflow.org)"),
    ],
)
def test_a_permission_the_launcher_cannot_do_without_stops_it_before_anything_is_created(
    kube, resource, verb, named
):
    kube.enforce_rbac(rbac_documents(without=(resource, verb)), service_account=ACCOUNT)
    with pytest.raises(
        TrainJobError, match=re.escape(f"may not {named} in namespace team-a: nothing was created")
    ) as raised:
        base.launcher(kube).run()
    assert "runtimes/rbac.yaml" in str(raised.value)
    assert not kube.requests_for("POST", "trainjobs") and not kube.trainjobs()
    assert isinstance(raised.value, ValueError)  # a ConfigError: the step prints it as one line


@pytest.mark.slow
def test_a_log_stream_error_stops_the_log_not_the_training(kube, user_log):
    lines = [f"Step {i} | loss:1.0" for i in range(1, 31)]
    kube.scenario(None, Scenario.success(lines, line_interval=0.05))
    running = Running(base.launcher(kube, cleanup="never"))
    kube.wait_for_request("GET", "pods", where=lambda r: r.subresource == "log" and r.status == 200)
    kube.fail_next(1, status=403, method="GET", path_contains="/log")  # the reconnect is refused
    kube.end_log_streams()
    result = running.result()
    assert result.status == "Complete"
    assert not kube.requests_for("DELETE", "trainjobs")
    assert "stopped following the rank-0 log of TrainJob" in user_log.text
    assert "403" in user_log.text and "kubectl logs -n team-a" in user_log.text


@pytest.mark.slow
def test_a_watch_error_is_said_and_relisted_never_deleting(kube, user_log):
    kube.scenario(None, Scenario.success([f"l{i}" for i in range(60)], line_interval=0.05))
    running = Running(base.launcher(kube, cleanup="never"))
    kube.wait_for_request("GET", "trainjobs", where=lambda r: r.query.get("watch", "").lower() == "true")
    # The watch is re-opened each second (watch_timeout=1): the next one gets a 400, which no retry mends.
    kube.fail_next(1, status=400, method="GET", path_contains="/trainjobs")
    result = running.result()
    assert result.status == "Complete" and not kube.requests_for("DELETE", "trainjobs")
    assert f"watching TrainJob {NAME} failed (400" in user_log.text and "re-listing in" in user_log.text


@pytest.mark.slow
def test_a_retry_waits_for_its_own_terminating_trainjob_then_creates(kube, user_log):
    """An earlier attempt's TrainJob, deleted in the foreground, is still readable (deletionTimestamp) while its
    JobSet and pods go: the retry must not attach to it (it would fail "deleted by someone else")."""
    from kubernetes import client

    kube.add_object(
        base.manifest(), scenario=Scenario.success([f"old {i}" for i in range(200)], line_interval=0.05)
    )
    kube.wait_for_pod(NAME, lambda pod: pod["status"]["phase"] == "Running")
    kube.hold_garbage_collection()
    client.CustomObjectsApi(kube.api_client()).delete_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", "team-a", "trainjobs", NAME, propagation_policy="Foreground"
    )
    assert kube.trainjob(NAME)["metadata"]["deletionTimestamp"]
    kube.scenario(NAME, Scenario.success(["new run"]))
    running = Running(base.launcher(kube))
    kube.wait_for_request("POST", "trainjobs")  # the 409
    mark = len(kube.requests)
    kube.wait_for_request(
        "GET", "jobsets", where=requests_after(kube, mark)
    )  # waiting for what is left of it
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [409]
    while kube.collect_garbage():
        pass
    result = running.result()
    assert result.status == "Complete" and result.created and result.log_lines == ["new run"]
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [409, 201]
    assert "is being deleted: waiting for it to be gone, then creating" in user_log.text


def test_a_failed_rank_is_read_from_a_fresh_pod_list_when_the_pod_watch_lags(kube):
    """The TrainJob's Failed condition can arrive before the pod watch shows the OOMKilled pod (seen once on a
    cluster as a failure reported without its reason): the report reads a fresh list of the pods."""
    kube.delay_watch_events("pods", 3600)
    kube.scenario(
        None, Scenario.oom(log_lines=["Step 1 | loss:2.0", "torch.OutOfMemoryError: CUDA out of memory"])
    )
    with pytest.raises(TrainJobFailed) as raised:
        base.launcher(kube).run()
    message = str(raised.value)
    assert "(rank 0): OOMKilled (exit code 137)" in message
    assert "CUDA out of memory" in message  # the tail, read from the pod the list named


def wait_for_text(log, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.text:
        assert time.monotonic() < deadline, f"{text!r} not in the step log after {timeout}s:\n{log.text}"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_lost_node_and_its_replacement_pod_are_said_while_the_trainjob_runs(kube, user_log):
    """runtimes/torchtune-cpu.yaml ignores DisruptionTarget: the Job replaces the pod and the trainer starts over.
    Both are in the step log at once (from the pod watch), not after the TrainJob ended or timed out."""
    lines = [f"Step {i} | loss:1.0" for i in range(1, 61)]
    kube.scenario(None, Scenario.success(lines, line_interval=0.05, lost_node_after_lines=2))
    running = Running(base.launcher(kube, cleanup="never"))
    wait_for_text(user_log, "runs in a new pod")
    assert kube.trainjob(NAME)["status"].get("conditions") in (None, [])  # said while it still trains
    assert "(rank 0) is disrupted: DeletionByPodGC: PodGC: node no longer exists" in user_log.text
    result = running.result()
    assert result.status == "Complete"
    assert "rank-0 pod restarted as" in user_log.text and result.log_lines[-1] == lines[-1]


def test_a_lost_node_the_runtime_does_not_ignore_fails_naming_the_disruption(kube):
    kube.add_runtime("no-ignore", restart_policy="Never", backoff_limit=0)
    job = base.manifest()
    job["spec"]["runtimeRef"]["name"] = "no-ignore"
    kube.scenario(None, Scenario.success(["Step 1 | loss:1.0", "Step 2 | loss:0.9"], lost_node_after_lines=1))
    with pytest.raises(
        TrainJobFailed, match=r"\(rank 0\): disrupted \(DeletionByPodGC: PodGC: node no longer exists\)"
    ):
        base.launcher(kube, job).run()
