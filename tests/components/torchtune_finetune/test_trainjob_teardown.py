"""No TrainJob outlives its step, and the step says truthfully whether it deleted one: DELETEs that fail are
retried and reported, writes whose answer is lost (committed, then a 5xx) are recognised for what they did."""

from __future__ import annotations

import os
import re
import signal
import threading

import pytest

from kfp_finetune.components.torchtune_finetune.backends.trainjob import (
    TrainJobCancelled,
    TrainJobFailed,
    TrainJobTimeout,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube
user_log = base.user_log
UNAVAILABLE = "the server is currently unable to handle the request"


def delete_by_hand(kube) -> None:
    """What the user does after being told the TrainJob may still run (the fixture checks nothing runs on)."""
    from kubernetes import client

    kube.clear_faults()

    client.CustomObjectsApi(kube.api_client()).delete_namespaced_custom_object(
        tj.GROUP, tj.VERSION, "team-a", tj.PLURAL, NAME
    )


def statuses(kube, method: str) -> list[int]:
    return [r.status for r in kube.requests_for(method, "trainjobs")]


def test_a_create_whose_answer_is_lost_attaches_instead_of_training_twice(kube, user_log):
    """The create is committed but answered 504: the retry meets 409 and attaches to the TrainJob it created."""
    kube.fail_next(1, status=504, method="POST", path_contains="/trainjobs", committed=True)
    result = base.launcher(kube).run()
    assert result.status == "Complete" and result.deleted
    assert statuses(kube, "POST") == [504, 409]
    assert "already exists for this run and task: attaching to it" in user_log.text


def test_a_delete_whose_answer_is_lost_is_reported_as_gone(kube, user_log):
    kube.fail_next(1, status=504, method="DELETE", committed=True)
    result = base.launcher(kube).run()
    assert result.status == "Complete" and result.deleted
    assert statuses(kube, "DELETE") == [504, 404]
    assert (
        f"TrainJob {NAME} is gone (cleanup policy 'on-success'): an earlier DELETE went through"
        in user_log.text
    )
    assert kube.trainjob(NAME) is None


@pytest.mark.slow
def test_a_failing_delete_is_retried_then_reported_and_never_called_deleted(kube, user_log):
    """Timeout on a job that never starts; every DELETE answers 503: retried with back-off for
    `delete_retry_seconds`, then the final line says the TrainJob may still run and how to delete it."""
    kube.scenario(None, Scenario.stuck_pending())
    kube.fail_next(10_000, status=503, method="DELETE")
    sleeps = base.Sleeps()
    run = base.launcher(kube, sleeps=sleeps, timeout=0.3, unschedulable_grace=600, delete_retry_seconds=0.2)
    with pytest.raises(TrainJobTimeout) as raised:
        run.run()
    message = str(raised.value)
    assert (
        f"did not finish within 0.3s (NOT deleted ({UNAVAILABLE}): it may still be running; "
        f"`kubectl delete trainjob -n team-a {NAME}` frees its nodes)" in message
    )
    assert "(deleted)" not in message and f"deleted TrainJob {NAME}" not in user_log.text
    attempts = statuses(kube, "DELETE")
    assert len(attempts) > 2 and set(attempts) == {503}
    assert (
        f"could not delete TrainJob {NAME} (timeout): {UNAVAILABLE}. It may still be running" in user_log.text
    )
    assert kube.trainjob(NAME) is not None
    delete_by_hand(kube)


def interrupt_when_training(kube) -> threading.Thread:
    """SIGTERM to this process once the rank-0 log is being followed (training runs)."""

    def send() -> None:
        kube.wait_for_request("GET", "pods", where=lambda r: r.subresource == "log" and r.status == 200)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    "committed, said",
    [
        (
            False,
            f"NOT deleted ({UNAVAILABLE}): it may still be running; `kubectl delete trainjob -n team-a {NAME}`",
        ),
        (True, "gone"),
    ],
    ids=["delete-fails", "delete-answer-lost"],
)
@pytest.mark.slow
def test_a_cancelled_step_says_deleted_only_when_the_api_did(kube, user_log, committed, said):
    kube.scenario(None, Scenario.success([f"Step {i} | loss:1.0" for i in range(1, 500)], line_interval=0.05))
    kube.fail_next(
        1 if committed else 10_000, status=504 if committed else 503, method="DELETE", committed=committed
    )
    run = base.launcher(kube, handle_signals=True, delete_retry_seconds=0.2)
    sender = interrupt_when_training(kube)
    with pytest.raises(TrainJobCancelled) as raised:
        run.run()
    sender.join()
    message = str(raised.value)
    assert message.startswith(f"cancelled by SIGTERM: TrainJob team-a/{NAME} {said}")
    assert not re.search(r"\bdeleted\b", message.replace("NOT deleted", ""))
    assert (kube.trainjob(NAME) is None) == committed
    if not committed:
        delete_by_hand(kube)


@pytest.mark.slow
def test_a_trainjob_that_cannot_start_and_cannot_be_deleted_says_so_in_the_error(kube, user_log):
    kube.scenario(None, Scenario.stuck_pending())
    kube.fail_next(10_000, status=503, method="DELETE")
    with pytest.raises(TrainJobFailed) as raised:
        base.launcher(kube, unschedulable_grace=0, timeout=20, delete_retry_seconds=0.1).run()
    message = str(raised.value)
    assert "failed: Unschedulable:" in message
    assert message.rstrip().endswith(
        f"TrainJob NOT deleted ({UNAVAILABLE}): it may still be running; `kubectl delete trainjob -n team-a "
        f"{NAME}` frees its nodes"
    )
    assert not raised.value.result.deleted
    delete_by_hand(kube)
