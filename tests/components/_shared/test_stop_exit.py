"""A node pod's exit code from its torchrun workers' (_shared/stop_exit.py): the runtimes' podFailurePolicy replaces
a pod that exits 75 (it stopped only for another node's pod, tests/deploy/test_runtimes.py) and fails the TrainJob
on anything but that, a disruption or success."""

import signal

import pytest

from kfp_finetune.components._shared.stop_exit import node_exit_code, stop_exit_code


@pytest.mark.parametrize(
    ("workers", "pod"),
    [
        ([75], 75),
        ([75, 75], 75),
        ([75, 143], 143),  # a worker saw its own pod's request before the others: the pod is stopping
        ([143, -signal.SIGTERM], 143),  # torchrun SIGTERMs the rest once one exited
        ([-signal.SIGTERM], 143),
        ([75, 1], None),  # a crash beside a stop: torchrun's error stands
        ([-signal.SIGKILL], None),
        ([2], None),
        ([], None),
    ],
)
def test_the_pod_exits_as_its_stopped_workers_did_and_a_crash_stays_a_crash(workers, pod):
    assert node_exit_code(workers) == pod


def test_a_stop_for_the_own_pod_exits_as_sigterm_would_and_one_for_another_pod_75():
    assert (stop_exit_code(True), stop_exit_code(False)) == (128 + signal.SIGTERM, 75)


def test_the_workers_recorded_stops_count_only_when_every_worker_of_this_container_recorded_one(
    tmp_path, monkeypatch
):
    import os
    import tempfile
    import time

    from kfp_finetune.components._shared.stop_exit import record_stop, recorded_stop_codes
    from kfp_finetune.components._shared.stop_request import folder

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    started = time.time() - 1
    monkeypatch.setenv("LOCAL_RANK", "0")
    record_stop(75)
    assert recorded_stop_codes(started) == []  # local rank 1 said nothing (yet)
    monkeypatch.setenv("LOCAL_RANK", "1")
    record_stop(143)
    assert sorted(recorded_stop_codes(started)) == [75, 143]
    earlier = folder() / "stopped-1"  # an earlier container's, in a /tmp that outlived it
    os.utime(earlier, (started - 60, started - 60))
    assert recorded_stop_codes(started) == []
