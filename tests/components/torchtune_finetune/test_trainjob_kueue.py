"""A TrainJob in a Kueue queue: Kueue's labels on the manifest, the wait for admission in the step log with its own
timeout, the training timeout from admission, preemption and re-queueing, a missing LocalQueue, a Role that may
not read Workloads. The stand-in plays Kueue (tests/support/kube_standin/_kueue.py); admission and preemption
happen when a test says so."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone

import pytest
import yaml
from kubernetes import client

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.launch_settings import queue_problems
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobError
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.kueue import (
    PRIORITY_CLASS_LABEL,
    QUEUE_LABEL,
    TrainJobQueueTimeout,
)
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.components.torchtune_finetune.test_trainjob_lifecycle import Running, lines_logged
from tests.deploy.test_rbac import rbac_documents
from tests.deploy.test_runtimes import manifest_errors
from tests.support.kube_standin import DEFAULT_LOG_LINES, KubeStandin, Scenario

NAME = base.NAME
QUEUE = "team-queue"
kube = base.kube
user_log = base.user_log


def queued(**kwargs) -> dict:
    return base.manifest(queue_name=QUEUE, priority_class="nightly", **kwargs)


def workload_reads(kube: KubeStandin) -> int:
    return len(kube.requests_for("GET", "workloads"))


def wait_for_workload_reads(kube: KubeStandin, count: int) -> None:
    """Until the launcher has read the TrainJob's Workload `count` times (one read per line about the wait)."""
    kube.wait_for_request("GET", "workloads", where=lambda _: workload_reads(kube) >= count)


def position_reads(kube: KubeStandin) -> list:
    """The launcher's reads of Kueue's visibility API (the pendingworkloads of a LocalQueue)."""
    return [r for r in kube.requests_for("GET") if r.path.endswith("/pendingworkloads")]


def wait_for_position_reads(kube: KubeStandin, count: int) -> None:
    kube.wait_for_request("GET", where=lambda _: len(position_reads(kube)) >= count)


def positions(user_log) -> list[tuple[int, int]]:
    """(in the queue, in the cluster queue) of each line about the wait, in order."""
    found = (
        re.search(r"; position (\d+) in queue \S+ \((\d+) in the cluster queue\)$", m)
        for m in user_log.messages
    )
    return [(int(f[1]), int(f[2])) for f in found if f]


def seed_waiting(kube: KubeStandin, name: str, queue: str, hours_ago: float) -> None:
    """Another queued TrainJob, created `hours_ago` (so ahead of ours in Kueue's order), waiting suspended."""
    job = base.manifest(task=name, queue_name=queue)
    job["metadata"]["creationTimestamp"] = (datetime.now(timezone.utc) - timedelta(hours=hours_ago)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    kube.add_object(job)


def rbac_without(resource: str) -> list[dict]:
    """runtimes/rbac.yaml without its rule for `resource`, bound in the stand-in's namespace."""
    documents = rbac_documents()
    for doc in documents:
        doc["rules"] = [r for r in doc.get("rules", []) if resource not in r["resources"]]
        if doc["kind"] == "RoleBinding":
            doc["metadata"]["namespace"] = "team-a"
        for subject in doc.get("subjects", []):
            subject["namespace"] = "team-a"
    return documents


# --- the manifest ----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_queued_manifest_carries_kueues_labels_waits_suspended_and_is_valid():
    job = queued(active_deadline_seconds=3600)
    labels = job["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[PRIORITY_CLASS_LABEL]) == (QUEUE, "nightly")
    assert job["spec"]["suspend"] is True  # as Kueue's webhook sets it: nothing starts before admission
    assert manifest_errors(job) == []
    plain = base.manifest()
    assert "suspend" not in plain["spec"] and QUEUE_LABEL not in plain["metadata"]["labels"]
    # The API server (with the Trainer's and Kueue's webhooks) stores it: Kueue adds its own runtime patch.
    with KubeStandin(namespace="team-a") as kube:
        kube.add_object(yaml.safe_load((base.REPO / "runtimes" / "torchtune-cpu.yaml").read_text()))
        kube.add_local_queue(QUEUE)
        stored = client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
            tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, job
        )
    assert [p["manager"] for p in stored["spec"]["runtimePatches"]] == [
        tj.PATCH_MANAGER,
        "kueue.x-k8s.io/manager",
    ]
    assert manifest_errors(stored) == []


@pytest.mark.parametrize(
    "settings, parameter",
    [
        ({"queue_name": "Team_Queue"}, "queue_name"),
        ({"queue_name": "q" * 64}, "queue_name"),
        ({"queue_name": "team-queue.", "priority_class": ""}, "queue_name"),
        ({"queue_name": "team-queue", "priority_class": "High"}, "priority_class"),
        ({"queue_name": "team-queue", "queue_timeout_seconds": -1}, "queue_timeout_seconds"),
    ],
)
def test_kueue_settings_that_kueue_would_refuse_are_refused_naming_the_parameter(settings, parameter):
    given = {"queue_name": "", "priority_class": "", "queue_timeout_seconds": 0, **settings}
    (problem,) = queue_problems(**given)
    assert isinstance(problem, SettingError) and problem.setting == parameter
    if parameter != "queue_timeout_seconds":
        with pytest.raises(ValueError, match=f"^tune_{parameter} must name a Kueue object"):
            base.manifest(queue_name=given["queue_name"], priority_class=given["priority_class"])


def test_the_stand_ins_kueue_webhook_denies_a_queue_name_that_is_no_object_name():
    """What a cluster answers were the launcher's own check missing (so the check is not kinder than Kueue)."""
    job = base.manifest()
    job["metadata"]["labels"][QUEUE_LABEL] = "Team_Queue"
    with KubeStandin(namespace="team-a") as kube:
        kube.add_object(yaml.safe_load((base.REPO / "runtimes" / "torchtune-cpu.yaml").read_text()))
        with pytest.raises(client.ApiException) as denied:
            client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
                tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, job
            )
    assert denied.value.status == 403
    assert json.loads(denied.value.body)["message"].startswith('admission webhook "vtrainjob.kb.io" denied')


