"""The Kubernetes API stand-in, exercised only through the real ``kubernetes`` client over HTTP."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import urllib3
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.support import kube_standin as standin
from tests.support.kube_standin import (
    TRAINER_API_VERSION,
    TRAINER_GROUP,
    TRAINER_VERSION,
    KubeStandin,
    Scenario,
    expand_kube_vars,
)

kube_standin = standin.kube_standin  # the shared fixture: a started stand-in with runtime torch-distributed

NS = "team-a"
REPO = Path(__file__).resolve().parents[2]


def trainjob(name: str, **spec) -> dict:
    spec.setdefault("runtimeRef", {"name": "torch-distributed"})
    return {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def custom(kube_standin: KubeStandin) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_standin.api_client())


@pytest.fixture
def core(kube_standin: KubeStandin) -> client.CoreV1Api:
    return client.CoreV1Api(kube_standin.api_client())


def create(custom: client.CustomObjectsApi, body: dict) -> dict:
    return custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body)


def get(custom: client.CustomObjectsApi, name: str) -> dict:
    return custom.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", name)


def status_of(error: ApiException) -> dict:
    return json.loads(error.body)


def test_create_get_list_delete(kube_standin, custom):
    created = create(custom, trainjob("job-a", trainer={"numNodes": 2}))
    assert created["metadata"]["uid"] and created["spec"]["runtimeRef"] == {
        "name": "torch-distributed",
        "kind": "ClusterTrainingRuntime",  # CRD defaults applied
        "apiGroup": TRAINER_GROUP,
    }
    assert get(custom, "job-a")["metadata"]["name"] == "job-a"
    create(custom, {**trainjob("job-b"), "metadata": {"name": "job-b", "labels": {"team": "x"}}})
    listed = custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")
    assert listed["kind"] == "TrainJobList" and {i["metadata"]["name"] for i in listed["items"]} == {
        "job-a",
        "job-b",
    }
    selected = custom.list_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", label_selector="team=x"
    )
    assert [i["metadata"]["name"] for i in selected["items"]] == ["job-b"]

    kube_standin.wait_for_trainjob("job-a", condition="Complete")
    assert len(kube_standin.pods("job-a")) == 2
    custom.delete_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", "job-a", propagation_policy="Background"
    )
    assert kube_standin.trainjob("job-a") is None and kube_standin.pods("job-a") == []
    (deleted,) = kube_standin.requests_for("DELETE", "trainjobs", "job-a")
    assert deleted.param("propagationPolicy") == "Background"
    with pytest.raises(ApiException) as error:
        get(custom, "job-a")
    assert error.value.status == 404
    assert status_of(error.value)["reason"] == "NotFound"
    assert status_of(error.value)["message"] == 'trainjobs.trainer.kubeflow.org "job-a" not found'


def test_duplicate_create_is_409(custom):
    create(custom, trainjob("dup"))
    with pytest.raises(ApiException) as error:
        create(custom, trainjob("dup"))
    assert error.value.status == 409 and status_of(error.value)["reason"] == "AlreadyExists"


@pytest.mark.parametrize(
    ("spec", "field", "text"),
    [
        ({"trainer": {"numNodes": 1, "gpus": 2}}, "spec.trainer.gpus", 'unknown field "spec.trainer.gpus"'),
        ({"trainer": {"numNodes": "two"}}, "spec.trainer.numNodes", "must be of type integer"),
        ({"trainer": {"numProcPerNode": "auto"}}, "spec.trainer.numProcPerNode", "must be of type integer"),
        (
            {"trainer": {"env": [{"name": "A", "value": 1}]}},
            "spec.trainer.env[0].value",
            "must be of type string",
        ),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "greater than or equal to 1"),
        ({"managedBy": "me"}, "spec.managedBy", "ManagedBy must be"),
    ],
)
def test_strict_validation_names_the_field(kube_standin, custom, spec, field, text):
    with pytest.raises(ApiException) as error:
        create(custom, trainjob("bad", **spec))
    status = status_of(error.value)
    assert error.value.status == 422 and status["reason"] == "Invalid"
    assert field in status["message"] and text in status["message"]
    assert field in [cause["field"] for cause in status["details"]["causes"]]
    assert kube_standin.trainjobs() == []


@pytest.mark.parametrize("name", ["Upper", "a" * 64, "1starts-with-digit", "has.dot"])
def test_name_must_be_rfc1035_label(custom, name):
    with pytest.raises(ApiException) as error:
        create(custom, trainjob(name))
    assert error.value.status == 422


def test_webhook_rejects_missing_runtime_and_reserved_env(custom):
    with pytest.raises(ApiException) as error:
        create(custom, trainjob("x", runtimeRef={"name": "nope"}))
    assert error.value.status == 403
    assert (
        "specified clusterTrainingRuntime must be created before the TrainJob"
        in status_of(error.value)["message"]
    )
    with pytest.raises(ApiException) as error:
        create(custom, trainjob("y", trainer={"env": [{"name": "PET_NODE_RANK", "value": "0"}]}))
    assert error.value.status == 403 and "PET_NODE_RANK" in status_of(error.value)["message"]


def test_unauthorized_without_token(kube_standin):
    api_client = client.ApiClient(client.Configuration(host=kube_standin.url))
    with pytest.raises(ApiException) as error:
        client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs"
        )
    assert error.value.status == 401
    assert kube_standin.requests[-1].status == 401


def test_watch_sees_added_and_modified_with_increasing_versions(kube_standin, custom):
    listed = custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")
    create(custom, trainjob("w1"))
    seen = []
    for event in watch.Watch().stream(
        custom.list_namespaced_custom_object,
        TRAINER_GROUP,
        TRAINER_VERSION,
        NS,
        "trainjobs",
        field_selector="metadata.name=w1",
        resource_version=listed["metadata"]["resourceVersion"],
        timeout_seconds=5,
    ):
        seen.append(event)
        conditions = event["object"].get("status", {}).get("conditions", [])
        if any(c["type"] == "Complete" for c in conditions):
            break
    assert [e["type"] for e in seen][:2] == ["ADDED", "MODIFIED"]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert seen[-1]["object"]["status"]["conditions"][0]["reason"] == "AllJobsCompleted"
    assert {c["type"] for e in seen for c in e["object"].get("status", {}).get("conditions", [])} == {
        "Complete"
    }


def test_watch_faults_dropped_stream_and_410(kube_standin, custom):
    kube_standin.scenario(None, pending_seconds=0.3)
    create(custom, trainjob("w2"))
    rv = get(custom, "w2")["metadata"]["resourceVersion"]
    kube_standin.drop_watch_after(1)
    stream = custom.list_namespaced_custom_object(
        TRAINER_GROUP,
        TRAINER_VERSION,
        NS,
        "trainjobs",
        watch=True,
        resource_version="0",
        _preload_content=False,
    )
    lines = [line for line in stream.read().decode().splitlines() if line]
    assert len(lines) == 1 and json.loads(lines[0])["type"] == "ADDED"  # the server closed after one event

    kube_standin.drop_watch_after(0, abrupt=True)
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for _ in watch.Watch().stream(
            custom.list_namespaced_custom_object, TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs"
        ):
            pass

    kube_standin.expire_next_watch()
    with pytest.raises(ApiException) as error:  # with timeout_seconds the client does not retry a 410
        for _ in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            NS,
            "trainjobs",
            resource_version=rv,
            timeout_seconds=2,
        ):
            pass
    assert error.value.status == 410 and "too old resource version" in error.value.reason

    kube_standin.expire_next_watch(as_http_error=True)
    with pytest.raises(ApiException) as error:
        custom.list_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", watch=True, resource_version=rv
        )
    assert error.value.status == 410 and status_of(error.value)["reason"] == "Gone"


def watch_lines(custom: client.CustomObjectsApi, **kwargs) -> urllib3.HTTPResponse:
    """An open watch on the namespace's TrainJobs: its answer (headers) has come, so the server side is set up."""
    return custom.list_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", watch=True, _preload_content=False, **kwargs
    )


