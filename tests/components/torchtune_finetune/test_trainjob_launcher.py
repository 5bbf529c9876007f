"""The TrainJob launcher against the Kubernetes API stand-in, asserting what the user sees."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from kfp_finetune.components._shared.kube.client import Backoff
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.torchtune_finetune.backends.trainjob import (
    TrainJobConflict,
    TrainJobDiverged,
    TrainJobError,
    TrainJobFailed,
    TrainJobLauncher,
    TrainJobTimeout,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from tests.support.kube_standin import KubeStandin, Scenario

REPO = Path(__file__).resolve().parents[3]
RUN_ID = "run-7f3a"
TASK = "torchtune-finetune"
NAME = tj.trainjob_name(RUN_ID, TASK)


class LogRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.messages)


@pytest.fixture
def user_log():
    """What the launcher writes to the step log (the kfp_finetune logger does not propagate to caplog)."""
    recorder = LogRecorder()
    logger = get_logger("kfp_finetune")
    logger.addHandler(recorder)
    yield recorder
    logger.removeHandler(recorder)


def launcher_threads() -> list[str]:
    """Names of running watch / pod-watch / log threads of any TrainJobLauncher."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("watch-", "pods-", "log-"))]


@pytest.fixture
def kube():
    with KubeStandin(namespace="team-a") as standin:
        standin.add_object(yaml.safe_load((REPO / "runtimes" / "torchtune-cpu.yaml").read_text()))
        yield standin
        # Checked while the API still serves: a launcher's watch and log threads end because run() stopped
        # them, not because the server went away. A leftover one would log into whatever runs next.
        leftover = launcher_threads()
        assert not leftover, f"launcher threads still running after run() returned: {leftover}"
        # No TrainJob outlives its step: training nobody follows would hold GPUs and write into the workspace.
        outliving = standin.outliving_trainjobs()
        assert not outliving, f"TrainJobs still running after the step ended: {outliving}"