# --- waiting for admission -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_wait_for_admission_is_said_every_interval_and_training_is_timed_from_admission(kube, user_log):
    """Queued longer than the training timeout (and the TrainJob's activeDeadlineSeconds): neither fires, because
    both count from the admission; the lines name the queue, the time waited and the Workload's message."""
    kube.add_local_queue(QUEUE)
    running = Running(
        base.launcher(kube, queued(active_deadline_seconds=1), timeout=1.0, queue_report_interval=0.05)
    )
    # 25 lines at 0.05s: the launcher has waited longer than its training timeout (1s) in the queue.
    wait_for_workload_reads(kube, 25)
    assert not kube.pods(NAME), "no pod before admission"
    kube.admit(NAME)
    result = running.result()
    assert result.status == "Complete" and result.log_lines == list(DEFAULT_LOG_LINES)
    assert not kube.workloads(), "the Workload goes with the TrainJob (deleted on success)"
    text = user_log.text
    assert f"TrainJob {NAME} waits for admission in Kueue queue {QUEUE}" in text
    waiting = [m for m in user_log.messages if m.startswith(f"TrainJob {NAME} still waits for admission")]
    assert len(waiting) >= 24
    assert all(
        f"in Kueue queue {QUEUE}: " in m
        and "so far; Workload trainjob-" in m
        and "insufficient unused quota" in m
        for m in waiting
    ), waiting[:2]
    assert f"TrainJob {NAME} admitted by Kueue (queue {QUEUE}) after" in text
    assert (
        "is suspended; waiting for it to be resumed" not in text
    )  # the queue's words, not a plain suspension


@pytest.mark.slow
def test_a_trainjob_never_admitted_is_deleted_after_the_queue_timeout(kube, user_log):
    kube.add_local_queue(QUEUE)
    with pytest.raises(TrainJobQueueTimeout) as timed_out:
        base.launcher(kube, queued(), timeout=0.1, queue_timeout=0.5, queue_report_interval=0.05).run()
    message = str(timed_out.value)
    assert "\n" not in message
    assert message.startswith(
        f"TrainJob team-a/{NAME} was not admitted by Kueue queue '{QUEUE}' within tune_queue_timeout_seconds=0.5 "
        "(deleted)"
    )
    assert kube.trainjob(NAME) is None and not kube.workloads()
    assert [r.status for r in kube.requests_for("DELETE", "trainjobs")] == [200]