def events_of(response: urllib3.HTTPResponse) -> list[dict]:
    return [json.loads(line) for line in watch.watch.iter_resp_lines(response)]


@pytest.mark.slow
def test_watch_bookmarks_carry_only_the_newest_resource_version(kube_standin, custom):
    rv = custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")["metadata"][
        "resourceVersion"
    ]
    mine = dict(field_selector="metadata.name=mine", resource_version=rv, timeout_seconds=1)
    with_bookmarks = watch_lines(custom, allow_watch_bookmarks=True, **mine)
    without = watch_lines(custom, **mine)
    other = create(custom, trainjob("other"))  # not selected: the bookmark still moves past it
    kube_standin.send_bookmarks()
    (bookmark,) = events_of(with_bookmarks)  # then the server-side timeout ends the stream
    assert bookmark == {
        "type": "BOOKMARK",
        "object": {
            "apiVersion": TRAINER_API_VERSION,
            "kind": "TrainJob",
            "metadata": bookmark["object"]["metadata"],
        },
    }
    assert list(bookmark["object"]["metadata"]) == ["resourceVersion"]  # no name: not an object to keep
    assert int(bookmark["object"]["metadata"]["resourceVersion"]) >= int(other["metadata"]["resourceVersion"])
    assert events_of(without) == []  # only watches that asked for bookmarks get them

    # The real client passes a bookmark on as an event (it is the caller's job to skip it).
    pods = client.CoreV1Api(kube_standin.api_client())
    stream = watch.Watch().stream(
        pods.list_namespaced_pod, NS, label_selector="no=pod", allow_watch_bookmarks=True, timeout_seconds=1
    )

    def bookmark_once_watching() -> None:  # the generator sends its request only when iterated
        kube_standin.wait_for_request("GET", "pods", where=lambda r: r.query.get("watch") == "True")
        kube_standin.send_bookmarks()

    threading.Thread(target=bookmark_once_watching, daemon=True).start()
    assert [(e["type"], e["raw_object"]["kind"], e["raw_object"]["apiVersion"]) for e in stream] == [
        ("BOOKMARK", "Pod", "v1")
    ]


