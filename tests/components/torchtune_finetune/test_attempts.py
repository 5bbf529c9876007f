"""The fine-tune's KFP retry trains again only after an infrastructure failure (attempts.py): a crash or a bad
setting fails the automatic retries at once; preemption, eviction and node loss are trained again."""

import signal

import pytest

from kfp_finetune.components._shared.cancel import Interrupted
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.torchtune_finetune import attempts
from kfp_finetune.components.torchtune_finetune.backends.local import TrainingFailed
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import TrainJobFailed
from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import TrainJobResult
from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged


def _failed_trainjob(reason, message):
    result = TrainJobResult(
        name="j", namespace="ns", status="Failed", created=True, reason=reason, message=message
    )
    return TrainJobFailed(f"TrainJob ns/j failed: {reason}: {message}", result)


@pytest.mark.parametrize(
    ("error", "outcome"),
    [
        (Interrupted(signal.SIGTERM), attempts.INFRASTRUCTURE),  # the step's pod evicted or preempted
        (TrainingFailed("stopped", 143, []), attempts.INFRASTRUCTURE),  # trainer saved on SIGTERM, exited 143
        (TrainingFailed("killed", -9, []), attempts.INFRASTRUCTURE),
        (
            _failed_trainjob(
                "PodFailurePolicy", "pod j-node-0-1 (rank 1): disrupted (DeletionByPodGC: node lost)"
            ),
            attempts.INFRASTRUCTURE,
        ),  # fmt: skip
        (
            _failed_trainjob("PodFailurePolicy", "pod j-node-0-0 (rank 0): Error (exit code 75)"),
            attempts.INFRASTRUCTURE,
        ),  # stopped with another node's pod (_shared/stop_exit.py), under a runtime that does not replace it
        (ConnectionError("connection refused"), attempts.INFRASTRUCTURE),  # the API server unreachable
        (TrainingFailed("Traceback ... exit code 1", 1, []), attempts.FAILED),  # a crash
        (_failed_trainjob("PodFailurePolicy", "node-0: OOMKilled (exit code 137)"), attempts.FAILED),
        (ConfigError("tune_lora_rank must be at least 1"), attempts.FAILED),
        (LossDiverged(3, float("nan")), attempts.FAILED),
        (RuntimeError("something else"), attempts.FAILED),
    ],
)
def test_failures_are_sorted(error, outcome):
    assert attempts.classify(error) == outcome


def test_an_automatic_retry_after_a_crash_fails_at_once_naming_the_crash(tmp_path):
    attempts.record(tmp_path, TrainingFailed("training failed (exit code 1): CUDA error", 1, []))
    ended = attempts.read(tmp_path).ended_at
    with pytest.raises(attempts.RetryRefused, match="exit code 1.*CUDA error|CUDA error"):
        attempts.check_retry(tmp_path, now=ended + 60)
    # Every automatic retry within the window is refused the same way (the record stays).
    with pytest.raises(attempts.RetryRefused):
        attempts.check_retry(tmp_path, now=ended + attempts.AUTOMATIC_RETRY_WINDOW - 1)


def test_a_retry_after_preemption_trains_again(tmp_path):
    attempts.record(tmp_path, Interrupted(signal.SIGTERM))
    attempts.check_retry(tmp_path, now=attempts.read(tmp_path).ended_at + 60)  # no error
    assert attempts.read(tmp_path) is None  # consumed: the new attempt's own outcome will be recorded


def test_a_person_retrying_later_after_a_fix_trains_again(tmp_path):
    attempts.record(tmp_path, ConfigError("Secret hf-token not found"))
    attempts.check_retry(tmp_path, now=attempts.read(tmp_path).ended_at + attempts.AUTOMATIC_RETRY_WINDOW + 1)


def test_the_pipelines_retry_the_fine_tune_within_the_window():
    from pipelines import settings

    backoff, factor, longest = settings.TRAIN_RETRY_BACKOFF
    seconds = [min(60 * factor**n, 240) for n in range(settings.TRAIN_RETRIES)]
    assert backoff == "60s" and longest == "4m"
    assert sum(seconds) < attempts.AUTOMATIC_RETRY_WINDOW