class Sleeps(list):
    """An injected `sleep`: records the backoff delays and waits only a token amount."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        time.sleep(0.005)


def manifest(run_id: str = RUN_ID, task: str = TASK, **kwargs) -> dict:
    name = tj.trainjob_name(run_id, task)
    return tj.build_trainjob(
        name,
        ["tune", "run", "lora_finetune_single_device", "--config", "/kfp-workspace/runs/r/config.yaml"],
        runtime="torchtune-cpu",
        run_id=run_id,
        task_name=task,
        **kwargs,
    )


def launcher(kube: KubeStandin, job: dict | None = None, sleeps: Sleeps | None = None, **options):
    settings = dict(
        namespace="team-a",
        tick=0.02,
        watch_timeout=1,
        log_read_timeout=5,
        pending_warning_after=0.2,
        log_drain_timeout=3,
        handle_signals=False,
        backoff=Backoff(initial=0.01, maximum=0.05, sleep=sleeps if sleeps is not None else Sleeps()),
    )
    settings.update(options)
    return TrainJobLauncher(job or manifest(), kube.api_client(), **settings)


def watch_requests(kube: KubeStandin, resource: str) -> list:
    return [r for r in kube.requests_for("GET", resource) if r.query.get("watch") in ("true", "True")]


def plain_lists(kube: KubeStandin, resource: str) -> list:
    return [r for r in kube.requests_for("GET", resource) if r.name is None and "watch" not in r.query]


# --- success ------------------------------------------------------------------------------------------------------


def test_success_streams_logs_shows_progress_and_deletes_the_trainjob(kube, user_log):
    result = launcher(kube, total_steps=3).run()

    assert result.status == "Complete" and result.created and result.deleted
    assert result.name == NAME and result.namespace == "team-a"
    assert result.log_lines == [
        "Step 1 | loss:2.3026 lr:0.0001 tokens_per_second_per_gpu:123.4",
        "Step 2 | loss:2.1000 lr:0.0001 tokens_per_second_per_gpu:125.0",
        "Step 3 | loss:1.9500 lr:0.0001 tokens_per_second_per_gpu:126.1",
    ]
    assert [s.step for s in result.steps] == [1, 2, 3] and result.steps[-1].loss == pytest.approx(1.95)
    assert result.wall_time > 0
    assert "[node-0] Step 2 | loss:2.1000" in user_log.text
    assert "progress: step 3/3 | loss 1.9500 | next step's lr 0.0001 | 126.1 tokens/s" in user_log.text
    assert f"created TrainJob team-a/{NAME}" in user_log.text
    assert "no preStop hook" not in user_log.text  # runtimes/torchtune-cpu.yaml has it

    assert kube.trainjob(NAME) is None
    (delete,) = kube.requests_for("DELETE", "trainjobs")
    assert delete.query.get("propagationPolicy") == "Background"
    assert len(kube.requests_for("POST", "trainjobs")) == 1
    # Watches, not a poll: the TrainJob is listed once and then watched.
    assert watch_requests(kube, "trainjobs") and watch_requests(kube, "pods")
    assert len(plain_lists(kube, "trainjobs")) == 1


@pytest.mark.slow
def test_slow_start_waits_through_pending_then_streams(kube, user_log):
    kube.scenario(None, Scenario.success(pending_seconds=0.6))
    result = launcher(kube, pending_warning_after=30).run()
    assert result.status == "Complete" and len(result.log_lines) == 3
    assert "Pending" not in user_log.text


@pytest.mark.slow
def test_log_reconnects_do_not_repeat_lines(kube):
    lines = [f"line {i}" for i in range(8)]
    kube.scenario(None, Scenario.success(lines, line_interval=0.15))
    kube.fail_next(2, status=500, path_contains="/log")
    result = launcher(kube, log_read_timeout=0.1).run()
    assert result.log_lines == lines
    assert (
        len([r for r in kube.requests if r.subresource == "log"]) >= 3
    )  # reconnected after silences and 500s


# --- failures -----------------------------------------------------------------------------------------------------


def test_failure_raises_with_reason_termination_and_last_lines(kube):
    kube.scenario(
        None,
        Scenario.failure(
            "FailedJobs",
            "jobset failed due to one or more job failures",
            exit_code=2,
            log_lines=["Step 1 | loss:2.0", "Traceback (most recent call last):", "ValueError: bad config"],
        ),
    )
    with pytest.raises(TrainJobFailed) as raised:
        launcher(kube).run()
    text = str(raised.value)
    assert f"TrainJob team-a/{NAME} failed: FailedJobs: jobset failed due to one or more job failures" in text
    assert f"pod {NAME}-node-0-0-" in text and "(rank 0): Error (exit code 2)" in text
    assert text.rstrip().endswith("ValueError: bad config")
    assert raised.value.result.status == "Failed" and raised.value.result.steps[0].loss == 2.0
    assert kube.trainjob(NAME) is not None  # kept for debugging (cleanup on-success)
    assert not kube.requests_for("DELETE", "trainjobs")


def test_oom_killed_pod_is_named_in_the_error(kube):
    kube.scenario(None, Scenario.oom(log_lines=["Step 1 | loss:2.0"]))
    with pytest.raises(TrainJobFailed, match=r"\(rank 0\): OOMKilled \(exit code 137\)"):
        launcher(kube).run()


def test_crash_is_reported_after_one_attempt_with_the_reason_and_last_lines(kube):
    """runtimes/torchtune-cpu.yaml fails fast: without restartPolicy Never / backoffLimit 0 the OOM-killed trainer
    would restart in place (JobSet/Job defaults) and its pod, exit code and log would be deleted at the end."""
    kube.scenario(None, Scenario.oom(log_lines=["Step 1 | loss:2.0", "allocating 80 GiB"]))
    with pytest.raises(TrainJobFailed) as raised:
        launcher(kube).run()
    text = str(raised.value)
    assert "(rank 0): OOMKilled (exit code 137)" in text and text.rstrip().endswith("allocating 80 GiB")
    (pod,) = kube.pods(NAME)
    assert pod["status"]["phase"] == "Failed" and pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert kube.pod_log(pod["metadata"]["name"]).count("Step 1") == 1  # one attempt
    job_events = [
        (e["reason"], e["message"]) for e in kube.events() if e["involvedObject"]["name"] == f"{NAME}-node-0"
    ]
    assert job_events == [
        (
            "PodFailurePolicy",
            f"Container node for pod team-a/{pod['metadata']['name']} failed with exit code 137 matching FailJob "
            "rule at index 2",
        )
    ]


def test_a_node_stopped_with_another_nodes_pod_names_the_rule_a_runtime_of_ones_own_lacks(kube):
    """Exit 75 (_shared/stop_exit.py): the node saved its checkpoint and stopped with a preempted node; a runtime
    whose podFailurePolicy fails the Job on it (only the DisruptionTarget is ignored) is told the rule to add."""
    policy = {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [0]},
            },
        ]
    }
    kube.add_runtime("team-torch", restart_policy="Never", backoff_limit=0, pod_failure_policy=policy)
    kube.scenario(None, Scenario.failure(exit_code=75, log_lines=["Step 1 | loss:2.0"]))
    job = tj.build_trainjob(
        NAME, ["tune", "run", "full_finetune_distributed", "--config", "c.yaml"], runtime="team-torch",
        run_id=RUN_ID, task_name=TASK, num_nodes=2,
    )  # fmt: skip
    with pytest.raises(TrainJobFailed) as raised:
        launcher(kube, job).run()
    assert (
        "(rank 0): Error (exit code 75). It saved the checkpoint and stopped because another node's pod was "
        "stopping; the runtime's podFailurePolicy should Ignore exit code 75 on the node container"
    ) in str(raised.value)


def test_a_runtime_without_the_stop_hook_is_named_in_the_step_log(kube, user_log):
    """A user's runtime (fail-fast, but without our preStop hook): the TrainJob runs, and the step log says what
    a stopping pod then saves its checkpoint within."""
    kube.add_runtime("users-runtime", restart_policy="Never", backoff_limit=0)
    job = manifest()
    job["spec"]["runtimeRef"]["name"] = "users-runtime"
    assert launcher(kube, job).run().status == "Complete"
    assert (
        "ClusterTrainingRuntime 'users-runtime' has no preStop hook asking the training to save"
        in user_log.text
    )
    assert "within torchrun's 30 s" in user_log.text


def test_a_runtime_with_the_stop_hook_but_the_default_grace_period_is_named_too(kube, user_log):
    runtime = yaml.safe_load((REPO / "runtimes" / "torchtune-cpu.yaml").read_text())
    runtime["metadata"]["name"] = "short-grace"
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    del pod["terminationGracePeriodSeconds"]
    kube.add_object(runtime)
    job = manifest()
    job["spec"]["runtimeRef"]["name"] = "short-grace"
    assert launcher(kube, job).run().status == "Complete"
    assert "'short-grace' has a grace period of 30 s for its preStop hook" in user_log.text


@pytest.mark.parametrize("cleanup, deleted", [("on-success", True), ("always", True), ("never", False)])
@pytest.mark.slow
def test_runtime_that_restarts_the_trainer_fails_at_the_first_crash_naming_the_fix(
    kube, user_log, cleanup, deleted
):
    """A user's runtime without the fail-fast policy (like the upstream ones): the container restarts in place
    (10s back-off, then again up to 7 times). The launcher stops at the first crash instead of waiting it out,
    and deletes the TrainJob unless the policy is `never`: kept, it would train again, unobserved."""
    kube.add_runtime("users-runtime")
    lines = ["Step 1 | loss:2.0", "RuntimeError: CUDA error"]
    kube.scenario(None, Scenario.failure(exit_code=3, log_lines=lines, restart_backoff_scale=1.0))
    job = manifest()
    job["spec"]["runtimeRef"]["name"] = "users-runtime"
    with pytest.raises(TrainJobFailed) as raised:
        launcher(kube, job, cleanup=cleanup, timeout=30).run()  # the crash loop alone would take 10 minutes
    text = str(raised.value)
    assert f"TrainJob team-a/{NAME} failed: TrainerRestarting: the trainer crashed" in text
    assert "ClusterTrainingRuntime 'users-runtime' does not fail fast" in text
    assert "`restartPolicy: Never`" in text and "`backoffLimit: 0`" in text
    assert "(rank 0): Error (exit code 3)" in text and text.rstrip().endswith("RuntimeError: CUDA error")
    assert raised.value.result.status == "Failed" and raised.value.result.reason == "TrainerRestarting"
    assert (kube.trainjob(NAME) is None) == deleted
    if not deleted:
        assert f"`kubectl delete trainjob -n team-a {NAME}` frees its nodes now" in user_log.text
        (pod,) = kube.pods(NAME)
        assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    # the log of the crash-looping container was read once, not re-followed in a loop
    assert len([r for r in kube.requests_for("GET", "pods") if r.subresource == "log"]) == 1


@pytest.mark.parametrize("cleanup, deleted", [("on-success", True), ("always", True), ("never", False)])
def test_nan_loss_fails_at_once_with_the_step_and_the_fixes(kube, user_log, cleanup, deleted):
    """The loss turns to nan at step 3 of 400 (20s of log): the step fails there. The TrainJob still runs, so
    unless the policy is `never` it is deleted (kept, it would only hold its GPUs)."""
    lines = [
        "Step 1 | loss:2.30 lr:0.1",
        "Step 2 | loss:5.7e+12 lr:0.1",
        *(f"Step {i} | loss:nan" for i in range(3, 401)),
    ]
    kube.scenario(None, Scenario.success(lines, line_interval=0.05))
    with pytest.raises(TrainJobDiverged) as raised:
        launcher(kube, cleanup=cleanup, total_steps=400).run()

    message = str(raised.value)
    assert "\n" not in message, "one line: the log lines were already shown in the step log"
    assert message.startswith(
        f"loss diverged at step 3 (loss=nan) in TrainJob team-a/{NAME}: training stopped;"
    )
    assert "tune_learning_rate" in message and "dtype bf16" in message and '"clip_grad_norm": 1.0' in message
    assert raised.value.step == 3 and math.isnan(raised.value.loss)
    result = raised.value.result
    assert result.status == "Failed" and result.reason == "LossDiverged"
    assert result.deleted == deleted and (kube.trainjob(NAME) is None) == deleted
    if not deleted:  # kept as the policy says, still running: not waited for
        assert not kube.trainjob(NAME)["status"].get("conditions")
        assert f"`kubectl delete trainjob -n team-a {NAME}` frees its nodes now" in user_log.text
    assert max(s.step for s in result.steps) < 400
    assert f"loss diverged at step 3 (loss=nan) in TrainJob team-a/{NAME}" in user_log.text


@pytest.mark.slow
def test_nan_loss_of_a_trainjob_that_completed_still_fails(kube):
    """Attached after the end, the log read only after the Complete condition was seen (its first reads get 503s):
    the shown log decides, not the condition."""
    kube.add_object(manifest(), scenario=Scenario.success(["Step 1 | loss:2.0", "Step 2 | loss:-inf"]))
    kube.wait_for_trainjob(NAME, condition="Complete")
    kube.fail_next(30, status=503, method="GET", path_contains="/log")
    with pytest.raises(TrainJobDiverged, match=r"^loss diverged at step 2 \(loss=-inf\)"):
        launcher(kube).run()


def test_failure_shows_only_the_last_50_lines(kube):
    kube.scenario(None, Scenario.failure(log_lines=[f"out {i}" for i in range(80)], line_interval=0.001))
    with pytest.raises(TrainJobFailed) as raised:
        launcher(kube).run()
    text = str(raised.value)
    assert "Last 50 log lines" in text and "out 30\n" in text and "out 79" in text and "out 29\n" not in text


def test_failing_other_rank_is_reported(kube):
    """Rank 1 fails; the Job controller deletes the failed Job's other pods (rank 0 is stopped, not kept)."""
    job = manifest(num_nodes=2)
    kube.scenario(None, Scenario.failure(failed_rank=1, exit_code=3))
    with pytest.raises(TrainJobFailed) as raised:
        launcher(kube, job).run()
    assert "(rank 1): Error (exit code 3)" in str(raised.value)
    (kept,) = kube.pods(NAME)
    assert kept["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1"


# --- pending, timeout, suspension ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "scenario, expected",
    [
        (
            Scenario.stuck_pending(),
            ["FailedScheduling: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu"],
        ),
        (
            Scenario.stuck_pending(unschedulable=False, image_pull_backoff=True),
            ["waiting: ImagePullBackOff Back-off pulling image", "BackOff: Back-off pulling image"],
        ),
    ],
)
@pytest.mark.slow
def test_stuck_pending_logs_why_then_times_out_and_deletes(kube, user_log, scenario, expected):
    kube.scenario(None, scenario)
    with pytest.raises(TrainJobTimeout, match=r"did not finish within 0\.8s \(deleted\)"):
        launcher(kube, timeout=0.8, pending_warning_after=0.2).run()
    text = user_log.text
    assert "node pods still Pending after" in text
    for snippet in expected:
        assert snippet in text
    reason = expected[-1].split(":")[0].split()[-1]
    assert text.count(f"{reason}:") == 1  # each event shown once, though reported at every threshold
    assert kube.trainjob(NAME) is None
    assert kube.requests_for("DELETE", "trainjobs")[0].query.get("propagationPolicy") == "Background"
    assert kube.requests_for("GET", "events")