@pytest.mark.slow
def test_watch_cache_bookmarks_before_the_timeout_by_itself(kube_standin, custom):
    """cache_watcher.go: a watch that allows bookmarks gets one 2s before its timeoutSeconds ends."""
    events = events_of(
        watch_lines(custom, allow_watch_bookmarks=True, resource_version="1000", timeout_seconds=3)
    )
    assert [e["type"] for e in events] == ["BOOKMARK"]


@pytest.mark.slow
def test_compacted_history_answers_410_expired(kube_standin, custom):
    first = create(custom, trainjob("c1"))["metadata"]["resourceVersion"]
    compacted = kube_standin.compact_history()
    create(custom, trainjob("c2"))

    # HTTP 200, one ERROR event, the end (well before the timeout)
    (error,) = events_of(watch_lines(custom, resource_version=first, timeout_seconds=1))
    assert error["type"] == "ERROR"
    status = error["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"] == f"too old resource version: {first} ({compacted})"
    with pytest.raises(ApiException) as raised:  # what the real client makes of it when it may not retry
        for _ in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            NS,
            "trainjobs",
            resource_version=first,
            timeout_seconds=1,
        ):
            pass
    assert raised.value.status == 410 and raised.value.reason.startswith("Expired: too old resource version")

    # From the compacted version on, nothing is lost; a fresh list gives a version to watch from.
    added = events_of(
        watch_lines(custom, resource_version=compacted, field_selector="metadata.name=c2", timeout_seconds=1)
    )[0]
    assert (added["type"], added["object"]["metadata"]["name"]) == ("ADDED", "c2")
    listed = custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")
    assert int(listed["metadata"]["resourceVersion"]) >= int(compacted)


def test_injected_5xx_and_429(kube_standin, custom):
    kube_standin.fail_next(2, status=503, method="POST")
    for _ in range(2):
        with pytest.raises(ApiException) as error:
            create(custom, trainjob("flaky"))
        assert error.value.status == 503
    kube_standin.fail_next(status=429)
    with pytest.raises(ApiException) as error:
        get(custom, "flaky")
    assert error.value.status == 429 and status_of(error.value)["reason"] == "TooManyRequests"
    create(custom, trainjob("flaky"))
    assert [r.status for r in kube_standin.requests_for("POST", "trainjobs")] == [503, 503, 201]
    # with Retry-After, urllib3 (under the kubernetes client) retries a GET on 429/503 by itself
    kube_standin.fail_next(status=503, retry_after=0)
    assert get(custom, "flaky")["metadata"]["name"] == "flaky"
    assert [r.status for r in kube_standin.requests_for("GET", "trainjobs", "flaky")] == [429, 503, 200]


