"""The TrainJob launcher against the stand-in when the cluster is unkind: API errors while a job runs, pods that
cannot start, and deletion that takes its time (DESIGN.md §3 "What a real cluster does")."""

from __future__ import annotations

import threading

import pytest

from kfp_finetune.components.torchtune_finetune.backends.trainjob import (
    TrainJobFailed,
    TrainJobTimeout,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube
user_log = base.user_log


class Running:
    """A launcher's run() in a thread, so the test can act on the stand-in meanwhile."""

    def __init__(self, launcher) -> None:
        self.outcome: dict = {}
        self.thread = threading.Thread(target=self._run, args=(launcher,), daemon=True)
        self.thread.start()

    def _run(self, launcher) -> None:
        try:
            self.outcome["result"] = launcher.run()
        except BaseException as error:  # handed to the test thread
            self.outcome["error"] = error

    def result(self, timeout: float = 60.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the launcher did not return"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["result"]


def log_request_open(request) -> bool:
    return request.subresource == "log" and request.status == 200


# --- transient API errors -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_api_errors_after_the_log_stream_ends_never_delete_a_running_trainjob(kube, user_log):
    """The rank-0 log stream ends while training goes on and the pod GETs that follow meet a 503/429 burst longer
    than one call's retries: the launcher keeps retrying with back-off, and the run finishes."""
    lines = [f"Step {i} | loss:1.0" for i in range(1, 41)]
    kube.scenario(None, Scenario.success(lines, line_interval=0.05))
    running = Running(base.launcher(kube, cleanup="never"))
    kube.wait_for_request("GET", "pods", where=log_request_open)
    kube.wait_for_pod(NAME, lambda pod: lines_logged(kube, pod) >= 2)
    # Each GET of the pod (and of its log) fails 12 times with 503, then 12 times with 429: more than the
    # 8 attempts one call is given, so only a launcher that keeps trying while the TrainJob runs gets through.
    kube.fail_next(12, status=503, method="GET", path_contains="/pods/")
    kube.fail_next(12, status=429, method="GET", path_contains="/pods/")
    kube.end_log_streams()
    result = running.result()
    assert result.status == "Complete"
    assert not kube.requests_for("DELETE", "trainjobs")
    failed = [r.status for r in kube.requests_for("GET", "pods") if r.status >= 400]
    assert failed.count(503) == 12 and failed.count(429) == 12  # the whole burst was met
    assert result.log_lines == lines  # reconnected without losing or repeating a line
    assert "lost track" not in user_log.text


def lines_logged(kube, pod: dict) -> int:
    return len(kube.pod_log(pod["metadata"]["name"]).splitlines())


# --- pods that cannot start ------------------------------------------------------------------------------------------


def with_secret_env(job: dict, secret: str) -> dict:
    job["spec"]["trainer"].setdefault("env", []).append(
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret, "key": "token"}}}
    )
    return job


@pytest.mark.parametrize(
    "scenario, job, expected",
    [
        (
            Scenario(),  # the image is not in the stand-in's registry
            base.manifest(image="registry.example.com/team/trainer:nope"),
            [
                "ImagePullFailed",
                "image 'registry.example.com/team/trainer:nope' cannot be pulled (ImagePullBackOff: Back-off "
                'pulling image "registry.example.com/team/trainer:nope")',
                "check the image name and tag",
                "imagePullSecrets",
            ],
        ),
        (
            Scenario(),  # no Secret hf-token was created
            with_secret_env(base.manifest(), "hf-token"),
            [
                "ContainerConfigError",
                'container node cannot be configured (CreateContainerConfigError: secret "hf-token" not found)',
                "create Secret 'hf-token' in namespace team-a (kubectl create secret generic hf-token -n team-a",
            ],
        ),
        (
            Scenario.stuck_pending(),
            base.manifest(),
            [
                "Unschedulable",
                "no node can run it (Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                "request fewer GPUs",
            ],
        ),
    ],
    ids=["image", "secret", "unschedulable"],
)
def test_pods_that_cannot_start_fail_fast_with_the_reason_and_the_fix(
    kube, user_log, scenario, job, expected
):
    """With a grace period of 0 the first sight of the problem fails the step: long before the timeout. The
    TrainJob is deleted under the default cleanup policy (kept, it would hold its nodes, and start training
    unobserved once it could), after its reason, pod status and events are in the step log."""
    kube.scenario(None, scenario)
    run = base.launcher(kube, job, start_failure_grace=0, unschedulable_grace=0, timeout=20)
    with pytest.raises(TrainJobFailed) as raised:
        run.run()
    message = str(raised.value)
    for snippet in expected:
        assert snippet in message
    assert message.count("cannot start") == 1 and message.count("Fix:") == 1  # one line, not one per rank
    assert raised.value.result.deleted
    assert kube.trainjob(NAME) is None and not kube.pods(NAME)
    text = user_log.text
    deleted_at = text.index(f"deleted TrainJob {NAME} ({expected[0]} (cleanup policy 'on-success'))")
    # Written before the deletion: the reason, each pod's status, the events.
    assert -1 < text.index(f"TrainJob {NAME} declared failed: {expected[0]}") < deleted_at
    assert -1 < text.index("(rank 0): Pending") < deleted_at
    assert -1 < text.index("  event ") < deleted_at


