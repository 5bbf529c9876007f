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


# --- the visibility API: positions of pending Workloads ---------------------------------------------------------------

VISIBILITY = "visibility.kueue.x-k8s.io"


def pending_workloads(kube_standin, queue: str, version: str = "v1beta2", **query) -> dict:
    """GET .../localqueues/<queue>/pendingworkloads as a client's generic call makes it."""
    return kube_standin.api_client().call_api(
        f"/apis/{VISIBILITY}/{version}/namespaces/{NS}/localqueues/{{name}}/pendingworkloads",
        "GET",
        path_params={"name": queue},
        query_params=list(query.items()),
        header_params={"Accept": "application/json"},
        response_type="object",
        auth_settings=["BearerToken"],
        _return_http_data_only=True,
    )


def seed_waiting(kube_standin, name: str, queue: str, hours_ago: float, priority_class: str = "") -> dict:
    """A queued TrainJob created `hours_ago`, suspended as Kueue's webhook left it, with its pending Workload."""
    seeded = queued_trainjob(name, queue=queue, suspend=True)
    seeded["metadata"]["creationTimestamp"] = (
        datetime.now(timezone.utc) - timedelta(hours=hours_ago)
    ).strftime("%Y-%m-%dT%H:%M:%SZ")
    if priority_class:
        seeded["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority_class
    return kube_standin.add_object(seeded)


def test_pending_workloads_are_listed_in_kueues_queue_order(kube_standin):
    """Higher priority first, then the older; positions in the LocalQueue and in the ClusterQueue that LocalQueues
    share; admitted Workloads and other ClusterQueues' are not counted."""
    kube_standin.add_object(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta1",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": "high"},
            "value": 100,
        }
    )
    for queue, cluster_queue in (("team-queue", "gpus"), ("other-queue", "gpus"), ("far-queue", "cpus")):
        kube_standin.add_local_queue(queue, cluster_queue=cluster_queue)
    mid = seed_waiting(kube_standin, "mid", "team-queue", 1)
    old = seed_waiting(kube_standin, "old", "team-queue", 2)
    seed_waiting(kube_standin, "older-elsewhere", "other-queue", 3)
    seed_waiting(kube_standin, "oldest-far", "far-queue", 5)
    high = seed_waiting(kube_standin, "new-but-high", "team-queue", 0, priority_class="high")
    seed_waiting(kube_standin, "admitted", "team-queue", 4)
    kube_standin.admit("admitted")

    summary = pending_workloads(kube_standin, "team-queue")
    assert (summary["kind"], summary["apiVersion"]) == ("PendingWorkloadsSummary", f"{VISIBILITY}/v1beta2")
    listed = [
        (
            w["metadata"]["ownerReferences"][0]["name"],
            w["priority"],
            w["positionInLocalQueue"],
            w["positionInClusterQueue"],
        )
        for w in summary["items"]
    ]
    assert listed == [("new-but-high", 100, 0, 0), ("old", 0, 1, 2), ("mid", 0, 2, 3)]
    first = summary["items"][0]
    assert first["localQueueName"] == "team-queue" and first["metadata"]["namespace"] == NS
    assert first["metadata"]["ownerReferences"][0]["uid"] == high["metadata"]["uid"]
    assert first["metadata"]["name"].startswith("trainjob-new-but-high-")
    # offset and limit page through the LocalQueue's part; v1beta1 (Kueue v0.9 on) answers the same.
    (page,) = pending_workloads(kube_standin, "team-queue", "v1beta1", limit=1, offset=1)["items"]
    assert page["metadata"]["ownerReferences"][0]["uid"] == old["metadata"]["uid"]
    assert (page["positionInLocalQueue"], page["positionInClusterQueue"]) == (1, 2)
    # Admitting the head moves everyone up.
    kube_standin.admit("new-but-high")
    assert [
        (w["positionInLocalQueue"], w["positionInClusterQueue"])
        for w in pending_workloads(kube_standin, "team-queue")["items"]
    ] == [(0, 1), (1, 2)]
    assert (
        pending_workloads(kube_standin, "team-queue")["items"][1]["metadata"]["ownerReferences"][0]["uid"]
        == mid["metadata"]["uid"]
    )
    with pytest.raises(ApiException) as unknown:
        pending_workloads(kube_standin, "no-such-queue")
    assert unknown.value.status == 404
    assert json.loads(unknown.value.body)["message"] == f'localqueue.{VISIBILITY} "no-such-queue" not found'


def test_the_visibility_api_is_authorized_by_kube_apiserver_and_may_be_missing_or_unreachable(kube_standin):
    kube_standin.add_local_queue("team-queue")
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "reader", "namespace": NS},
        "rules": [
            {"apiGroups": [VISIBILITY], "resources": ["localqueues/pendingworkloads"], "verbs": ["list"]}
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "reader", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "runner", "namespace": NS}],
    }
    kube_standin.enforce_rbac([role, binding], service_account=f"{NS}:runner")
    kube_standin.kueue_visibility(versions=())  # authorization comes first, whether or not the API exists
    with pytest.raises(ApiException) as forbidden:
        pending_workloads(kube_standin, "team-queue")
    assert forbidden.value.status == 403  # `list` is not enough: a named subresource is a `get`
    assert json.loads(forbidden.value.body)["message"] == (
        f'localqueues.{VISIBILITY} "team-queue" is forbidden: User "system:serviceaccount:{NS}:runner" cannot get '
        f'resource "localqueues/pendingworkloads" in API group "{VISIBILITY}" in the namespace "{NS}"'
    )
    role["rules"][0]["verbs"] = ["get"]
    kube_standin.enforce_rbac([role, binding], service_account=f"{NS}:runner")
    with pytest.raises(ApiException) as missing:
        pending_workloads(kube_standin, "team-queue")
    assert (missing.value.status, missing.value.body) == (
        404,
        "404 page not found\n",
    )  # no APIService: plain text
    assert missing.value.headers["Content-Type"] == "text/plain; charset=utf-8"
    kube_standin.kueue_visibility(versions=("v1beta1",))  # Kueue v0.9 to v0.14
    assert pending_workloads(kube_standin, "team-queue", "v1beta1")["items"] == []
    with pytest.raises(ApiException) as older:
        pending_workloads(kube_standin, "team-queue", "v1beta2")
    assert older.value.status == 404
    kube_standin.kueue_visibility(available=False)  # registered, but Kueue's server does not answer
    with pytest.raises(ApiException) as unavailable:
        pending_workloads(kube_standin, "team-queue")
    assert (unavailable.value.status, unavailable.value.body) == (503, "service unavailable\n")