def test_pods_logs_and_events(kube_standin, custom, core):
    lines = [
        f"Step {i} | loss:{2.5 - i / 10:.4f} lr:0.0001 tokens_per_second_per_gpu:12{i}.0" for i in range(1, 6)
    ]
    kube_standin.scenario("logs", Scenario.success(lines, line_interval=0.05))
    create(custom, trainjob("logs", trainer={"numNodes": 2, "numProcPerNode": 1}))
    pods = []
    while len(pods) < 2:
        pods = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=logs").items
    rank0 = next(p for p in pods if p.metadata.labels["batch.kubernetes.io/job-completion-index"] == "0")
    assert rank0.metadata.name.startswith("logs-node-0-0-")
    assert rank0.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    env = {e.name: e for e in rank0.spec.containers[0].env}
    assert env["PET_NNODES"].value == "2" and env["PET_NPROC_PER_NODE"].value == "1"
    assert env["PET_MASTER_ADDR"].value == "logs-node-0-0.logs" and env["PET_MASTER_PORT"].value == "29500"
    assert "job-completion-index" in env["PET_NODE_RANK"].value_from.field_ref.field_path

    while core.read_namespaced_pod(rank0.metadata.name, NS).status.phase == "Pending":
        time.sleep(0.01)
    response = core.read_namespaced_pod_log(
        rank0.metadata.name, NS, container="node", follow=True, _preload_content=False
    )
    streamed = [line.decode() for line in response.stream(32) if line]
    assert "".join(streamed).splitlines() == lines
    assert kube_standin.trainjob("logs")["status"]["conditions"][0]["type"] in ("Complete",)
    tail = core.read_namespaced_pod_log(rank0.metadata.name, NS, tail_lines=2)
    assert tail.splitlines() == lines[-2:]
    followed = watch.Watch().stream(core.read_namespaced_pod_log, rank0.metadata.name, NS, container="node")
    assert list(followed) == lines

    kube_standin.add_event("logs", "Created", "Created JobSet: logs", type_="Normal", kind="TrainJob")
    events = core.list_namespaced_event(NS, field_selector="involvedObject.name=logs").items
    assert [(e.reason, e.involved_object.kind) for e in events] == [("Created", "TrainJob")]


def test_resources_per_node_are_merged_into_the_runtimes(kube_standin, custom, core):
    """The Trainer merges trainer.resourcesPerNode into the runtime's node container resources key by key
    (kubeflow/trainer v2.3.0 MergeResourceRequirements): keys the TrainJob does not name stay."""
    runtime = kube_standin.add_runtime(
        "with-resources",
        resources={"limits": {"nvidia.com/gpu": "1", "memory": "16Gi"}, "requests": {"cpu": "2"}},
    )
    per_node = {"limits": {"nvidia.com/gpu": "2"}, "requests": {"memory": "8Gi"}}
    create(
        custom,
        trainjob(
            "merged", runtimeRef={"name": runtime["metadata"]["name"]}, trainer={"resourcesPerNode": per_node}
        ),
    )
    pods = []
    while not pods:
        pods = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=merged").items
    resources = pods[0].spec.containers[0].resources
    assert resources.limits == {"nvidia.com/gpu": "2", "memory": "16Gi"}
    assert resources.requests == {"cpu": "2", "memory": "8Gi"}


