"""Node pods that are never created (the API server rejects them; the Trainer cannot create the JobSet) leave only
Warning events and no TrainJob condition: the launcher reads them and fails within its grace, not after the
timeout, naming the cause; the TrainJob is deleted after its events are in the step log."""

from __future__ import annotations

import pytest

from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobFailed, TrainJobTimeout
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube
user_log = base.user_log
INVALID = (
    'spec.containers[0].resources.requests[memory]: Invalid value: "32Gi": must be less than or equal to memory '
    "limit of 16Gi"
)


def asking_more_than_the_runtime_allows(kube) -> dict:
    """A runtime limiting memory to 16Gi and a TrainJob requesting 32Gi per node: the merged pod is invalid."""
    kube.add_runtime("limited", resources={"limits": {"memory": "16Gi"}})
    job = base.manifest()
    job["spec"]["runtimeRef"]["name"] = "limited"
    job["spec"]["trainer"]["resourcesPerNode"] = {"requests": {"memory": "32Gi"}}
    return job


def test_pods_the_api_server_rejects_fail_the_step_with_its_reason(kube, user_log):
    job = asking_more_than_the_runtime_allows(kube)
    with pytest.raises(TrainJobFailed) as raised:
        base.launcher(kube, job, start_failure_grace=0, event_poll_interval=0.05, timeout=20).run()
    message = str(raised.value)
    assert f"failed: PodCreationFailed: node pods of TrainJob team-a/{NAME} cannot start" in message
    assert f"Job {NAME}-node-0: its pods cannot be created (FailedCreate: Error creating: Pod " in message
    assert f"is invalid: {INVALID}). Fix:" in message and "requests above the runtime's limits" in message
    assert raised.value.result.deleted and kube.trainjob(NAME) is None
    text = user_log.text
    assert (
        -1
        < text.index(f"event Job {NAME}-node-0: FailedCreate: Error creating")
        < text.index(f"deleted TrainJob {NAME}")
    )


def test_a_jobset_the_trainer_cannot_create_fails_the_step_with_its_event(kube):
    kube.scenario(
        None, Scenario(resources_creation_error='admission webhook "vjobset.kb.io" denied the request')
    )
    with pytest.raises(TrainJobFailed) as raised:
        base.launcher(kube, start_failure_grace=0, event_poll_interval=0.05, timeout=20).run()
    message = str(raised.value)
    assert "failed: ResourcesCreationFailed:" in message
    assert (
        f"TrainJob {NAME}: the Trainer cannot create its JobSet (TrainJobResourcesCreationFailed: TrainJob resources "
        'reconciliation failed: admission webhook "vjobset.kb.io" denied the request)' in message
    )
    assert kube.trainjob(NAME) is None


@pytest.mark.slow
def test_a_creation_failure_is_given_the_start_failure_grace(kube):
    job = asking_more_than_the_runtime_allows(kube)
    with pytest.raises(TrainJobTimeout):
        base.launcher(kube, job, start_failure_grace=600, event_poll_interval=0.05, timeout=0.5).run()


@pytest.mark.slow
def test_events_of_an_earlier_trainjob_of_the_same_name_are_ignored(kube):
    """A suspended TrainJob (queued) has no pods for a long time; the FailedCreate event left by an earlier
    TrainJob of its name must not fail it."""
    kube.add_object(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{NAME}-node-0.old"},
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": f"{NAME}-node-0"},
            "reason": "FailedCreate",
            "message": 'Error creating: pods "x" is forbidden: exceeded quota',
            "type": "Warning",
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-01T00:00:00Z",
        }
    )
    job = base.manifest()
    job["spec"]["suspend"] = True
    with pytest.raises(TrainJobTimeout):
        base.launcher(kube, job, start_failure_grace=0, event_poll_interval=0.05, timeout=0.5).run()
