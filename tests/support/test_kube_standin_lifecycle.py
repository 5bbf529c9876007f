"""The stand-in's lifecycle behaviour through the real ``kubernetes`` client: lagging watches, field selectors
limited as the real server limits them, the trainer job found by its ancestor label, lost nodes, and owners."""

from __future__ import annotations

import json

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support import kube_standin as standin
from tests.support.kube_standin import TRAINER_API_VERSION, TRAINER_GROUP, TRAINER_VERSION, Scenario

kube_standin = standin.kube_standin  # the shared fixture: a started stand-in with runtime torch-distributed

NS = "team-a"


@pytest.fixture
def custom(kube_standin) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_standin.api_client())


@pytest.fixture
def core(kube_standin) -> client.CoreV1Api:
    return client.CoreV1Api(kube_standin.api_client())


def trainjob(name: str, **spec) -> dict:
    spec.setdefault("runtimeRef", {"name": "torch-distributed"})
    return {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


def create(custom: client.CustomObjectsApi, body: dict) -> dict:
    return custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body)


def get(custom: client.CustomObjectsApi, name: str) -> dict:
    return custom.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", name)


def events_of(response) -> list[dict]:
    return [json.loads(line) for line in watch.watch.iter_resp_lines(response)]


@pytest.mark.slow
def test_a_lagging_pod_watch_delivers_late_while_a_list_is_fresh(kube_standin, core, custom):
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    kube_standin.delay_watch_events("pods", 3600)
    create(custom, trainjob("lag"))
    kube_standin.wait_for_trainjob("lag", condition="Complete")
    pods = [p.metadata.name for p in core.list_namespaced_pod(NS).items]
    assert pods  # the list is current
    late = core.list_namespaced_pod(
        NS, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
    )
    assert events_of(late) == []  # nothing delivered yet
    kube_standin.delay_watch_events("pods", 0)
    caught_up = core.list_namespaced_pod(
        NS, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
    )
    events = events_of(caught_up)
    assert [e["type"] for e in events][0] == "ADDED" and events[-1]["object"]["metadata"]["name"] in pods


def test_field_selectors_are_limited_to_what_the_real_server_supports(kube_standin, core, custom):
    create(custom, trainjob("fields"))
    kube_standin.wait_for_trainjob("fields", condition="Complete")
    (pod,) = core.list_namespaced_pod(
        NS, field_selector="status.phase=Succeeded,spec.restartPolicy!=Always"
    ).items
    assert core.list_namespaced_pod(NS, field_selector=f"spec.nodeName={pod.spec.node_name}").items
    assert core.list_namespaced_event(NS, field_selector="source=kubelet,type=Normal").items
    assert core.list_namespaced_event(NS, field_selector=f"involvedObject.uid={pod.metadata.uid}").items
    with pytest.raises(ApiException) as raised:
        core.list_namespaced_pod(NS, field_selector="status.hostIP=127.0.0.1")
    assert raised.value.status == 400
    assert json.loads(raised.value.body)["message"] == "field label not supported: status.hostIP"
    with pytest.raises(ApiException) as raised:
        core.list_namespaced_pod(
            NS, field_selector="spec.containers.name=node", watch=True, _preload_content=False
        )
    assert raised.value.status == 400
    for selector in ("spec.suspend=false", "status.conditions=x"):
        with pytest.raises(ApiException) as raised:
            custom.list_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", field_selector=selector
            )
        assert raised.value.status == 400
        assert json.loads(raised.value.body)["message"] == (
            f'"{selector.split("=")[0]}" is not a known field selector: only "metadata.name", "metadata.namespace"'
        )
    assert custom.list_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", field_selector="metadata.name=fields"
    )["items"]


def runtime_with_jobs(name: str, *jobs: tuple[str, str, bool]) -> dict:
    """A ClusterTrainingRuntime with replicated jobs (name, container, labelled as the trainer's ancestor)."""
    replicated = [
        {
            "name": job,
            "template": {
                "metadata": {
                    "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"} if trainer else {}
                },
                "spec": {
                    "template": {"spec": {"containers": [{"name": container, "image": "runtime/image"}]}}
                },
            },
        }
        for job, container, trainer in jobs
    ]
    return {
        "apiVersion": TRAINER_API_VERSION,
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": replicated}},
        },
    }


def test_the_trainer_job_is_found_by_the_ancestor_label_not_by_its_name(kube_standin, custom):
    kube_standin.add_object(
        runtime_with_jobs(
            "labelled", ("dataset-initializer", "dataset-initializer", False), ("trainer", "node", True)
        )
    )
    trainer = {"image": "team/trainer:1", "numNodes": 2}
    for image in ("team/trainer:1", "runtime/image"):
        kube_standin.push_image(image)
    create(custom, trainjob("labelled", runtimeRef={"name": "labelled"}, trainer=trainer))
    kube_standin.wait_for_trainjob("labelled", condition="Complete")
    pods = kube_standin.pods("labelled")
    assert len(pods) == 2  # numNodes applies to the labelled job
    for pod in pods:
        (node,) = pod["spec"]["containers"]
        assert (node["name"], node["image"]) == ("node", "team/trainer:1")
        assert {"name": "PET_NNODES", "value": "2"} in node["env"]

    # A job named "node" without the label is not the trainer's: the TrainJob's trainer settings apply nowhere.
    kube_standin.add_object(runtime_with_jobs("unlabelled", ("node", "node", False)))
    create(custom, trainjob("unlabelled", runtimeRef={"name": "unlabelled"}, trainer=trainer))
    kube_standin.wait_for_trainjob("unlabelled", condition="Complete")
    (pod,) = kube_standin.pods("unlabelled")
    assert pod["spec"]["containers"][0]["image"] == "runtime/image"
    assert "PET_NNODES" not in json.dumps(pod["spec"])


