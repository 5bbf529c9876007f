"""The stand-in as strict as a cluster where our launcher meets trouble: writes committed though answered with a
5xx, images only from its registry, pods that start once a node frees up or a Secret appears, and the other
ranks of a failed Job torn down."""

from __future__ import annotations

import sys
import time

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support import kube_standin as standin
from tests.support.kube_standin import TRAINER_API_VERSION, TRAINER_GROUP, TRAINER_VERSION, Scenario
from tests.support.kube_standin._startup import normalize_image

kube_standin = standin.kube_standin  # the shared fixture: a started stand-in with runtime torch-distributed

NS = "team-a"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


def trainjob(name: str, image: str | None = None, **trainer) -> dict:
    if image:
        trainer["image"] = image
    spec = {"runtimeRef": {"name": "torch-distributed"}, **({"trainer": trainer} if trainer else {})}
    return {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def custom(kube_standin) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_standin.api_client())


def create(custom: client.CustomObjectsApi, body: dict) -> dict:
    return custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body)


def delete(custom: client.CustomObjectsApi, name: str) -> dict:
    return custom.delete_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", name)


def node_waiting(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"].get("waiting") or {}


def test_committed_writes_answer_504_and_take_effect(kube_standin, custom):
    kube_standin.fail_next(1, status=504, method="POST", committed=True)
    with pytest.raises(ApiException) as raised:
        create(custom, trainjob("lost-answer"))
    assert raised.value.status == 504 and "may still be processing the request" in raised.value.body
    assert kube_standin.trainjob("lost-answer") is not None
    with pytest.raises(ApiException) as raised:
        create(custom, trainjob("lost-answer"))
    assert raised.value.status == 409
    kube_standin.fail_next(1, status=504, method="DELETE", committed=True)
    with pytest.raises(ApiException) as raised:
        delete(custom, "lost-answer")
    assert raised.value.status == 504 and kube_standin.trainjob("lost-answer") is None
    with pytest.raises(ApiException) as raised:
        delete(custom, "lost-answer")
    assert raised.value.status == 404


def test_a_committed_fault_leaves_reads_alone(kube_standin, custom):
    kube_standin.fail_next(1, status=504, committed=True)
    assert (
        custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")["items"] == []
    )
    with pytest.raises(ApiException):
        create(custom, trainjob("after-reads"))


@pytest.mark.parametrize(
    "reference, normalized",
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("pytorch/pytorch:2.13.0", "docker.io/pytorch/pytorch:2.13.0"),
        ("ghcr.io/org/trainer", "ghcr.io/org/trainer:latest"),
        ("localhost:5000/trainer:1", "localhost:5000/trainer:1"),
        ("ghcr.io/org/trainer@sha256:abc", "ghcr.io/org/trainer@sha256:abc"),
    ],
)
def test_image_references_are_compared_as_the_runtime_resolves_them(reference, normalized):
    assert normalize_image(reference) == normalized


def test_an_image_not_in_the_registry_is_not_pulled_until_pushed(kube_standin, custom):
    create(custom, trainjob("typo", image="ghcr.io/org/trainr:1"))
    pod = kube_standin.wait_for_pod("typo", lambda p: bool(p["status"].get("containerStatuses")))
    assert node_waiting(pod)["reason"] == "ImagePullBackOff"
    kube_standin.push_image("ghcr.io/org/trainr:1")
    kube_standin.wait_for_trainjob("typo", condition="Complete")
    # the default runtime image is in the registry (docker.io implied)
    create(custom, trainjob("known"))
    kube_standin.wait_for_trainjob("known", condition="Complete")


def test_an_unschedulable_job_starts_when_a_node_frees_up(kube_standin, custom):
    kube_standin.scenario("waits", Scenario.stuck_pending())
    create(custom, trainjob("waits"))
    pod = kube_standin.wait_for_pod("waits", lambda p: True)
    assert pod["status"]["conditions"][0]["reason"] == "Unschedulable" and not pod["spec"].get("nodeName")
    kube_standin.free_node()
    kube_standin.wait_for_trainjob("waits", condition="Complete")


