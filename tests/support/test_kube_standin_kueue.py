"""The stand-in's Kueue through the real ``kubernetes`` client: a queued TrainJob is created suspended with a pending
Workload, waits until admitted (its activeDeadlineSeconds counting from then), and a preempted one loses its pods
and waits again; LocalQueues are served, and a missing one is a 404."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support import kube_standin as standin
from tests.support.kube_standin import TRAINER_API_VERSION, TRAINER_GROUP, TRAINER_VERSION, Scenario

kube_standin = standin.kube_standin

NS = "team-a"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@pytest.fixture
def custom(kube_standin) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_standin.api_client())


def queued_trainjob(name: str, queue: str = "team-queue", **spec) -> dict:
    spec.setdefault("runtimeRef", {"name": "torch-distributed"})
    return {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": spec,
    }


def create(custom: client.CustomObjectsApi, body: dict) -> dict:
    return custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body)


def conditions(obj: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj["status"].get("conditions", [])}


def workload_of(custom: client.CustomObjectsApi, job: dict) -> dict:
    (workload,) = custom.list_namespaced_custom_object(
        "kueue.x-k8s.io",
        "v1beta1",
        NS,
        "workloads",
        label_selector=f"kueue.x-k8s.io/job-uid={job['metadata']['uid']}",
    )["items"]
    return workload


def test_local_queues_are_served_and_a_missing_one_is_a_404(kube_standin, custom):
    kube_standin.add_local_queue("team-queue", cluster_queue="gpus")
    got = custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NS, "localqueues", "team-queue")
    assert got["spec"] == {"clusterQueue": "gpus"}
    listed = custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NS, "localqueues")
    assert [q["metadata"]["name"] for q in listed["items"]] == ["team-queue"]
    with pytest.raises(ApiException) as missing:
        custom.get_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NS, "localqueues", "other")
    assert missing.value.status == 404
    assert json.loads(missing.value.body)["message"] == 'localqueues.kueue.x-k8s.io "other" not found'


def test_a_queued_trainjob_is_created_suspended_with_a_pending_workload(kube_standin, custom):
    created = create(custom, queued_trainjob("no-queue-yet", queue="absent"))
    assert created["spec"]["suspend"] is True  # Kueue's webhook, though the request did not ask
    job = kube_standin.wait_for_trainjob("no-queue-yet", condition="Suspended")
    workload = workload_of(custom, job)
    assert workload["metadata"]["name"].startswith("trainjob-no-queue-yet-")
    assert workload["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert workload["spec"]["queueName"] == "absent"
    (reserved,) = workload["status"]["conditions"]
    assert (reserved["type"], reserved["status"], reserved["message"]) == (
        "QuotaReserved",
        "False",
        "LocalQueue absent doesn't exist",
    )
    kube_standin.add_local_queue("team-queue")
    create(custom, queued_trainjob("waits"))
    waiting = workload_of(custom, kube_standin.wait_for_trainjob("waits", condition="Suspended"))
    assert waiting["status"]["conditions"][0]["message"].startswith("couldn't assign flavors to pod set node")
    assert not kube_standin.pods("waits")
    # Deleting the TrainJob collects its Workload.
    custom.delete_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", "waits")
    assert [w["spec"]["queueName"] for w in kube_standin.workloads()] == ["absent"]


def test_admission_starts_the_trainjob_and_its_deadline(kube_standin, custom):
    """Created an hour ago with a one-minute activeDeadlineSeconds: admitted now, it runs to the end, because the
    Trainer's deadline counts from the resume (reconcileDeadline)."""
    kube_standin.add_local_queue("team-queue")
    an_hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    seeded = queued_trainjob("old", activeDeadlineSeconds=60, suspend=True)
    seeded["metadata"]["creationTimestamp"] = an_hour_ago
    kube_standin.add_object(seeded)
    kube_standin.wait_for_trainjob("old", condition="Suspended")
    kube_standin.admit("old")
    job = kube_standin.wait_for_trainjob("old", condition="Complete")
    assert conditions(job) == {"Suspended": ("False", "Resumed"), "Complete": ("True", "AllJobsCompleted")}
    workload = conditions(workload_of(custom, job))
    assert workload["QuotaReserved"][0] == workload["Admitted"][0] == "True"


def test_a_never_resumed_deadline_still_counts_from_creation(kube_standin):
    """The same TrainJob without a queue: the deadline from its creation ended long ago (the check above can fail)."""
    an_hour_ago = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    seeded = queued_trainjob("old-plain", activeDeadlineSeconds=60)
    del seeded["metadata"]["labels"]
    seeded["metadata"]["creationTimestamp"] = an_hour_ago
    kube_standin.add_object(seeded)
    job = kube_standin.wait_for_trainjob("old-plain", condition="Failed")
    assert conditions(job)["Failed"] == ("True", "DeadlineExceeded")


def test_preemption_deletes_the_pods_and_the_trainjob_waits_again(kube_standin, custom):
    kube_standin.add_local_queue("team-queue")
    kube_standin.scenario(
        "preempted", Scenario.success([f"Step {i} | loss:1.0" for i in range(400)], line_interval=0.05)
    )
    create(custom, queued_trainjob("preempted"))
    kube_standin.wait_for_trainjob("preempted", condition="Suspended")
    kube_standin.admit("preempted")
    first = kube_standin.wait_for_pod("preempted", lambda p: p["status"]["phase"] == "Running")
    kube_standin.scenario("preempted", Scenario.success())
    kube_standin.preempt("preempted")
    job = kube_standin.wait_for_trainjob("preempted", condition="Suspended")  # set once the pods are deleted
    assert not kube_standin.pods("preempted")
    assert kube_standin.jobset("preempted")["spec"]["suspend"] is True
    workload = conditions(workload_of(custom, job))
    assert workload["Evicted"] == ("True", "Preempted") and workload["Preempted"] == (
        "True",
        "InClusterQueue",
    )
    assert workload["Admitted"][0] == "False"
    kube_standin.admit("preempted")
    done = kube_standin.wait_for_trainjob("preempted", condition="Complete")
    (second,) = kube_standin.pods("preempted")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert conditions(workload_of(custom, done))["Evicted"] == ("False", "QuotaReserved")