def test_a_trainjob_that_cannot_start_is_kept_only_under_cleanup_never(kube, user_log):
    job = with_secret_env(base.manifest(), "hf-token")
    with pytest.raises(TrainJobFailed, match='secret "hf-token" not found') as raised:
        base.launcher(kube, job, start_failure_grace=0, cleanup="never", timeout=20).run()
    assert not raised.value.result.deleted
    assert kube.trainjob(NAME)["metadata"]["annotations"]["kfp-finetune.io/cleanup-policy"] == "never"
    assert not kube.requests_for("DELETE", "trainjobs")
    assert f"kept TrainJob {NAME} (cleanup policy 'never')" in user_log.text
    assert f"`kubectl delete trainjob -n team-a {NAME}` frees its nodes now" in user_log.text


UNKNOWN_IMAGE = "registry.example.com/team/trainer:nope"
HF_TOKEN_SECRET = {
    "apiVersion": "v1",
    "kind": "Secret",
    "metadata": {"name": "hf-token"},
    "data": {"token": "aGY="},
}


@pytest.mark.parametrize(
    "scenario, job, own_grace, other_grace",
    [
        (Scenario(), base.manifest(image=UNKNOWN_IMAGE), "start_failure_grace", "unschedulable_grace"),
        (
            Scenario(),
            with_secret_env(base.manifest(), "hf-token"),
            "start_failure_grace",
            "unschedulable_grace",
        ),
        (Scenario.stuck_pending(), base.manifest(), "unschedulable_grace", "start_failure_grace"),
    ],
    ids=["image", "secret", "unschedulable"],
)
@pytest.mark.slow
def test_each_problem_is_given_its_own_grace_period(kube, scenario, job, own_grace, other_grace):
    """The image-pull / container-config grace and the unschedulable grace are apart: with its own grace long and
    the other one 0 a problem is waited on until the timeout; with its own grace 0 it fails the step at once."""
    kube.scenario(None, scenario)
    with pytest.raises(TrainJobTimeout):
        base.launcher(kube, job, timeout=0.5, **{own_grace: 600, other_grace: 0}).run()
    with pytest.raises(TrainJobFailed, match="cannot start"):
        base.launcher(kube, job, timeout=20, **{own_grace: 0, other_grace: 600}).run()


@pytest.mark.parametrize(
    "scenario, job, remedy",
    [
        (Scenario.stuck_pending(), base.manifest(), lambda kube: kube.free_node()),
        (
            Scenario(),
            with_secret_env(base.manifest(), "hf-token"),
            lambda kube: kube.add_object(HF_TOKEN_SECRET),
        ),
        (Scenario(), base.manifest(image=UNKNOWN_IMAGE), lambda kube: kube.push_image(UNKNOWN_IMAGE)),
    ],
    ids=["node-frees-up", "secret-created", "image-pushed"],
)
def test_a_kept_trainjob_starts_training_unobserved_once_it_can(kube, scenario, job, remedy):
    """Why a TrainJob declared failed is deleted by default: kept (cleanup never), it trains as soon as a node frees
    up, the Secret is created (the printed fix) or the image pushed: the scheduler and the kubelet retry for ever."""
    kube.scenario(None, scenario)
    with pytest.raises(TrainJobFailed, match="cannot start"):
        base.launcher(
            kube, job, start_failure_grace=0, unschedulable_grace=0, cleanup="never", timeout=20
        ).run()
    remedy(kube)
    kube.wait_for_trainjob(NAME, condition="Complete")
    (pod,) = kube.pods(NAME)
    assert "Step 3 | loss:1.9500" in kube.pod_log(pod["metadata"]["name"])


