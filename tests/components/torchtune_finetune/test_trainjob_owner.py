"""The TrainJob is owned by the step's pod (owner.py): deleting the pod (eviction, node loss, a deleted workflow)
deletes the TrainJob through the garbage collector; a retry that attaches becomes an owner too."""

from __future__ import annotations

import pytest

from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobError, placement
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.components.torchtune_finetune.test_trainjob_lifecycle import Running
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube
user_log = base.user_log
LONG = Scenario.success([f"Step {i} | loss:1.0" for i in range(1, 2001)], line_interval=0.05)


def reference(pod: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}


def test_deleting_the_step_pod_deletes_its_trainjob(kube, monkeypatch):
    step = kube.add_running_pod("step-pod", "node-a")
    monkeypatch.setenv(placement.POD_NAME_ENV, "step-pod")
    kube.scenario(None, LONG)
    running = Running(base.launcher(kube))
    kube.wait_for_pod(NAME, lambda pod: pod["status"]["phase"] == "Running")
    assert kube.trainjob(NAME)["metadata"]["ownerReferences"] == [reference(step)]
    kube.delete_pod("step-pod")  # evicted, or its node lost: the step's process goes with it
    assert kube.trainjob(NAME) is None and kube.pods(NAME) == []  # the garbage collector took the training
    with pytest.raises(TrainJobError, match="deleted by someone else"):  # what a surviving launcher would see
        running.result()


def test_a_trainjob_in_another_namespace_than_the_step_pod_is_not_owned_by_it(kube, monkeypatch, user_log):
    kube.add_running_pod("step-pod", "node-a", namespace="pipelines")
    monkeypatch.setenv(placement.POD_NAME_ENV, "step-pod")
    result = base.launcher(kube).run()
    assert result.status == "Complete"  # not collected at once, as a cross-namespace owner would make it
    created = kube.requests_for("POST", "trainjobs")[0].body
    assert "ownerReferences" not in created["metadata"]
    assert (
        "is not in namespace team-a, where the TrainJob goes, and owner references cannot cross"
        in user_log.text
    )


@pytest.mark.slow
def test_a_retry_that_attaches_becomes_an_owner_so_the_killed_attempts_pod_can_go(
    kube, monkeypatch, user_log
):
    first = kube.add_running_pod("step-pod-1", "node-a")
    second = kube.add_running_pod("step-pod-2", "node-b")
    job = base.manifest()
    job["metadata"]["ownerReferences"] = [reference(first)]
    kube.add_object(
        job, scenario=Scenario.success([f"Step {i} | loss:1.0" for i in range(1, 61)], line_interval=0.05)
    )
    monkeypatch.setenv(placement.POD_NAME_ENV, "step-pod-2")
    running = Running(base.launcher(kube))
    kube.wait_for_request("PATCH", "trainjobs")
    assert kube.trainjob(NAME)["metadata"]["ownerReferences"] == [reference(first), reference(second)]
    kube.delete_pod("step-pod-1")  # the killed attempt's pod is cleaned up while the retry follows
    result = running.result()
    assert result.status == "Complete" and not result.created
    assert "this step's pod step-pod-2 now owns TrainJob" in user_log.text


def test_under_cleanup_policy_never_the_trainjob_is_not_owned_by_the_step_pod(kube, monkeypatch):
    kube.add_running_pod("step-pod", "node-a")
    monkeypatch.setenv(placement.POD_NAME_ENV, "step-pod")
    assert base.launcher(kube, cleanup="never").run().status == "Complete"
    kube.delete_pod("step-pod")
    job = kube.trainjob(NAME)
    assert job is not None and "ownerReferences" not in job["metadata"]  # kept, as the policy says
