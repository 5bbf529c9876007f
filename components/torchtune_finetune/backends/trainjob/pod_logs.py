"""The rank-0 `node` container's log, streamed into the step's log while the TrainJob runs.

The log is followed from the moment the pod runs, reconnecting without repeating lines (kubelet timestamps mark
what was already shown); each torchtune metric line also gives a progress line with an ETA. A restarted rank-0
pod is followed in turn. The last lines are kept for the failure message. The first NaN or infinite loss is
reported to the launcher (`on_diverged`), which stops the run.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff, is_retryable
from kfp_finetune.components._shared.kube.watch import Streams, is_connection_error, raw_json
from kfp_finetune.components._shared.metrics_file import StepMetrics, parse_metric_line
from kfp_finetune.components.torchtune_finetune.backends.trainjob.diagnostics import restarted_node_containers
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import NODE
from kfp_finetune.components.torchtune_finetune.metrics import (
    LossDiverged,
    divergence,
    kubelet_timestamp_ns,
)
from kfp_finetune.components.torchtune_finetune.progress import Progress, ProgressClock

LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
FAILURE_LOG_LINES = 50


def rank0_pod(node_pods: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest rank-0 node pod that is not being deleted."""
    candidates = [
        p
        for p in node_pods
        if (p["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, "0") == "0"
        and not p["metadata"].get("deletionTimestamp")
    ]
    return max(candidates, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None)


class RankZeroLog:
    """Follows the rank-0 node log of one TrainJob (see the module docstring).

    Args:
        core: A `kubernetes.client.CoreV1Api`.
        namespace: The TrainJob's namespace.
        node_pods: The TrainJob's node pods as currently known (kept current by the launcher's pod watch).
        ended: Whether the TrainJob has ended (then no new pod log is awaited).
        stop: Set when the run is over: stop following.
        backoff: Retry/backoff for API calls.
        tick: How often to look for the rank-0 pod (no API call on a tick).
        read_timeout: Seconds a log stream may stay silent before we reconnect.
        total_steps: Expected number of steps, for progress lines with an ETA.
        log: Where lines and progress go.
        on_diverged: Called (from the log thread) at the first metric line with a NaN or infinite loss.
        on_progress: Called (from the log thread) with each step's progress (the TrainJob's annotations).
    """

    def __init__(
        self,
        core: Any,
        namespace: str,
        *,
        node_pods: Callable[[], list[dict]],
        ended: Callable[[], bool],
        stop: threading.Event,
        backoff: Backoff,
        tick: float,
        read_timeout: float,
        total_steps: int | None,
        log: Any,
        on_diverged: Callable[[LossDiverged], None] = lambda _: None,
        on_progress: Callable[[Progress], None] = lambda _: None,
    ) -> None:
        self.core, self.namespace = core, namespace
        self._node_pods, self._ended, self._stop = node_pods, ended, stop
        self.backoff, self.tick, self.read_timeout = backoff, tick, read_timeout
        self.total_steps, self.log = total_steps, log
        self._on_diverged = on_diverged
        self._on_progress = on_progress
        self._diverged = False
        self.streams = Streams()  # the log being followed, cut when the run ends
        self._lock = threading.Lock()
        self._lines: list[str] = []
        self._tail: deque[str] = deque(maxlen=FAILURE_LOG_LINES)
        self._steps: list[StepMetrics] = []
        self._progress = ProgressClock(total_steps)

    def shown(self) -> tuple[list[str], list[StepMetrics]]:
        """The lines shown so far and the step metrics parsed from them."""
        with self._lock:
            return list(self._lines), list(self._steps)

    def follow(self) -> None:
        """Follow the rank-0 `node` log from the moment the pod runs until the TrainJob ends."""
        streamed: set[str] = set()  # pods whose log was followed to the end
        while not self._stop.is_set():
            pod = rank0_pod(self._node_pods())
            done = self._ended() or bool(restarted_node_containers(self._node_pods()))
            phase = ((pod or {}).get("status") or {}).get("phase")
            if pod is None or phase in (None, "Pending") or pod["metadata"]["name"] in streamed:
                if done:
                    return
                self._stop.wait(self.tick / 4)  # the pod watch keeps our view current; no API call here
                continue
            name = pod["metadata"]["name"]
            if streamed:
                self.log.info("rank-0 pod restarted as %s", name)
            self._follow_pod_log(name)
            streamed.add(name)

    def _follow_pod_log(self, pod_name: str) -> None:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        last_ns: int | None = None  # kubelet timestamp of the last line shown
        shown_at_last = 0  # how many lines with exactly that timestamp were shown
        failures = self.backoff.delays()
        while not self._stop.is_set():
            kwargs: dict[str, Any] = {"container": NODE, "follow": True, "timestamps": True}
            # Reconnecting: ask from a minute before the last line shown (clock skew), then skip what we showed.
            if last_ns is not None:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last_ns / 1e9) + 60)
            repeats_left = shown_at_last
            try:
                response = self.core.read_namespaced_pod_log(
                    pod_name,
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=(10, self.read_timeout),
                    **kwargs,
                )
                with self.streams.reading(response):
                    for raw in iter_resp_lines(response):
                        stamp, line = kubelet_timestamp_ns(raw)
                        if stamp is not None and last_ns is not None:
                            if stamp < last_ns:
                                continue
                            if stamp == last_ns and repeats_left:
                                repeats_left -= 1
                                continue
                        if stamp is not None:
                            shown_at_last = shown_at_last + 1 if stamp == last_ns else 1
                            last_ns = stamp
                        self._show(line)
            except ApiException as error:
                if error.status == 404:
                    return  # the pod is gone
                if error.status == 400 and "waiting to start" in str(error.body or ""):
                    self.backoff.sleep(min(self.tick, 1.0))
                    continue
                if not is_retryable(error):
                    raise
                self.backoff.sleep(next(failures, self.backoff.maximum))
                continue
            except Exception as error:
                if not (is_retryable(error) or is_connection_error(error)):
                    raise
                continue  # silent for too long or the connection dropped: reconnect
            if self._stop.is_set() or self._pod_finished(pod_name, failures):
                return

    def _pod_finished(self, pod_name: str, failures: Iterator[float]) -> bool:
        """Whether the pod's log is complete. A transient API error is no answer: the caller reconnects the log
        after a back-off, as long as the run goes on (never a reason to give up on a TrainJob that runs)."""
        try:
            pod = raw_json(self.core.read_namespaced_pod)(pod_name, self.namespace)
        except Exception as error:
            status = getattr(error, "status", None)  # an ApiException's HTTP status
            if status == 404:
                return True
            if not (is_retryable(error) or is_connection_error(error)):
                raise
            self.log.warning(
                "Kubernetes API %s reading pod %s; retrying", status or type(error).__name__, pod_name
            )
            self.backoff.sleep(next(failures, self.backoff.maximum))
            return False
        # A container that crashed and restarts in place ends its log stream while the pod stays Running.
        return pod["status"].get("phase") in ("Succeeded", "Failed") or bool(restarted_node_containers([pod]))

    def _show(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            self._tail.append(line)
        self.log.info("[node-0] %s", line)
        metrics = parse_metric_line(line)
        if metrics is None:
            return
        with self._lock:
            self._steps.append(metrics)
            progress = self._progress.update(metrics)
        self.log.info("%s", progress.line())
        self._on_progress(progress)
        diverged = divergence(metrics)
        if diverged and not self._diverged:
            self._diverged = True
            self._on_diverged(diverged)

    def tail_text(self) -> str:
        """The last lines of rank 0, for a failure message ("" when none were seen)."""
        with self._lock:
            tail = list(self._tail)
        if not tail:
            return ""
        return f"\nLast {len(tail)} log lines of the rank-0 node:\n" + "\n".join(f"  {line}" for line in tail)

    def fetch_tail(self, api: Callable[..., Any], pods: list[dict]) -> None:
        """The last lines of rank 0 when we never got to stream them (e.g. attached after the end); `pods`: the
        node pods as listed now."""
        from kubernetes.client.exceptions import ApiException

        pod = rank0_pod(pods)
        if pod is None:
            return
        with contextlib.suppress(ApiException):
            text = api(
                self.core.read_namespaced_pod_log,
                pod["metadata"]["name"],
                self.namespace,
                container=NODE,
                tail_lines=FAILURE_LOG_LINES,
            )
            with self._lock:
                self._tail.extend(text.splitlines())