def test_a_job_waiting_for_a_secret_starts_when_it_is_created(kube_standin, custom):
    env = [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}]
    create(custom, trainjob("needs-secret", env=env))
    pod = kube_standin.wait_for_pod("needs-secret", lambda p: bool(p["status"].get("containerStatuses")))
    assert node_waiting(pod) == {
        "reason": "CreateContainerConfigError",
        "message": 'secret "hf-token" not found',
    }
    kube_standin.add_object({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf-token"}})
    kube_standin.wait_for_trainjob("needs-secret", condition="Complete")


def test_a_failed_job_deletes_its_other_ranks_pods(kube_standin, custom):
    """restartPolicy Never + backoffLimit 0: rank 1 fails; the Job controller deletes the active pods (rank 0
    terminates with 143 on SIGTERM and is removed); the failed pod is kept with its exit code."""
    kube_standin.add_runtime("never", restart_policy="Never", backoff_limit=0)
    kube_standin.scenario("two", Scenario.failure(failed_rank=1, exit_code=3))
    body = trainjob("two", numNodes=2)
    body["spec"]["runtimeRef"]["name"] = "never"
    create(custom, body)
    kube_standin.wait_for_trainjob("two", condition="Failed")
    (kept,) = kube_standin.pods("two")
    assert kept["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert kept["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    assert kube_standin.running_trainjobs() == {}


def events_of(kube, involved: str) -> list[tuple[str, str, str]]:
    """The events about `involved`, once its controller recorded one (it acts in its own thread)."""
    deadline = time.monotonic() + 10
    while True:
        found = [
            (e["type"], e["reason"], e["message"])
            for e in kube.events()
            if e["involvedObject"]["name"] == involved
        ]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


@pytest.mark.parametrize(
    "resources, error",
    [
        (
            {"requests": {"memory": "32Gi"}},
            'spec.containers[0].resources.requests[memory]: Invalid value: "32Gi": must be less than or equal to '
            "memory limit of 16Gi",
        ),
        (
            {"requests": {"example.com/fpga": "1"}},
            "spec.containers[0].resources.limits: Required value: Limit must be set for non overcommitable resources",
        ),
    ],
    ids=["request-above-limit", "extended-resource-without-limit"],
)
def test_an_invalid_pod_spec_leaves_only_a_failed_create_event(kube_standin, custom, resources, error):
    """The runtime's limits merged with the TrainJob's requests make pods the API server rejects: the Job records
    FailedCreate and retries for ever; no pod, no condition anywhere."""
    kube_standin.add_runtime("limited", resources={"limits": {"memory": "16Gi"}})
    body = trainjob("invalid", resourcesPerNode=resources)
    body["spec"]["runtimeRef"]["name"] = "limited"
    create(custom, body)
    ((kind, reason, message),) = events_of(kube_standin, "invalid-node-0")
    assert (kind, reason) == ("Warning", "FailedCreate")
    assert message.startswith('Error creating: Pod "invalid-node-0-0-') and message.endswith(
        f"is invalid: {error}"
    )
    assert kube_standin.pods("invalid") == [] and kube_standin.jobset("invalid") is not None
    assert not kube_standin.trainjob("invalid")["status"].get("conditions")


def test_a_jobset_the_trainer_cannot_create_leaves_only_a_trainjob_event(kube_standin, custom):
    kube_standin.scenario(
        "no-jobset", Scenario(resources_creation_error='admission webhook "vjobset" denied it')
    )
    create(custom, trainjob("no-jobset"))
    assert events_of(kube_standin, "no-jobset") == [
        (
            "Warning",
            "TrainJobResourcesCreationFailed",
            'TrainJob resources reconciliation failed: admission webhook "vjobset" denied it',
        )
    ]
    assert kube_standin.jobset("no-jobset") is None and kube_standin.pods("no-jobset") == []
    assert not kube_standin.trainjob("no-jobset")["status"].get("conditions")


def test_execute_mode_deletes_the_other_ranks_once_one_fails(kube_standin, custom):
    """Real processes: rank 1 exits 3 while rank 0 would run for a minute; rank 0 is stopped and its pod deleted
    (the Job controller's deleteActivePods), rank 1's failed pod is kept."""
    kube_standin.add_runtime("local-never", command=["/bin/false"], restart_policy="Never", backoff_limit=0)
    kube_standin.execute(job="ranks")
    script = "import os, sys, time; sys.exit(3) if os.environ['PET_NODE_RANK'] == '1' else time.sleep(60)"
    body = trainjob("ranks", numNodes=2, command=[sys.executable, "-c"], args=[script])
    body["spec"]["runtimeRef"]["name"] = "local-never"
    create(custom, body)
    kube_standin.wait_for_trainjob("ranks", condition="Failed", timeout=20)
    (kept,) = kube_standin.pods("ranks")
    assert kept["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"
    assert kept["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