@pytest.mark.slow
def test_failure_oom_and_stuck_pending(kube_standin, custom, core):
    kube_standin.scenario("boom", Scenario.failure("FailedJobs", "job boom-node-0 failed"))
    kube_standin.scenario("oom", Scenario.oom())
    kube_standin.scenario("stuck", Scenario.stuck_pending(image_pull_backoff=True))
    kube_standin.scenario("no-gpu", Scenario.stuck_pending())
    kube_standin.add_runtime(
        "fail-fast", restart_policy="Never", backoff_limit=0
    )  # else the OOM pod restarts
    for name in ("boom", "oom", "stuck", "no-gpu"):
        create(
            custom, trainjob(name, runtimeRef={"name": "fail-fast" if name == "oom" else "torch-distributed"})
        )
    failed = kube_standin.wait_for_trainjob("boom", condition="Failed")
    assert failed["status"]["conditions"][0]["message"] == "job boom-node-0 failed"
    assert failed["status"]["jobsStatus"][0]["failed"] == 1
    kube_standin.wait_for_trainjob("oom", condition="Failed")
    (oom_pod,) = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=oom").items
    terminated = oom_pod.status.container_statuses[0].state.terminated
    assert (oom_pod.status.phase, terminated.reason, terminated.exit_code) == ("Failed", "OOMKilled", 137)

    (stuck_pod,) = kube_standin.pods("stuck")
    pod = core.read_namespaced_pod(stuck_pod["metadata"]["name"], NS)
    assert pod.status.phase == "Pending"
    assert pod.status.container_statuses[0].state.waiting.reason == "ImagePullBackOff"
    events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={pod.metadata.name}").items
    assert {e.reason for e in events} == {"Failed", "BackOff"}
    with pytest.raises(ApiException) as error:  # logs of a waiting container are a 400, as on a cluster
        core.read_namespaced_pod_log(pod.metadata.name, NS, container="node")
    assert error.value.status == 400 and "is waiting to start" in status_of(error.value)["message"]
    assert "conditions" not in kube_standin.trainjob("stuck")["status"]

    (unschedulable,) = core.list_namespaced_pod(
        NS, label_selector="jobset.sigs.k8s.io/jobset-name=no-gpu"
    ).items
    assert unschedulable.status.conditions[0].reason == "Unschedulable"
    (event,) = core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={unschedulable.metadata.name}"
    ).items
    assert event.reason == "FailedScheduling" and "Insufficient nvidia.com/gpu" in event.message


# --- a crashing trainer: JobSet/Job defaults, restarts in place, backoffLimit, podFailurePolicy ------------------


def pod_history(core: client.CoreV1Api, job: str, since: str) -> list[tuple[str, client.V1Pod]]:
    """Every change of the job's pods after resourceVersion ``since``, up to the first deletion (a watch replays
    them; the job has ended, so this does not wait on the controller)."""
    seen = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        NS,
        label_selector=f"jobset.sigs.k8s.io/jobset-name={job}",
        resource_version=since,
        timeout_seconds=1,
    ):
        seen.append((event["type"], event["object"]))
        if event["type"] == "DELETED":
            break
    return seen


def job_events(kube: KubeStandin, job: str) -> list[tuple[str, str]]:
    return [
        (e["reason"], e["message"]) for e in kube.events() if e["involvedObject"]["name"] == f"{job}-node-0"
    ]


@pytest.mark.slow
def test_runtime_without_restart_policy_restarts_the_trainer_in_place_then_deletes_its_pods(
    kube_standin, custom, core
):
    """The fixture's runtime, like the upstream ones, sets neither restartPolicy nor backoffLimit: JobSet makes
    the pod OnFailure, the Job gets backoffLimit 6; the crash is only in lastState while it loops, and gone after."""
    kube_standin.scenario("crash", Scenario.failure(exit_code=3, log_lines=["boom"]))
    since = core.list_namespaced_pod(NS).metadata.resource_version
    create(custom, trainjob("crash"))
    kube_standin.wait_for_trainjob("crash", condition="Failed")
    history = pod_history(core, "crash", since)
    assert history[0][1].spec.restart_policy == "OnFailure"
    statuses = [pod.status.container_statuses[0] for _, pod in history if pod.status.container_statuses]
    looping = [s for s in statuses if s.state.waiting and s.state.waiting.reason == "CrashLoopBackOff"]
    assert [s.restart_count for s in looping] == [0, 1, 2, 3, 4, 5]
    assert [s.state.waiting.message.split()[1] for s in looping] == [
        "10s",
        "20s",
        "40s",
        "80s",
        "160s",
        "300s",
    ]
    assert {(s.last_state.terminated.exit_code, s.last_state.terminated.reason) for s in looping} == {
        (3, "Error")
    }
    # Never a terminal state while it loops (the pod stays Running); the Job controller's delete stops it (SIGTERM).
    running = [p.status.container_statuses[0] for _, p in history if not p.metadata.deletion_timestamp]
    assert all(s.state.terminated is None for s in running if s)
    assert statuses[-1].state.terminated.exit_code == 143
    assert statuses[-1].restart_count == 6 and history[-1][0] == "DELETED"
    assert kube_standin.pods("crash") == [] and kube_standin.trainjob("crash")["status"]["conditions"][0][
        "type"
    ] == ("Failed")
    assert job_events(kube_standin, "crash") == [
        ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
    ]