@pytest.mark.slow
def test_timeout_while_running_deletes_and_fails_with_the_last_lines(kube):
    kube.scenario(None, Scenario.success([f"Step {i} | loss:1.0" for i in range(1, 200)], line_interval=0.05))
    with pytest.raises(TrainJobTimeout) as raised:
        launcher(kube, timeout=0.6).run()
    assert "Step 1 | loss:1.0" in str(raised.value)
    assert kube.trainjob(NAME) is None


def test_quiet_streams_are_cut_when_run_returns(kube):
    """With a minute-long server-side watch timeout, no watch or log thread of the run outlives run()."""
    kube.scenario(None, Scenario.failure())
    with pytest.raises(TrainJobFailed):
        launcher(kube, watch_timeout=60, log_read_timeout=300).run()
    assert not launcher_threads()


@pytest.mark.slow
def test_suspended_trainjob_is_reported_and_waited_on(kube, user_log):
    job = manifest()
    job["spec"]["suspend"] = True
    with pytest.raises(TrainJobTimeout):
        launcher(kube, job, timeout=0.5).run()
    assert f"TrainJob {NAME} is suspended; waiting for it to be resumed" in user_log.text
    assert "Pending" not in user_log.text


# --- API trouble -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("abrupt", [False, True])
@pytest.mark.slow
def test_dropped_watches_are_reopened(kube, abrupt):
    kube.scenario(None, Scenario.success(line_interval=0.1))
    kube.drop_watch_after(0, times=2, abrupt=abrupt)  # each closes when its first event is due
    result = launcher(kube).run()
    assert result.status == "Complete" and len(result.log_lines) == 3
    assert len(watch_requests(kube, "trainjobs")) + len(watch_requests(kube, "pods")) >= 3  # reopened