def test_the_standin_shows_what_the_kubelet_shows(kube):
    kube.add_object(base.manifest(image="example.com/nope:1"))
    pod = kube.wait_for_pod(NAME, lambda p: True)
    node = pod["status"]["containerStatuses"][0]
    assert node["state"]["waiting"] == {
        "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "example.com/nope:1"',
    }
    messages = [e["message"] for e in kube.events() if e["involvedObject"]["name"] == pod["metadata"]["name"]]
    assert any(m.startswith('Failed to pull image "example.com/nope:1": rpc error') for m in messages)
    assert "Error: ImagePullBackOff" in messages


# --- asynchronous deletion ------------------------------------------------------------------------------------------


def requests_after(kube, mark: int):
    """A `where` for wait_for_request: only requests logged after the first `mark` ones."""
    earlier = {id(r) for r in kube.requests[:mark]}
    return lambda r: id(r) not in earlier


def next_move(kube, mark: int):
    """After the request log's first `mark` entries and the first JobSet 404 after them: the POST of a TrainJob,
    or a second pod list (the launcher found the JobSet gone, listed the pods, and is looking again)."""
    requests = kube.requests[mark:]
    gone = next((i for i, r in enumerate(requests) if r.resource == "jobsets" and r.status == 404), None)
    if gone is None:
        return None
    lists = 0
    for request in requests[gone + 1 :]:
        if request.method == "POST":
            return request
        if request.resource == "pods" and request.name is None and "watch" not in request.query:
            lists += 1
            if lists == 2:
                return request
    return None


@pytest.mark.slow
def test_replacing_a_failed_trainjob_waits_until_its_jobset_and_pods_are_gone(kube, user_log):
    kube.add_object(base.manifest(), scenario=Scenario.failure(pending_seconds=0.0, log_lines=["old run"]))
    kube.wait_for_trainjob(NAME, condition="Failed")
    old_pods = {p["metadata"]["uid"] for p in kube.pods(NAME)}
    assert old_pods and kube.jobset(NAME) is not None
    kube.hold_garbage_collection()
    kube.scenario(NAME, Scenario.success())
    running = Running(base.launcher(kube))

    kube.wait_for_request("DELETE", "trainjobs")
    assert kube.trainjob(NAME) is None and kube.jobset(NAME) is not None  # the JobSet outlives its TrainJob
    # Re-created now, the TrainJob would adopt the old JobSet and fail at once: the launcher must look first.
    after_delete = requests_after(kube, kube.requests.index(kube.requests_for("DELETE", "trainjobs")[0]))
    first = kube.wait_for_request(
        None,
        where=lambda r: (
            after_delete(r) and (r.method == "POST" or (r.resource == "jobsets" and r.status == 200))
        ),
    )
    assert first.method == "GET", "created the TrainJob while its old JobSet still existed"

    mark = len(kube.requests)
    assert kube.collect_garbage().startswith(f"JobSet {NAME} deleted")
    assert kube.jobset(NAME) is None
    assert all(p["metadata"].get("deletionTimestamp") for p in kube.pods(NAME))  # terminating, still there
    # Pods still there: the launcher must look again rather than create. Whichever comes first tells.
    kube.wait_for_request(None, where=lambda _: next_move(kube, mark) is not None)
    first = next_move(kube, mark)
    assert first.method == "GET", "created the TrainJob while the old pods were terminating"

    mark = len(kube.requests)
    kube.collect_garbage()  # the pods are gone
    result = running.result()
    assert result.status == "Complete" and result.created
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [409, 201]
    assert kube.wait_for_request("POST", "trainjobs", where=requests_after(kube, mark)).status == 201
    assert "waiting for the old TrainJob to be gone" in user_log.text