@pytest.mark.slow
def test_a_preempted_trainjob_is_re_queued_said_and_waited_on_again(kube, user_log):
    kube.add_local_queue(QUEUE)
    kube.scenario(NAME, Scenario.success([f"Step {i} | loss:1.0" for i in range(1, 401)], line_interval=0.05))
    running = Running(base.launcher(kube, queued(), queue_timeout=60, queue_report_interval=0.05))
    wait_for_workload_reads(kube, 2)
    kube.admit(NAME)
    first = kube.wait_for_pod(NAME, lambda pod: lines_logged(kube, pod) >= 2)
    # The run after the re-admission is short: the scenario is read when the Trainer starts the pods again.
    kube.scenario(NAME, Scenario.success())
    reads = workload_reads(kube)
    kube.preempt(NAME)
    wait_for_workload_reads(kube, reads + 3)  # the eviction's message, then two lines about the new wait
    kube.admit(NAME)
    result = running.result()
    assert result.status == "Complete"
    assert result.log_lines[-len(DEFAULT_LOG_LINES) :] == list(DEFAULT_LOG_LINES)
    text = user_log.text
    assert (
        f"TrainJob {NAME} was preempted by Kueue, re-queued in queue {QUEUE}; Workload trainjob-" in text
        and "Preempted to accommodate a workload" in text
    )
    assert text.count(f"TrainJob {NAME} admitted by Kueue (queue {QUEUE})") == 2
    # The log thread names the new pod (the main thread's line about the pod change may come after it).
    restarted = [m for m in user_log.messages if "rank-0 pod restarted as" in m]
    assert restarted and all(first["metadata"]["name"] not in m for m in restarted)


def test_a_missing_local_queue_fails_before_anything_is_created(kube):
    with pytest.raises(TrainJobError) as failed:
        base.launcher(kube, queued(), queue_timeout=60).run()
    assert str(failed.value) == (
        f"tune_queue_name: Kueue LocalQueue '{QUEUE}' not found in namespace team-a (or Kueue is not installed): "
        "`kubectl get localqueues -n team-a` lists the queues; name one of them, or leave it empty to run without "
        "Kueue; nothing was created"
    )
    assert not kube.requests_for("POST", "trainjobs")


@pytest.mark.slow
def test_a_role_that_may_not_read_workloads_still_waits_and_says_so_once(kube, user_log):
    """runtimes/rbac.yaml without its Workload rule: the position is still found, by the Workload's owner."""
    kube.enforce_rbac(rbac_without("workloads"), service_account="team-a:pipeline-runner")
    kube.add_local_queue(QUEUE)
    running = Running(base.launcher(kube, queued(), queue_report_interval=0.05))
    wait_for_position_reads(kube, 2)
    kube.admit(NAME)
    assert running.result().status == "Complete"
    assert [r.status for r in kube.requests_for("GET", "workloads")] == [403]  # asked once, then not again
    forbidden = [m for m in user_log.messages if m.startswith("cannot read Kueue Workloads")]
    assert len(forbidden) == 1 and "(runtimes/rbac.yaml grants the read)" in forbidden[0]
    assert any(m.startswith(f"TrainJob {NAME} still waits for admission") for m in user_log.messages)
    assert positions(user_log)[:2] == [(1, 1), (1, 1)]


# --- the position in the queue (Kueue's visibility API) ---------------------------------------------------------------


@pytest.mark.slow
def test_the_wait_lines_show_the_position_which_moves_up_as_those_ahead_are_admitted(kube, user_log):
    """Two TrainJobs ahead in our LocalQueue and one in another LocalQueue of the same ClusterQueue: each admission
    moves ours up, in the queue and in the cluster queue (the stand-in orders them as Kueue does)."""
    kube.add_local_queue(QUEUE)
    kube.add_local_queue("other-queue")  # the same ClusterQueue
    seed_waiting(kube, "ahead-1", QUEUE, hours_ago=2)
    seed_waiting(kube, "ahead-2", QUEUE, hours_ago=1)
    seed_waiting(kube, "elsewhere", "other-queue", hours_ago=3)
    running = Running(base.launcher(kube, queued(), queue_report_interval=0.05))
    reads = 2
    wait_for_position_reads(kube, reads)
    for ahead in ("ahead-1", "elsewhere", "ahead-2"):
        kube.admit(tj.trainjob_name(base.RUN_ID, ahead))
        # The read after the next one began after the admission (the launcher reads one at a time).
        reads = len(position_reads(kube)) + 2
        wait_for_position_reads(kube, reads)
    kube.admit(NAME)
    assert running.result().status == "Complete"
    seen = positions(user_log)
    assert [p for i, p in enumerate(seen) if i == 0 or p != seen[i - 1]] == [(3, 4), (2, 3), (2, 2), (1, 1)]
    waiting = [m for m in user_log.messages if m.startswith(f"TrainJob {NAME} still waits for admission")]
    assert all(
        re.search(
            r"so far; Workload trainjob-\S+: couldn't assign flavors .*; position \d+ in queue " + QUEUE, m
        )
        for m in waiting
    ), waiting[:2]
    assert len(seen) == len(waiting)  # every line has it
    assert {r.path.split("/")[3] for r in position_reads(kube)} == {"v1beta2"}