@pytest.mark.parametrize("as_http_error", [False, True])
@pytest.mark.slow
def test_410_gone_relists(kube, user_log, as_http_error):
    kube.scenario(None, Scenario.success(line_interval=0.1))
    kube.drop_watch_after(
        0, times=2
    )  # end the first watches at once so the next ones carry a resourceVersion
    kube.expire_next_watch(times=2, as_http_error=as_http_error)
    result = launcher(kube).run()
    assert result.status == "Complete"
    assert "watch expired (410 Gone); re-listing" in user_log.text
    plain_lists = [
        r for r in kube.requests_for("GET") if r.resource in ("trainjobs", "pods") and "watch" not in r.query
    ]
    assert len(plain_lists) >= 3  # the first two lists + at least one re-list


@pytest.mark.slow
def test_watch_bookmarks_are_not_taken_for_objects(kube):
    """BOOKMARK events (no name, only a resourceVersion) reach both watches mid-run; the run goes on unharmed."""
    kube.scenario(None, Scenario.success(line_interval=0.1))

    def bookmark_once_both_watch() -> None:
        for resource in ("trainjobs", "pods"):
            kube.wait_for_request("GET", resource, where=lambda r: r.query.get("watch") == "True")
        kube.send_bookmarks()

    threading.Thread(target=bookmark_once_both_watch, daemon=True).start()
    result = launcher(kube).run()
    assert result.status == "Complete" and len(result.log_lines) == 3
    opened = watch_requests(kube, "trainjobs") + watch_requests(kube, "pods")
    assert opened and all(r.query.get("allowWatchBookmarks") == "True" for r in opened)