@pytest.mark.slow
def test_a_retry_after_its_trainjob_was_deleted_waits_for_the_old_pods_before_creating(kube, user_log):
    """The step's pod was evicted and deleted its TrainJob (Background: the TrainJob goes at once); the old pods are
    still stopping (their grace period: 300 s in our runtimes) when the retry starts. Created then, the TrainJob
    would inherit the old JobSet and its pods, two trainings sharing the run folder: the retry waits first."""
    from kubernetes import client

    kube.add_object(base.manifest(), scenario=Scenario.failure(pending_seconds=0.0, log_lines=[]))
    kube.wait_for_trainjob(NAME, condition="Failed")
    kube.hold_garbage_collection()
    client.CustomObjectsApi(kube.api_client()).delete_namespaced_custom_object(
        tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, NAME
    )
    assert kube.trainjob(NAME) is None and kube.jobset(NAME) is not None
    kube.scenario(NAME, Scenario.success())
    mark = len(kube.requests)
    running = Running(base.launcher(kube))

    after = requests_after(kube, mark)
    first = kube.wait_for_request(
        None,
        where=lambda r: after(r) and (r.resource, r.method) in (("trainjobs", "POST"), ("jobsets", "GET")),
    )
    assert first.resource == "jobsets", "created the TrainJob while its old JobSet still existed"
    mark = len(kube.requests)
    kube.collect_garbage()  # the JobSet goes; its pods terminate
    # Pods still there: the launcher must look again rather than create. Whichever comes first tells.
    kube.wait_for_request(None, where=lambda _: next_move(kube, mark) is not None)
    assert next_move(kube, mark).method == "GET", "created the TrainJob while the old pods were terminating"
    kube.collect_garbage()  # the pods are gone
    result = running.result()
    assert result.status == "Complete" and result.created
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [201]
    assert f"TrainJob {NAME} of this run and task was deleted, but JobSet {NAME}" in user_log.text


def test_a_trainjob_created_while_its_old_jobset_exists_inherits_it(kube):
    """The hazard the launcher avoids, as the stand-in shows it (the Trainer's jobset plugin, see _controller.py)."""
    kube.add_object(base.manifest(), scenario=Scenario.failure(pending_seconds=0.0, log_lines=[]))
    kube.wait_for_trainjob(NAME, condition="Failed")
    kube.hold_garbage_collection()
    api = kube.api_client()
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    custom.delete_namespaced_custom_object(tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, NAME)
    assert kube.trainjob(NAME) is None
    kube.scenario(NAME, Scenario.success())
    custom.create_namespaced_custom_object(tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, base.manifest())
    job = kube.wait_for_trainjob(NAME, condition="Failed")
    assert job["status"]["conditions"][0]["reason"] == "FailedJobs"
    assert all(
        p["metadata"].get("deletionTimestamp") is None for p in kube.pods(NAME)
    )  # the old pods, no new


def test_foreground_delete_keeps_the_trainjob_readable_until_its_dependents_are_gone(kube):
    kube.add_object(base.manifest(), scenario=Scenario.failure(pending_seconds=0.0, log_lines=[]))
    kube.wait_for_trainjob(NAME, condition="Failed")
    kube.hold_garbage_collection()
    from kubernetes import client

    custom = client.CustomObjectsApi(kube.api_client())
    custom.delete_namespaced_custom_object(
        tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, NAME, propagation_policy="Foreground"
    )
    deleting = kube.trainjob(NAME)
    assert deleting["metadata"]["deletionTimestamp"] and deleting["metadata"]["finalizers"] == [
        "foregroundDeletion"
    ]
    kube.collect_garbage()
    pod = kube.pods(NAME)[0]
    # The grace period the runtime gives its node pods (runtimes/torchtune-cpu.yaml: time to save a checkpoint).
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 300 and pod["status"]["phase"] == "Failed"
    kube.collect_garbage()
    assert kube.pods(NAME) == [] and kube.trainjob(NAME) is not None
    assert kube.collect_garbage() == f"TrainJob {NAME} removed"
    assert kube.trainjob(NAME) is None and kube.collect_garbage() is None