IGNORE_DISRUPTIONS = {
    "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
}


@pytest.mark.parametrize(("policy", "outcome"), [(IGNORE_DISRUPTIONS, "Complete"), (None, "Failed")])
@pytest.mark.slow
def test_a_lost_node_fails_its_pod_and_the_job_replaces_it_as_the_pod_failure_policy_says(
    kube_standin, custom, policy, outcome
):
    kube_standin.add_runtime("fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=policy)
    lines = ["Step 1 | loss:1.0", "Step 2 | loss:0.9", "Step 3 | loss:0.8"]
    kube_standin.scenario("lost", Scenario.success(lines, lost_node_after_lines=2))
    rv = custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")["metadata"][
        "resourceVersion"
    ]
    create(custom, trainjob("lost", runtimeRef={"name": "fail-fast"}))
    job = kube_standin.wait_for_trainjob("lost", condition=outcome)
    history = client.CoreV1Api(kube_standin.api_client()).list_namespaced_pod(
        NS, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
    )
    disrupted = [
        e["object"]
        for e in events_of(history)
        if any(c["type"] == "DisruptionTarget" for c in e["object"]["status"].get("conditions") or [])
    ]
    assert disrupted and disrupted[0]["status"]["phase"] == "Failed"
    (condition,) = [c for c in disrupted[0]["status"]["conditions"] if c["type"] == "DisruptionTarget"]
    assert (condition["reason"], condition["message"]) == ("DeletionByPodGC", "PodGC: node no longer exists")
    pods = kube_standin.pods("lost")
    if (
        outcome == "Complete"
    ):  # replaced (not counted against backoffLimit 0): the trainer ran again, to the end
        (pod,) = pods
        assert pod["metadata"]["uid"] != disrupted[0]["metadata"]["uid"]
        assert kube_standin.pod_log(pod["metadata"]["name"]).splitlines() == lines
    else:  # counted: the Job fails at once
        assert job["status"]["conditions"][0]["type"] == "Failed"
        assert [p["metadata"]["uid"] for p in pods] == [disrupted[0]["metadata"]["uid"]]


def owned_by(*pods: dict) -> list[dict]:
    return [
        {"apiVersion": "v1", "kind": "Pod", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
        for p in pods
    ]


def add_owner_at_the_read_version(custom, name: str, references: list[dict]) -> dict:
    """A read-modify-write as a client makes it (owner.add_owner does): the TrainJob's controller may update it
    between the read and the patch, and the API server then answers 409 to the stale resourceVersion: read again."""
    for attempt in range(1, 6):
        version = get(custom, name)["metadata"]["resourceVersion"]
        patch = {"metadata": {"ownerReferences": references, "resourceVersion": version}}
        try:
            return custom.patch_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", name, patch
            )
        except ApiException as error:
            if error.status != 409 or attempt == 5:
                raise


def test_the_garbage_collector_deletes_a_trainjob_once_all_its_owner_pods_are_gone(kube_standin, custom):
    first, second = (
        kube_standin.add_running_pod("step-1", "node-a"),
        kube_standin.add_running_pod("step-2", "node-b"),
    )
    kube_standin.scenario("owned", Scenario.success(["x"] * 1000, line_interval=0.05))
    body = trainjob("owned")
    body["metadata"]["ownerReferences"] = owned_by(first)
    create(custom, body)
    kube_standin.wait_for_pod("owned", lambda p: p["status"]["phase"] == "Running")
    patched = add_owner_at_the_read_version(custom, "owned", owned_by(first, second))
    assert [r["name"] for r in patched["metadata"]["ownerReferences"]] == ["step-1", "step-2"]
    kube_standin.delete_pod("step-1")
    assert kube_standin.trainjob("owned") is not None  # one owner is left
    kube_standin.delete_pod("step-2")
    assert kube_standin.trainjob("owned") is None and kube_standin.pods("owned") == []


def test_an_owner_in_another_namespace_counts_as_absent_and_bad_owner_patches_are_refused(
    kube_standin, custom
):
    elsewhere = kube_standin.add_running_pod("step", "node-a", namespace="pipelines")
    body = trainjob("cross")
    body["metadata"]["ownerReferences"] = owned_by(elsewhere)
    create(custom, body)
    assert kube_standin.trainjob("cross") is None  # collected at once: ownerReferences are namespace-local

    create(custom, trainjob("plain"))
    for patch, status in (
        ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "x"}]}}, 422),
        ({"metadata": {"labels": {"a": "b"}, "resourceVersion": "1"}}, 409),
        ({"spec": {"suspend": True}}, 405),
    ):
        with pytest.raises(ApiException) as raised:
            custom.patch_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", "plain", patch
            )
        assert raised.value.status == status, patch
    meta = get(custom, "plain")["metadata"]
    assert "ownerReferences" not in meta and "a" not in (meta.get("labels") or {})