@pytest.mark.slow
def test_5xx_and_429_bursts_are_retried_with_backoff(kube, user_log):
    sleeps = Sleeps()
    kube.fail_next(3, status=503, method="POST", path_contains="/trainjobs")
    # No Retry-After header: urllib3 itself would retry a 429 that carries one.
    kube.fail_next(2, status=429, method="GET", path_contains="/trainjobs")
    result = launcher(kube, sleeps=sleeps).run()
    assert result.status == "Complete"
    posts = kube.requests_for("POST", "trainjobs")
    assert [r.status for r in posts] == [503, 503, 503, 201]
    assert len(sleeps) >= 5
    assert sleeps[1] > sleeps[0] * 1.5  # exponential
    assert "Kubernetes API 503; retrying" in user_log.text and "Kubernetes API 429; retrying" in user_log.text


def test_non_retryable_create_error_is_clear(kube):
    job = manifest()
    job["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "2"}]  # bypassing the builder's check
    with pytest.raises(
        TrainJobError, match=r"creating TrainJob team-a/.* failed: .*must not have reserved envs"
    ):
        launcher(kube, job).run()


def test_missing_runtime_is_reported_before_creating(kube):
    job = manifest()
    job["spec"]["runtimeRef"]["name"] = "nope"
    with pytest.raises(
        TrainJobError, match=r"ClusterTrainingRuntime 'nope' not found: .*kubectl apply -k runtimes/"
    ):
        launcher(kube, job).run()
    assert not kube.requests_for("POST", "trainjobs")


def test_trainjob_deleted_by_someone_else(kube):
    kube.scenario(None, Scenario.success([f"l{i}" for i in range(100)], line_interval=0.05))
    run = launcher(kube)
    import threading

    def delete_once_watched() -> None:
        # The launcher lists before it watches: once its watch is open, it has seen the TrainJob.
        kube.wait_for_request("GET", "trainjobs", where=lambda r: r.query.get("watch", "").lower() == "true")
        from kubernetes import client

        client.CustomObjectsApi(kube.api_client()).delete_namespaced_custom_object(
            tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, NAME
        )

    threading.Thread(target=delete_once_watched, daemon=True).start()
    with pytest.raises(TrainJobError, match="was deleted by someone else"):
        run.run()


# --- idempotency ----------------------------------------------------------------------------------------------------


def test_existing_trainjob_of_this_run_is_attached_not_recreated(kube, user_log):
    kube.add_object(manifest(), scenario=Scenario.success(["Step 1 | loss:1.5"], pending_seconds=0.2))
    result = launcher(kube).run()
    assert result.status == "Complete" and not result.created
    assert result.log_lines == ["Step 1 | loss:1.5"]
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [409]
    assert "already exists for this run and task: attaching" in user_log.text


@pytest.mark.slow
def test_second_launcher_for_the_same_task_attaches(kube):
    kube.scenario(None, Scenario.success(line_interval=0.1))
    first = launcher(kube, cleanup="never")
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("first", first.run()))
    thread.start()
    # The first POST's answer, not the stored object: the object is stored before its 201 is logged.
    assert kube.wait_for_request("POST", "trainjobs").status == 201
    second = launcher(kube, cleanup="never").run()
    thread.join(60)  # returns when the first launcher is done; generous for loaded CI machines
    assert outcome["first"].created and not second.created
    assert len(kube.trainjobs()) == 1
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [201, 409]