def test_crash_looping_container_log_is_the_crashed_one_and_a_follow_ends(kube_standin, custom, core):
    kube_standin.scenario("loop", Scenario.failure(log_lines=["attempt 1"], restart_backoff_scale=1.0))  # 10s
    create(custom, trainjob("loop"))
    pod = kube_standin.wait_for_pod(
        "loop",
        lambda p: (
            (p["status"].get("containerStatuses") or [{}])[0]
            .get("state", {})
            .get("waiting", {})
            .get("reason")
            == "CrashLoopBackOff"
        ),
    )
    name = pod["metadata"]["name"]
    assert (
        core.read_namespaced_pod_log(name, NS, container="node", follow=True, _request_timeout=5)
        == "attempt 1\n"
    )
    assert core.read_namespaced_pod_log(name, NS, container="node", previous=True) == "attempt 1\n"
    assert core.read_namespaced_pod(name, NS).status.phase == "Running"


@pytest.mark.parametrize(
    "runtime, pods, event",
    [
        ({"restart_policy": "Never", "backoff_limit": 0}, 1, "BackoffLimitExceeded"),
        ({"restart_policy": "Never", "backoff_limit": 1}, 2, "BackoffLimitExceeded"),
        ("runtimes/torchtune-cpu.yaml", 1, "PodFailurePolicy"),
    ],
)
def test_restart_policy_never_fails_the_job_and_keeps_the_failed_pods(
    kube_standin, custom, core, runtime, pods, event
):
    if isinstance(runtime, str):
        kube_standin.add_object(yaml.safe_load((REPO / runtime).read_text()))
        runtime_name = "torchtune-cpu"
    else:
        runtime_name = kube_standin.add_runtime("never", **runtime)["metadata"]["name"]
    kube_standin.scenario("oom", Scenario.oom())
    create(custom, trainjob("oom", runtimeRef={"name": runtime_name}))
    kube_standin.wait_for_trainjob("oom", condition="Failed")
    kept = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=oom").items
    assert len(kept) == pods
    for pod in kept:
        status = pod.status.container_statuses[0]
        assert (pod.spec.restart_policy, pod.status.phase, status.restart_count) == ("Never", "Failed", 0)
        assert (status.state.terminated.reason, status.state.terminated.exit_code) == ("OOMKilled", 137)
    ((reason, message),) = job_events(kube_standin, "oom")
    assert reason == event
    if event == "PodFailurePolicy":
        assert message == (
            f"Container node for pod {NS}/{kept[0].metadata.name} failed with exit code 137 matching FailJob rule "
            "at index 2"
        )


@pytest.mark.slow
def test_active_deadline_and_seeded_job(kube_standin, custom):
    kube_standin.scenario("late", Scenario.stuck_pending())
    create(custom, trainjob("late", activeDeadlineSeconds=1))
    failed = kube_standin.wait_for_trainjob("late", condition="Failed", timeout=5)
    assert failed["status"]["conditions"][0]["reason"] == "DeadlineExceeded"
    assert kube_standin.pods("late") == []

    kube_standin.add_object({**trainjob("seeded"), "metadata": {"name": "seeded"}})
    assert get(custom, "seeded")["metadata"]["resourceVersion"]
    kube_standin.wait_for_trainjob("seeded", condition="Complete")
    assert kube_standin.requests_for("POST", "trainjobs", "seeded") == []


