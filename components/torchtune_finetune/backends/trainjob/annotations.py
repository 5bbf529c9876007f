"""The TrainJob's progress annotations: kept current by the launcher from the rank-0 log's step lines, so that
`kubectl get trainjob -o custom-columns=...` (docs/cluster-install.md) and `kubectl describe trainjob` show how far
training is without the KFP UI. A JSON merge patch of metadata.annotations; never a reason to stop following.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.progress import Progress

#: How often the annotations may change (every patch is an API write and a watch event for the Trainer).
ANNOTATE_EVERY_SECONDS = 60.0


class ProgressAnnotations:
    """Called with each step's progress (from the log thread): patches the TrainJob at most every
    ANNOTATE_EVERY_SECONDS, and at the last step. Without RBAC for the patch it says so once and stops trying."""

    def __init__(
        self, custom: Any, namespace: str, name: str, *, log: Any, clock: Callable[[], float] = time.monotonic
    ):
        self.custom, self.namespace, self.name, self.log = custom, namespace, name, log
        self._clock = clock
        self._last: float | None = None
        self._off = False
        self._lock = threading.Lock()

    def __call__(self, progress: Progress) -> None:
        now = self._clock()
        final = bool(progress.total_steps) and progress.step >= progress.total_steps
        with self._lock:
            if self._off or (
                not final and self._last is not None and now - self._last < ANNOTATE_EVERY_SECONDS
            ):
                return
            self._last = now
        patch = {"metadata": {"annotations": progress.annotations()}}
        try:
            self.custom.patch_namespaced_custom_object(
                tj.GROUP, tj.VERSION, self.namespace, tj.PLURAL, self.name, patch
            )
        except Exception as error:  # noqa: BLE001 - progress must never stop the step
            status = getattr(error, "status", None)
            if status == 404:
                return  # deleted under us: the launcher reports why
            self._off = status == 403
            self.log.warning(
                "progress not written to TrainJob %s/%s (%s)%s",
                self.namespace,
                self.name,
                f"HTTP {status}" if status else type(error).__name__,
                ": patch on trainjobs is not granted (runtimes/rbac.yaml); the step log still shows it"
                if self._off
                else "",
            )