@pytest.mark.slow
def test_failed_trainjob_of_this_run_is_replaced_on_retry(kube, user_log):
    old = manifest()
    kube.add_object(old, scenario=Scenario.failure(pending_seconds=0.0, log_lines=[]))
    kube.wait_for_trainjob(NAME, condition="Failed")
    kube.scenario(NAME, Scenario.success())
    result = launcher(kube).run()
    assert result.status == "Complete" and result.created
    assert [r.status for r in kube.requests_for("POST", "trainjobs")] == [409, 201]
    assert "failed before: replacing it" in user_log.text


def test_foreign_trainjob_with_the_same_name_is_left_alone(kube):
    foreign = manifest(run_id="someone-else")
    foreign["metadata"]["name"] = NAME
    kube.add_object(foreign)
    with pytest.raises(
        TrainJobConflict, match=r"already exists and does not belong to this pipeline run/task"
    ):
        launcher(kube).run()
    assert kube.trainjob(NAME) is not None
    assert not kube.requests_for("DELETE", "trainjobs")


# --- cleanup policies -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, outcome, deleted",
    [
        ("on-success", "succeed", True),
        ("on-success", "fail", False),
        ("always", "succeed", True),
        ("always", "fail", True),
        ("never", "succeed", False),
        ("never", "fail", False),
    ],
)
def test_cleanup_policy(kube, policy, outcome, deleted):
    kube.scenario(None, Scenario(outcome=outcome))
    if outcome == "fail":
        with pytest.raises(TrainJobFailed) as raised:
            launcher(kube, cleanup=policy).run()
        assert raised.value.result.deleted is deleted
    else:
        assert launcher(kube, cleanup=policy).run().deleted is deleted
    assert (kube.trainjob(NAME) is None) is deleted


