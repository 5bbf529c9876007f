"""When following a TrainJob goes wrong: degrade, never delete the training.

A watch or log error that no retry mends (a 403 once a Role changed, a 400, an answer we cannot parse) used to end
the step and delete a healthy TrainJob. Now a watch says why and re-lists after a back-off (the timeout still
bounds the run), a log stream says why and stops (the TrainJob is still watched, `kubectl logs` shows its log),
and the end of a failed TrainJob is read from a fresh list of its pods rather than from a watch-fed view that can
lag its Failed condition.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff
from kfp_finetune.components._shared.kube.watch import Watch, raw_json
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import api_message
from kfp_finetune.components.torchtune_finetune.backends.trainjob.pod_logs import LABEL_COMPLETION_INDEX


def describe(error: BaseException) -> str:
    """An API error's status and message, else the exception's type and text."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(error, ApiException):
        return f"{error.status}: {api_message(error)}"
    return f"{type(error).__name__}: {error}"


def keep_watching(
    follow: Callable[[], None], watch: Watch, *, what: str, stop: threading.Event, backoff: Backoff, log: Any
) -> None:
    """Run `follow` (a loop over `watch`) until `stop`; after an error it cannot retry, say why and re-list."""
    delays = dataclasses.replace(backoff, attempts=1_000_000).delays()
    while not stop.is_set():
        try:
            follow()
            return
        except Exception as error:
            if stop.is_set():
                return
            delay = next(delays)
            log.warning(
                "watching %s failed (%s); re-listing in %.1fs (the TrainJob is left running)",
                what,
                describe(error),
                delay,
            )
            watch.resource_version = None
            stop.wait(delay)


def follow_log(
    follow: Callable[[], None], *, stop: threading.Event, log: Any, where: str, kubectl: str
) -> None:
    """Run `follow` (the rank-0 log); after an error it cannot retry, say why and stop following the log only."""
    try:
        follow()
    except Exception as error:
        if not stop.is_set():
            log.warning(
                "stopped following the rank-0 log of %s (%s); the TrainJob goes on and is still watched: `%s` "
                "shows its log",
                where,
                describe(error),
                kubectl,
            )


def by_rank(pods: Iterable[dict]) -> list[dict]:
    """Node pods in rank order (their completion index)."""
    return sorted(pods, key=lambda p: int((p["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, 0)))


def listed_pods(
    core: Any, namespace: str, label_selector: str, *, api: Callable[..., Any], log: Any, watched: list[dict]
) -> list[dict]:
    """The pods as a fresh list shows them, in rank order; `watched` (the watch's view) when the list fails."""
    from kubernetes.client.exceptions import ApiException

    try:
        listing = api(raw_json(core.list_namespaced_pod), namespace, label_selector=label_selector)
    except ApiException as error:
        log.warning("cannot list the node pods (%s); reporting what the watch showed", describe(error))
        return watched
    return by_rank(listing.get("items") or [])