def test_execute_mode_runs_node_commands(kube_standin, custom, core, tmp_path):
    workspace = tmp_path / "ws"
    workspace.mkdir()
    kube_standin.add_runtime("local-torch", command=["/bin/false"])
    kube_standin.execute(volume_dirs={"run-pvc": workspace})
    # the workspace PVC arrives through runtimePatches, as the launcher sends it
    pod_patch = {
        "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "run-pvc"}}],
        "containers": [{"name": "node", "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}],
    }
    node_patch = {"name": "node", "template": {"spec": {"template": {"spec": pod_patch}}}}
    patches = [
        {
            "manager": "kfp-finetune.io/launcher",
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_patch]}}},
        }
    ]
    script = (
        "import os, pathlib; rank = os.environ['PET_NODE_RANK']; print('rank', rank, os.environ['GREETING']);"
        "pathlib.Path(os.environ['OUT']).joinpath(f'rank{rank}.txt').write_text(os.environ['PET_NNODES'])"
    )
    create(
        custom,
        trainjob(
            "run",
            runtimeRef={"name": "local-torch"},
            runtimePatches=patches,
            trainer={
                "numNodes": 2,
                "command": [sys.executable, "-c"],
                "args": [script],
                "env": [
                    {"name": "GREETING", "value": "hi"},
                    {"name": "OUT", "value": "/workspace/$(GREETING)"},
                ],
            },
        ),
    )
    (workspace / "hi").mkdir()
    done = kube_standin.wait_for_trainjob("run", condition="Complete", timeout=20)
    assert done["status"]["conditions"][0]["type"] == "Complete"
    assert sorted(p.name for p in (workspace / "hi").iterdir()) == ["rank0.txt", "rank1.txt"]
    assert (workspace / "hi" / "rank1.txt").read_text() == "2"
    pods = kube_standin.pods("run")
    assert [core.read_namespaced_pod_log(p["metadata"]["name"], NS) for p in pods] == [
        "rank 0 hi\n",
        "rank 1 hi\n",
    ]
    assert [p["status"]["phase"] for p in pods] == ["Succeeded", "Succeeded"]

    create(
        custom,
        trainjob(
            "crash",
            runtimeRef={"name": "local-torch"},
            trainer={"command": [sys.executable, "-c", "import sys; print('dying'); sys.exit(3)"]},
        ),
    )
    failed = kube_standin.wait_for_trainjob("crash", condition="Failed", timeout=20)
    assert failed["status"]["conditions"][0]["reason"] == "FailedJobs"
    (pod,) = core.list_namespaced_pod(NS, label_selector="jobset.sigs.k8s.io/jobset-name=crash").items
    assert pod.status.phase == "Failed" and pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert core.read_namespaced_pod_log(pod.metadata.name, NS) == "dying\n"


def test_execute_mode_gives_each_node_pod_its_own_gpus_as_the_device_plugin_does(
    kube_standin, custom, core, tmp_path
):
    kube_standin.add_runtime("local-torch", command=["/bin/false"])
    kube_standin.execute(gpus=[0, 1, 2, 3])
    # Each node writes what it sees, then waits for the others: all hold their GPUs at once.
    script = (
        "import os, pathlib, time; out = pathlib.Path(os.environ['OUT']);"
        "out.joinpath(os.environ['PET_NODE_RANK']).write_text(os.environ['CUDA_VISIBLE_DEVICES']);"
        "nodes = int(os.environ['PET_NNODES']);"
        "[time.sleep(0.05) for _ in iter(lambda: len(list(out.iterdir())) < nodes, False)]"
    )

    def gpu_job(name: str, nodes: int, gpus: int, out: Path) -> dict:
        out.mkdir()
        return trainjob(name, runtimeRef={"name": "local-torch"}, trainer={
            "numNodes": nodes, "command": [sys.executable, "-c", script], "env": [{"name": "OUT", "value": str(out)}],
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus}},
        })  # fmt: skip

    create(custom, gpu_job("two-nodes", 2, 2, tmp_path / "two"))
    kube_standin.wait_for_trainjob("two-nodes", condition="Complete", timeout=20)
    seen = [set((tmp_path / "two" / rank).read_text().split(",")) for rank in ("0", "1")]
    assert all(len(gpus) == 2 for gpus in seen) and not seen[0] & seen[1]
    assert seen[0] | seen[1] == {"0", "1", "2", "3"}

    # Given back when the pods ended: one pod may now take all four; a fifth is more than the host has.
    create(custom, gpu_job("one-node", 1, 4, tmp_path / "one"))
    kube_standin.wait_for_trainjob("one-node", condition="Complete", timeout=20)
    assert (tmp_path / "one" / "0").read_text() == "0,1,2,3"
    create(custom, gpu_job("too-many", 1, 5, tmp_path / "five"))
    kube_standin.wait_for_trainjob("too-many", condition="Failed", timeout=20)
    (pod,) = kube_standin.pods("too-many")
    log = core.read_namespaced_pod_log(pod["metadata"]["name"], NS)
    assert "limits nvidia.com/gpu: 5, but only 4 of the host GPUs given to execute mode are free" in log