def test_unknown_cleanup_policy_is_refused(kube):
    with pytest.raises(ValueError, match="tune_cleanup_policy must be one of"):
        launcher(kube, cleanup="sometimes")


# --- signals ----------------------------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from kfp_finetune.components._shared.kube.client import load_api_client
    from kfp_finetune.components.torchtune_finetune.backends.trainjob import launch_trainjob
    import json
    manifest = json.loads(sys.argv[2])
    launch_trainjob(manifest, load_api_client(sys.argv[1]), namespace="team-a", tick=0.05, watch_timeout=2)
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_signal_during_a_running_job_deletes_it_and_exits_nonzero(kube, signum):
    import json

    kube.scenario(None, Scenario.success([f"Step {i} | loss:1.0" for i in range(1, 500)], line_interval=0.05))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(kube.kubeconfig_path), json.dumps(manifest())],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        for line in child.stderr:  # wait until training output reaches the step log
            if "[node-0] Step 2" in line:
                break
        child.send_signal(signum)
        rest = child.stderr.read()
        code = child.wait(20)
    finally:
        if child.poll() is None:
            child.kill()
    name = signal.Signals(signum).name
    assert code != 0
    assert f"received {name}: deleting TrainJob {NAME}" in rest
    assert f"cancelled by {name}: TrainJob team-a/{NAME} deleted" in rest
    assert kube.trainjob(NAME) is None
    (delete,) = kube.requests_for("DELETE", "trainjobs")
    assert delete.query.get("propagationPolicy") == "Background"


# --- execute mode: a real torchtune run through the TrainJob -------------------------------------------------------


