"""The node pod's preStop hook (_shared/stop_request.py) asks the container's training processes to stop and returns
only once each of them has exited; a container whose temp folder cannot be written trains on without it."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from kfp_finetune.components._shared.stop_request import HOOK_COMMAND, TrainingProcess

# A training process: holds the lock, says so, waits for the request, then "saves" (a marker) and exits 143.
TRAINING = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from kfp_finetune.components._shared.stop_request import TrainingProcess

    process = TrainingProcess()
    process.hold()
    print("held", flush=True)
    while not process.requested():
        time.sleep(0.01)
    Path(sys.argv[1]).write_text("saved")
    sys.exit(143)
    """
)


def container_env(tmp_path: Path) -> dict[str, str]:
    """The environment of one container: its own temp folder."""
    temp = tmp_path / "container-tmp"
    temp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(temp)}


def test_the_hook_asks_every_training_process_to_stop_and_returns_once_each_has_saved_and_exited(tmp_path):
    env = container_env(tmp_path)
    markers = [tmp_path / f"saved-{rank}" for rank in range(2)]
    training = [
        subprocess.Popen(
            [sys.executable, "-c", TRAINING, str(marker)], env=env, stdout=subprocess.PIPE, text=True
        )
        for marker in markers
    ]
    for process in training:
        assert process.stdout.readline() == "held\n"

    hook = subprocess.run(
        [sys.executable, *HOOK_COMMAND[1:]], env=env, capture_output=True, text=True, timeout=120
    )

    assert hook.returncode == 0, hook.stderr
    assert all(marker.read_text() == "saved" for marker in markers), (
        "the hook returned before the training saved"
    )
    assert [process.wait(timeout=60) for process in training] == [143, 143]
    assert "asked the training to save a checkpoint and exit" in hook.stdout
    assert "the training processes exited after" in hook.stdout


HOLDING = textwrap.dedent(
    """
    import sys
    from kfp_finetune.components._shared.stop_request import TrainingProcess

    TrainingProcess().hold()
    print("held", flush=True)
    sys.stdin.readline()  # until the test lets it exit
    """
)


def test_the_hooks_lock_is_granted_only_once_the_last_training_process_has_exited(tmp_path, monkeypatch):
    """What the hook's wait is: an exclusive flock on the lock every training process holds shared."""
    import fcntl

    from kfp_finetune.components._shared import stop_request

    env = container_env(tmp_path)
    training = [
        subprocess.Popen(
            [sys.executable, "-c", HOLDING], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )  # fmt: skip
        for _ in range(2)
    ]
    for process in training:
        assert process.stdout.readline() == "held\n"
    monkeypatch.setattr(tempfile, "tempdir", env["TMPDIR"])  # this test's process in the same container
    lock = os.open(stop_request.folder() / stop_request.LOCK, os.O_RDWR)

    def granted() -> bool:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(lock, fcntl.LOCK_UN)
        return True

    try:
        assert not granted()
        training[0].communicate("\n", timeout=60)
        assert not granted(), "one training process still runs"
        training[1].communicate("\n", timeout=60)
        assert granted()
    finally:
        os.close(lock)


def test_the_hook_returns_at_once_when_no_training_process_runs(tmp_path):
    hook = subprocess.run(
        [sys.executable, *HOOK_COMMAND[1:]],
        env=container_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert hook.returncode == 0, hook.stderr


def test_a_container_whose_temp_folder_cannot_be_written_trains_on_without_stop_requests(
    tmp_path, monkeypatch, caplog
):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_folder))  # what gettempdir() returns, unchecked
    process = TrainingProcess()
    process.hold()
    assert not process.requested()
    assert "only SIGTERM stops this run" in caplog.text


def test_a_request_from_before_the_training_process_began_is_an_earlier_containers_and_is_ignored(
    tmp_path, monkeypatch
):
    """A /tmp that outlives the container (a volume mounted there) keeps an earlier stop's request: a new training
    process must not stop at its first step for it."""
    from kfp_finetune.components._shared import stop_request

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stop_request.request()
    process = TrainingProcess()
    process.hold()
    assert not process.requested()
    stop_request.request()
    assert process.requested()


def test_an_earlier_containers_finishing_does_not_keep_the_hook_waiting_on_a_stuck_training(
    tmp_path, monkeypatch
):
    """An earlier container's training said "finishing" into a /tmp that outlived it: a new container's training
    that is stuck (it never acknowledges) must still be left to SIGTERM after the acknowledgement timeout, not hold
    the hook for the whole grace period."""
    from kfp_finetune.components._shared import stop_request

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stop_request._write(stop_request.ACKNOWLEDGED, "inf")  # the earlier container's, an hour ago
    acknowledged = stop_request.folder() / stop_request.ACKNOWLEDGED
    os.utime(acknowledged, (acknowledged.stat().st_atime - 3600, acknowledged.stat().st_mtime - 3600))
    TrainingProcess().hold()  # this container's, stuck from here on
    stop_request.request()
    waited, exited = stop_request.wait_for_training(ack_seconds=0.3)
    assert not exited and waited >= 0.3


# A training process in three manners: "never" sees requests (stuck), "acts" on one (acknowledges it) or is
# "finishing" (past training); the last two exit a second later, after the hook's acknowledgement timeout.
MANNERS = textwrap.dedent(
    """
    import sys, time
    from kfp_finetune.components._shared.stop_request import TrainingProcess

    process, manner = TrainingProcess(), sys.argv[1]
    process.hold()
    if manner == "finishing":
        process.finishing()
    print("held", flush=True)
    if manner == "never":
        time.sleep(600)
    while manner == "acts" and not process.requested():
        time.sleep(0.01)
    time.sleep(1.0)
    """
)


@pytest.mark.parametrize("manner", ["never", "acts", "finishing"])
def test_the_hook_leaves_a_training_that_never_acknowledges_to_sigterm_and_waits_for_one_that_does(
    tmp_path, monkeypatch, manner
):
    from kfp_finetune.components._shared import stop_request

    env = container_env(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", env["TMPDIR"])  # the hook's side, in the same container
    training = subprocess.Popen(
        [sys.executable, "-c", MANNERS, manner], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert training.stdout.readline() == "held\n"
        stop_request.request()
        waited, exited = stop_request.wait_for_training(ack_seconds=0.3)
        if manner == "never":
            assert not exited and training.poll() is None, "gave up on it, and left it running for SIGTERM"
        else:
            assert exited and waited > 0.3
            assert training.wait(timeout=60) == 0
    finally:
        training.kill()
        training.wait()