@pytest.mark.slow
def test_an_older_kueue_serving_only_v1beta1_is_asked_there(kube, user_log):
    """Kueue v0.9 to v0.14: v1beta2 is a 404 once, then v1beta1 serves the position."""
    kube.kueue_visibility(versions=("v1beta1",))
    kube.add_local_queue(QUEUE)
    running = Running(base.launcher(kube, queued(), queue_report_interval=0.05))
    wait_for_position_reads(kube, 4)
    kube.admit(NAME)
    assert running.result().status == "Complete"
    asked = [(r.path.split("/")[3], r.status) for r in position_reads(kube)]
    assert asked[:3] == [("v1beta2", 404), ("v1beta1", 200), ("v1beta1", 200)]
    assert ("v1beta2", 404) not in asked[1:]
    assert positions(user_log)[:2] == [(1, 1), (1, 1)]
    assert not [m for m in user_log.messages if m.startswith("cannot read the position")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "cluster, statuses, reason, fix",
    [
        (
            "no-rbac",
            [403],
            'cannot get resource "localqueues/pendingworkloads"',
            "runtimes/rbac.yaml grants it",
        ),
        ("no-api", [404, 404], "404 Not Found", "visibility API is not installed or not available"),
        ("unreachable", [503], "503 Service Unavailable", "visibility API is not installed or not available"),
    ],
)
def test_a_position_that_cannot_be_read_is_said_once_and_the_wait_goes_on(
    kube, user_log, cluster, statuses, reason, fix
):
    if cluster == "no-rbac":
        kube.enforce_rbac(
            rbac_without("localqueues/pendingworkloads"), service_account="team-a:pipeline-runner"
        )
    else:
        kube.kueue_visibility(
            versions=() if cluster == "no-api" else ("v1beta2", "v1beta1"), available=cluster != "unreachable"
        )
    kube.add_local_queue(QUEUE)
    running = Running(base.launcher(kube, queued(), queue_report_interval=0.05))
    wait_for_workload_reads(kube, 4)
    kube.admit(NAME)
    assert running.result().status == "Complete"
    assert [r.status for r in position_reads(kube)] == statuses  # said once, then not asked again
    (said,) = [m for m in user_log.messages if m.startswith("cannot read the position")]
    assert f"in Kueue queue {QUEUE} (" in said and reason in said and fix in said, said
    waiting = [m for m in user_log.messages if m.startswith(f"TrainJob {NAME} still waits for admission")]
    # Kueue's reason until it admits; a report racing the admission finds the Pending condition gone.
    assert sum("insufficient unused quota" in m for m in waiting) >= 3, waiting
    assert not positions(user_log)
    if cluster == "no-rbac":  # the self-check said it before the launch
        assert (
            "may not get localqueues/pendingworkloads (visibility.kueue.x-k8s.io) in namespace team-a"
            in user_log.text
        )


@pytest.mark.slow
def test_other_errors_of_the_visibility_api_are_retried(kube, user_log):
    kube.add_local_queue(QUEUE)
    kube.fail_next(2, status=500, path_contains="/pendingworkloads")
    running = Running(base.launcher(kube, queued(), queue_report_interval=0.05))
    wait_for_position_reads(kube, 4)
    kube.admit(NAME)
    assert running.result().status == "Complete"
    assert [r.status for r in position_reads(kube)][:3] == [500, 500, 200]
    assert user_log.text.count("Kubernetes API 500; retrying") == 2
    assert positions(user_log)[0] == (1, 1)


def test_the_step_checks_its_kueue_settings_before_anything_and_hands_them_to_the_trainjob_backend():
    from kfp_finetune.components._shared.errors import ConfigError
    from kfp_finetune.components.torchtune_finetune.finetune import queue_settings

    given = {"backend": "trainjob", "queue_name": QUEUE, "priority_class": "", "queue_timeout_seconds": 0}
    assert queue_settings(given) == {"queue_name": QUEUE, "priority_class": "", "queue_timeout": None}
    with pytest.raises(ConfigError, match="^tune_priority_class must name a Kueue object"):
        queue_settings({**given, "priority_class": "Nightly"})
    assert queue_settings({**given, "backend": "local"}) == {}