@pytest.mark.slow
def test_real_torchtune_lora_run_through_a_trainjob(kube, tiny_llama, tiny_dataset, tmp_path):
    """TrainJob → node command run for real → streamed logs with step metrics → Complete → outputs in the workspace."""
    import shutil

    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command

    workspace = tmp_path / "workspace"
    model_dir = shutil.copytree(tiny_llama, workspace / "models" / "tiny")
    (workspace / "datasets").mkdir()
    data = shutil.copy(tiny_dataset["train.jsonl"], workspace / "datasets" / "train.jsonl")
    config = TorchtuneConfig(
        device="cpu", batch_size=2, gradient_accumulation_steps=1, max_steps_per_epoch=3, seed=0
    )
    run = resolve_run(config, model_dir, str(data), workspace / "runs" / NAME)
    assert not run.distributed
    # The workspace PVC is mounted in the node pods at the path the resolved YAML uses.
    volume, mount = tj.workspace_volume("run-kfp-workspace", str(workspace))
    job = tj.build_trainjob(
        NAME,
        tune_command(run.recipe, run.yaml_path),
        runtime="torchtune-cpu",
        pod=tj.NodePodSettings(volumes=[volume], volume_mounts=[mount]),
        run_id=RUN_ID,
        task_name=TASK,
    )
    kube.execute(
        {"run-kfp-workspace": workspace},
        extra_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    result = launcher(kube, job, log_drain_timeout=10, total_steps=3).run()
    assert result.status == "Complete"
    assert [s.step for s in result.steps] == [1, 2, 3]
    assert all(s.loss is not None for s in result.steps)
    assert (run.run_dir / "epoch_0" / "adapter_model.safetensors").is_file()


# --- kube client loading and retries (components/_shared/kube/client.py) ------------------------------------------------


def test_in_cluster_service_account_comes_first(tmp_path, monkeypatch, kube):
    from kfp_finetune.components._shared.kube.client import current_namespace, load_api_client

    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("pod-token")
    (account / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (account / "namespace").write_text("kubeflow-user\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    api = load_api_client(service_account_dir=account)
    assert api.configuration.host == "https://10.0.0.1:443"
    assert api.configuration.api_key["authorization"].lower() == "bearer pod-token"
    assert current_namespace("explicit", service_account_dir=account) == "kubeflow-user"
    # An explicit kubeconfig wins over the pod's identity.
    assert load_api_client(kube.kubeconfig_path, service_account_dir=account).configuration.host == kube.url
    assert current_namespace(kubeconfig=kube.kubeconfig_path, service_account_dir=account) == "team-a"


def test_namespace_falls_back_to_kubeconfig_then_explicit(tmp_path, monkeypatch, kube):
    from kfp_finetune.components._shared.kube.client import current_namespace, load_api_client

    no_account = tmp_path / "none"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    assert load_api_client(service_account_dir=no_account).configuration.host == kube.url
    assert current_namespace("explicit", service_account_dir=no_account) == "team-a"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert current_namespace("explicit", service_account_dir=no_account) == "explicit"
    with pytest.raises(RuntimeError, match="cannot tell which Kubernetes namespace"):
        current_namespace(service_account_dir=no_account)


def test_call_with_retry_retries_only_transient_errors():
    from kubernetes.client.exceptions import ApiException

    from kfp_finetune.components._shared.kube.client import call_with_retry

    sleeps = Sleeps()
    outcomes = [ApiException(status=503), ApiException(status=429), "ok"]

    def flaky():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert call_with_retry(flaky, backoff=Backoff(initial=1, factor=2, jitter=0, sleep=sleeps)) == "ok"
    assert sleeps == [1, 2]

    def forbidden():
        raise ApiException(status=403)

    with pytest.raises(ApiException) as raised:
        call_with_retry(forbidden, backoff=Backoff(sleep=sleeps))
    assert raised.value.status == 403 and len(sleeps) == 2

    def down():
        raise ApiException(status=500)

    with pytest.raises(ApiException):
        call_with_retry(down, backoff=Backoff(initial=1, maximum=3, attempts=4, jitter=0, sleep=sleeps))
    assert sleeps[2:] == [1, 2, 3]
