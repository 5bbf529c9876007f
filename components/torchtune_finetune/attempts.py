"""Which failures the fine-tune step's KFP retry may train again: infrastructure only.

KFP retries a task whatever made it fail (`set_retry` takes no condition), so the step sorts its own failures and
writes the verdict into its run folder (`attempts.json`, the run folder being the same for every attempt of a
task). An attempt that starts within `AUTOMATIC_RETRY_WINDOW` of a failure that was not the infrastructure's fails
at once with that failure's message, before anything is read or launched: a crash, a bad setting, a diverged or
unchanged model, a full GPU fail once however many retries the task has.

Infrastructure (trained again, from the newest checkpoint): the step's own pod stopped by a signal (eviction,
preemption, node drain); a TrainJob whose node pods were disrupted (DisruptionTarget: preemption, eviction, node
loss) or stopped for a pod's stop after saving a checkpoint (exit 143, or 75 on the nodes that stopped with
another node's pod: _shared/stop_exit.py), or on several nodes that failed soon after one of them was lost (its
message names the lost pod: disruptions.py); the Kubernetes API unreachable. A step pod
killed outright (node loss) records nothing, and its retry trains again.

A failure older than the window is not held against a new attempt: that is a person retrying the run, after
fixing what failed. A setting refused before anything is downloaded or launched is not recorded at all: its
retry refuses it again, in seconds.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kfp_finetune.components._shared.cancel import Interrupted
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.stop_exit import OTHER_POD_STOPPING, OWN_POD_STOPPING

ATTEMPTS_FILE = "attempts.json"
INFRASTRUCTURE = "infrastructure"
FAILED = "failed"
#: Longer than the pipelines' whole retry back-off (pipelines/settings.py: 3 retries, 1 + 2 + 4 minutes apart).
AUTOMATIC_RETRY_WINDOW = 15 * 60.0
#: The exit codes of a trainer that saved its checkpoint and stopped for a pod's stop (_shared/stop_exit.py). 137 is
#: not here: it is also how an out-of-memory kill ends, which a retry repeats.
_STOP_EXITS = (OWN_POD_STOPPING, OTHER_POD_STOPPING)
_DISRUPTED = ("DisruptionTarget", "disrupted", "preempted", "evicted", "node was lost")


class RetryRefused(ConfigError):
    """An automatic retry after a failure that training again cannot fix."""


@dataclass(frozen=True)
class Attempt:
    outcome: str  # INFRASTRUCTURE or FAILED
    message: str
    ended_at: float


def classify(error: BaseException) -> str:
    """INFRASTRUCTURE for what a retry can get past (see the module docstring), else FAILED."""
    from kfp_finetune.components.torchtune_finetune.backends.local import TrainingFailed
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import TrainJobFailed

    if isinstance(error, Interrupted):
        return INFRASTRUCTURE
    if isinstance(error, TrainingFailed):
        return INFRASTRUCTURE if error.returncode in _STOP_EXITS or (error.returncode or 0) < 0 else FAILED
    if isinstance(error, TrainJobFailed):
        text = f"{error.result.reason} {error.result.message} {error}"
        stopped = any(f"exit code {code}" in text for code in _STOP_EXITS)
        return INFRASTRUCTURE if any(word in text for word in _DISRUPTED) or stopped else FAILED
    if isinstance(error, ConfigError):
        return FAILED
    if _api_unreachable(error):
        return INFRASTRUCTURE
    return FAILED


def _api_unreachable(error: BaseException) -> bool:
    try:
        from urllib3.exceptions import HTTPError
    except ImportError:  # pragma: no cover - urllib3 comes with the kubernetes client
        return False
    return isinstance(error, (HTTPError, ConnectionError, TimeoutError))


def record(run_dir: Path, error: BaseException) -> Attempt:
    """Write this attempt's failure, sorted, into the run folder; return it."""
    attempt = Attempt(
        classify(error), str(error).splitlines()[0] if str(error) else type(error).__name__, time.time()
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    scratch = run_dir / f".{ATTEMPTS_FILE}.tmp"
    scratch.write_text(json.dumps(asdict(attempt)))
    os.replace(scratch, run_dir / ATTEMPTS_FILE)
    return attempt


def read(run_dir: Path) -> Attempt | None:
    """The previous attempt's failure, if one was recorded."""
    try:
        return Attempt(**json.loads((run_dir / ATTEMPTS_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def check_retry(run_dir: Path, *, now: float | None = None) -> None:
    """Raise RetryRefused when the previous attempt failed, not for the infrastructure, moments ago."""
    attempt = read(run_dir)
    if attempt is None:
        return
    age = (time.time() if now is None else now) - attempt.ended_at
    if attempt.outcome == FAILED and 0 <= age < AUTOMATIC_RETRY_WINDOW:
        raise RetryRefused(
            f"not trained again: the previous attempt of this step failed {int(age)}s ago for a reason a retry "
            f"cannot fix (only preemption, eviction and node loss are retried): {attempt.message}"
        )
    (run_dir / ATTEMPTS_FILE).unlink(missing_ok=True)