def test_expand_kube_vars_like_the_kubelet():
    env = {"A": "x", "B": "y"}
    assert expand_kube_vars("$(A)/$(B)-$(C)-$$(A)-$A", env) == "x/y-$(C)-$(A)-$A"


@pytest.mark.slow
def test_foreground_delete_dry_run_and_generate_name(kube_standin, custom):
    dry = custom.create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", trainjob("dry"), dry_run="All"
    )
    assert dry["metadata"]["name"] == "dry" and kube_standin.trainjob("dry") is None
    generated = create(custom, {**trainjob("unused"), "metadata": {"generateName": "run-"}})
    name = generated["metadata"]["name"]
    assert name.startswith("run-") and len(name) > len("run-")

    kube_standin.wait_for_trainjob(name, condition="Complete")
    rv = get(custom, name)["metadata"]["resourceVersion"]
    custom.delete_namespaced_custom_object(
        TRAINER_GROUP,
        TRAINER_VERSION,
        NS,
        "trainjobs",
        name,
        body=client.V1DeleteOptions(propagation_policy="Foreground"),
    )
    events = list(
        watch.Watch().stream(
            custom.list_namespaced_custom_object,
            TRAINER_GROUP,
            TRAINER_VERSION,
            NS,
            "trainjobs",
            resource_version=rv,
            field_selector=f"metadata.name={name}",
            timeout_seconds=1,
        )
    )
    assert [e["type"] for e in events] == ["MODIFIED", "DELETED"]
    assert events[0]["object"]["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert (
        kube_standin.requests_for("DELETE", "trainjobs", name)[0].param("propagationPolicy") == "Foreground"
    )
    assert kube_standin.pods(name) == []


# --- validation without the CRD files (a fresh clone): the typed models -----------------------------------------


@pytest.mark.parametrize(
    ("spec", "field", "text"),
    [
        ({"trainer": {"numNodes": 1, "gpus": 2}}, "spec.trainer.gpus", 'unknown field "spec.trainer.gpus"'),
        ({"trainer": {"numNodes": "two"}}, "spec.trainer.numNodes", "must be of type integer"),
        (
            {"trainer": {"env": [{"name": "A", "value": 1}]}},
            "spec.trainer.env[0].value",
            "must be of type string",
        ),
        ({"runtimeRef": {"kind": "ClusterTrainingRuntime"}}, "spec.runtimeRef.name", "Required value"),
        ({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", "greater than or equal to 1"),
        ({"managedBy": "me"}, "spec.managedBy", "ManagedBy must be"),
        (
            {"trainer": {"resourcesPerNode": {"limits": {"cpu": [1]}}}},
            "resourcesPerNode.limits.cpu",
            "object",
        ),
    ],
)
def test_typed_model_validation_names_the_field(spec, field, text):
    from tests.support.kube_standin._typed_schema import typed_model_validators

    errors = typed_model_validators()["trainjobs"].validate(trainjob("bad", **spec))
    assert any(field in path and text in message for path, message in errors), errors


def test_typed_model_validation_defaults_and_accepts_a_full_trainjob():
    from tests.support.kube_standin._typed_schema import typed_model_validators

    job = trainjob(
        "ok", trainer={"numNodes": 2, "resourcesPerNode": {"limits": {"cpu": 2, "nvidia.com/gpu": "1"}}},
        runtimePatches=[{"manager": "kfp-finetune.kubeflow.org", "trainingRuntimeSpec": {}}],
    )  # fmt: skip
    assert typed_model_validators()["trainjobs"].validate(job) == []
    assert job["spec"]["runtimeRef"] == {
        "name": "torch-distributed", "apiGroup": TRAINER_GROUP, "kind": "ClusterTrainingRuntime"}  # fmt: skip
    assert (job["spec"]["managedBy"], job["spec"]["suspend"]) == (
        "trainer.kubeflow.org/trainjob-controller",
        False,
    )
    for name in ("Upper", "a" * 64, "1starts-with-digit", "has.dot"):
        assert typed_model_validators()["trainjobs"].validate(trainjob(name)) != [], name
