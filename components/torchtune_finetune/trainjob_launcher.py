"""Create a TrainJob, follow it to the end, and report like a local run would.

Behaviour (DESIGN.md §3, modelled on GCPC's remote-job launcher):

- Idempotent create: the name is deterministic per KFP run + task, so a 409 means a KFP retry or a restarted
  step. If the existing TrainJob carries our run/task labels we attach to it (a Failed one is replaced, since a
  retry is meant to train again); anything else is someone else's and we stop with a clear error.
- Wait with watches (`_shared/kube_watch.py`: list, then watch from its resourceVersion with bookmarks; reconnect
  on server timeouts and dropped connections, re-list on 410 Gone, back off exponentially on 429/5xx). State comes
  from the TrainJob's Complete/Failed/Suspended conditions; "running" from its `node` pods.
- The rank-0 `node` container log is streamed into our log as soon as the pod runs, reconnecting without
  repeating lines (kubelet timestamps mark what was already shown), with a progress line per torchtune metric line.
- Failed: raise with the condition reason/message, each failing pod's termination reason (OOMKilled, exit code)
  and the last log lines. Pods Pending too long: log why (events, waiting reasons); node pods that cannot start
  (image pull, missing Secret, unschedulable) fail the step after a grace period (pod_diagnostics.py). A runtime
  that restarts a crashed trainer in place (no `restartPolicy: Never`): fail at the first crash, naming the fix.
- SIGTERM/SIGINT (run cancelled, pod evicted) and timeouts delete the TrainJob; after the end the cleanup policy
  decides (default: delete successful TrainJobs, keep failed ones for debugging).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kfp_finetune.components._shared.kube import Backoff, call_with_retry, is_retryable
from kfp_finetune.components._shared.kube_watch import (
    LISTED,
    Streams,
    Watch,
    is_connection_error,
    raw_json,
)
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.torchtune_finetune import trainjob as tj
from kfp_finetune.components.torchtune_finetune import trainjob_gone
from kfp_finetune.components.torchtune_finetune.metrics import (
    StepMetrics,
    kubelet_timestamp_ns,
    parse_metric_line,
    progress_line,
)
from kfp_finetune.components.torchtune_finetune.pod_diagnostics import (
    DEFAULT_START_FAILURE_GRACE,
    DEFAULT_UNSCHEDULABLE_GRACE,
    StartWatch,
    start_failure_message,
    waiting_lines,
)
from kfp_finetune.components.torchtune_finetune.pod_failures import (
    restarted_node_containers,
    restarting_message,
    termination_summary,
)

CLEANUP_POLICIES = ("on-success", "always", "never")
LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
FAILURE_LOG_LINES = 50
THREAD_STOP_TIMEOUT = 5.0  # seconds run() waits for its watch and log threads once it is done


class TrainJobError(RuntimeError):
    """The TrainJob could not be run to completion."""


class TrainJobFailed(TrainJobError):
    """The TrainJob ended Failed; the message carries the reason, pod terminations and the last log lines."""

    def __init__(self, message: str, result: TrainJobResult):
        super().__init__(message)
        self.result = result


class TrainJobTimeout(TrainJobError):
    """The TrainJob did not finish in time (and was deleted)."""


class TrainJobCancelled(TrainJobError):
    """We were asked to stop (SIGTERM/SIGINT) and deleted the TrainJob."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class TrainJobConflict(TrainJobError):
    """A TrainJob of that name exists and does not belong to this KFP run/task."""


class _Interrupted(BaseException):
    """Raised by our signal handler in the main thread (BaseException: nothing on the way may swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@dataclasses.dataclass
class TrainJobResult:
    """How a TrainJob ended.

    Attributes:
        name: TrainJob name.
        namespace: Its namespace.
        status: Final state: "Complete" or "Failed".
        created: False when we attached to a TrainJob that already existed (retry).
        deleted: Whether the launcher deleted the TrainJob at the end.
        log_lines: Rank-0 log lines shown, in order.
        steps: torchtune step metrics parsed from those lines.
        wall_time: Seconds from launch to the end.
        reason: The terminal condition's reason.
        message: The terminal condition's message.
    """

    name: str
    namespace: str
    status: str
    created: bool
    deleted: bool = False
    log_lines: list[str] = dataclasses.field(default_factory=list)
    steps: list[StepMetrics] = dataclasses.field(default_factory=list)
    wall_time: float = 0.0
    reason: str = ""
    message: str = ""


def _condition(obj: Mapping[str, Any] | None, type_: str) -> dict | None:
    for condition in ((obj or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return condition
    return None


def terminal_state(obj: Mapping[str, Any] | None) -> str | None:
    """ "Complete" or "Failed" once the TrainJob has finished, else None."""
    for type_ in ("Failed", "Complete"):
        if _condition(obj, type_):
            return type_
    return None


class TrainJobLauncher:
    """Launches one TrainJob manifest and follows it (see the module docstring).

    Args:
        manifest: The TrainJob (from `trainjob.build_trainjob`); its namespace defaults to `namespace`.
        api_client: A `kubernetes.client.ApiClient` (see `_shared.kube.load_api_client`).
        namespace: Namespace to create in when the manifest has none.
        timeout: Seconds to wait for the end before deleting the TrainJob and failing (None: no limit).
        cleanup: "on-success" (delete successful TrainJobs, keep failed ones), "always" or "never".
        total_steps: Expected number of steps, for progress lines with an ETA.
        pending_warning_after: Seconds pods may stay Pending before we log why (repeated at each multiple).
        start_failure_grace: Seconds an image-pull or container-config error of a node pod may persist before
            the step fails naming the image / Secret and the fix (pod_diagnostics.py explains the defaults).
        unschedulable_grace: Seconds node pods may stay unschedulable (cluster autoscalers add nodes) before the
            step fails with the scheduler's reason.
        watch_timeout: Server-side timeout of each watch request; the watch is then re-opened.
        log_read_timeout: Seconds a log stream may stay silent before we reconnect.
        tick: How often the main thread checks for timeout and stuck pods (no API calls on a tick).
        backoff: Retry/backoff for API calls (injectable so tests don't sleep).
        handle_signals: Install SIGTERM/SIGINT handlers that delete the TrainJob (main thread only).
        log_drain_timeout: After the end, how long to wait for the log stream to finish.
    """

    def __init__(
        self,
        manifest: Mapping[str, Any],
        api_client: Any,
        *,
        namespace: str | None = None,
        timeout: float | None = None,
        cleanup: str = "on-success",
        total_steps: int | None = None,
        pending_warning_after: float = 300.0,
        start_failure_grace: float = DEFAULT_START_FAILURE_GRACE,
        unschedulable_grace: float = DEFAULT_UNSCHEDULABLE_GRACE,
        watch_timeout: int = 60,
        log_read_timeout: float = 300.0,
        tick: float = 1.0,
        backoff: Backoff | None = None,
        handle_signals: bool = True,
        log_drain_timeout: float = 30.0,
    ) -> None:
        from kubernetes import client

        if cleanup not in CLEANUP_POLICIES:
            raise ValueError(f"cleanup must be one of {CLEANUP_POLICIES}, got {cleanup!r}")
        self.manifest = json.loads(json.dumps(manifest))
        metadata = self.manifest.setdefault("metadata", {})
        self.namespace = metadata.get("namespace") or namespace
        if not self.namespace:
            raise ValueError("no namespace: set it in the manifest or pass namespace=")
        metadata["namespace"] = self.namespace
        self.name = metadata["name"]
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.timeout = timeout
        self.cleanup = cleanup
        self.total_steps = total_steps
        self.pending_warning_after = pending_warning_after
        self._start_watch = StartWatch(start_failure_grace, unschedulable_grace)
        self.watch_timeout = watch_timeout
        self.log_read_timeout = log_read_timeout
        self.tick = tick
        self.backoff = backoff or Backoff()
        self.handle_signals = handle_signals
        self.log_drain_timeout = log_drain_timeout
        self.log = get_logger("kfp_finetune.trainjob")

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._log_streams = Streams()  # the rank-0 log being followed, cut when run() ends
        self._watches: dict[str, Watch] = {}
        self._threads: list[threading.Thread] = []
        self._changed = threading.Event()  # the TrainJob or a pod changed, or a thread died
        self._trainjob: dict | None = None
        self._trainjob_seen = False
        self._pods: dict[str, dict] = {}
        self._thread_error: BaseException | None = None
        self._lines: list[str] = []
        self._tail: deque[str] = deque(maxlen=FAILURE_LOG_LINES)
        self._steps: list[StepMetrics] = []
        self._started = time.monotonic()
        self._first_step_at: tuple[float, int] | None = None
        self._shown_events: set[str] = set()

    # Public ---------------------------------------------------------------------------------------------------

    def run(self) -> TrainJobResult:
        """Create (or attach), wait for the end, clean up, and return the result or raise a TrainJobError."""
        self._started = time.monotonic()
        previous = self._install_signal_handlers()
        try:
            try:
                created = self._create_or_attach()
                return self._follow(created)
            except _Interrupted as interrupt:
                self._restore_signal_handlers(previous)  # a second signal now ends us the default way
                previous = None
                name = signal.Signals(interrupt.signum).name
                self.log.warning("received %s: deleting TrainJob %s", name, self.name)
                self._delete(reason=f"{name} received")
                raise TrainJobCancelled(
                    f"cancelled by {name}: TrainJob {self.namespace}/{self.name} deleted", interrupt.signum
                ) from None
        finally:
            self._stop.set()
            self._restore_signal_handlers(previous)
            self._stop_threads()

    def _stop_threads(self) -> None:
        """Cut the open streams and wait for the watch and log threads: nothing of this run may run on
        (or print) after it returned."""
        self._log_streams.close_all()
        for watch in self._watches.values():
            watch.stop()
        deadline = time.monotonic() + THREAD_STOP_TIMEOUT
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # Create / attach --------------------------------------------------------------------------------------------

    def _api(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return call_with_retry(fn, *args, backoff=self.backoff, on_retry=self._on_retry, **kwargs)

    def _on_retry(self, error: BaseException, delay: float) -> None:
        if self._stop.is_set():  # a watch or log thread after the end: no retries, no log lines
            raise error
        status = getattr(error, "status", None)
        self.log.warning("Kubernetes API %s; retrying in %.1fs", status or type(error).__name__, delay)

    def _check_runtime(self) -> None:
        from kubernetes.client.exceptions import ApiException

        ref = self.manifest["spec"]["runtimeRef"]
        kind = ref.get("kind") or tj.CLUSTER_RUNTIME_KIND
        try:
            if kind == tj.CLUSTER_RUNTIME_KIND:
                self._api(
                    self.custom.get_cluster_custom_object,
                    tj.GROUP,
                    tj.VERSION,
                    "clustertrainingruntimes",
                    ref["name"],
                )
            else:
                self._api(
                    self.custom.get_namespaced_custom_object,
                    tj.GROUP,
                    tj.VERSION,
                    self.namespace,
                    "trainingruntimes",
                    ref["name"],
                )
        except ApiException as error:
            if error.status == 404:
                where = "" if kind == tj.CLUSTER_RUNTIME_KIND else f" in namespace {self.namespace}"
                raise TrainJobError(
                    f"{kind} {ref['name']!r} not found{where}: install the kfp-finetune runtimes with "
                    "`kubectl apply -k runtimes/` or pick an existing runtime"
                ) from None
            if error.status != 403:
                raise
            self.log.info("cannot read %s %r (forbidden); creating the TrainJob anyway", kind, ref["name"])

    def _create_or_attach(self) -> bool:
        """True if we created the TrainJob, False if we attached to an existing one of ours."""
        from kubernetes.client.exceptions import ApiException

        self._check_runtime()
        for _ in range(2):  # a second round after replacing a failed TrainJob of ours
            try:
                self._api(
                    self.custom.create_namespaced_custom_object,
                    tj.GROUP,
                    tj.VERSION,
                    self.namespace,
                    tj.PLURAL,
                    self.manifest,
                )
                self.log.info("created TrainJob %s/%s", self.namespace, self.name)
                return True
            except ApiException as error:
                if error.status != 409:
                    raise TrainJobError(
                        f"creating TrainJob {self.namespace}/{self.name} failed: {_api_message(error)}"
                    ) from None
            existing = self._get_trainjob()
            self._require_ours(existing)
            if terminal_state(existing) != "Failed":
                self.log.info(
                    "TrainJob %s/%s already exists for this run and task: attaching to it instead of "
                    "starting a second training",
                    self.namespace,
                    self.name,
                )
                return False
            self.log.info("TrainJob %s of this run and task failed before: replacing it", self.name)
            self._delete(reason="replacing a failed attempt")
            self._wait_gone()
        raise TrainJobError(f"TrainJob {self.namespace}/{self.name} keeps coming back; giving up")

    def _get_trainjob(self) -> dict:
        return self._api(
            self.custom.get_namespaced_custom_object,
            tj.GROUP,
            tj.VERSION,
            self.namespace,
            tj.PLURAL,
            self.name,
        )

    def _require_ours(self, existing: Mapping[str, Any]) -> None:
        wanted = self.manifest["metadata"].get("labels") or {}
        have = (existing.get("metadata") or {}).get("labels") or {}
        keys = (tj.LABEL_RUN_ID, tj.LABEL_TASK)
        if not all(k in wanted for k in keys) or any(have.get(k) != wanted[k] for k in keys):
            owner = ", ".join(f"{k}={have.get(k, '<unset>')}" for k in keys)
            raise TrainJobConflict(
                f"TrainJob {self.namespace}/{self.name} already exists and does not belong to this pipeline "
                f"run/task ({owner}); not touching it. Delete it or choose another name."
            )

    def _wait_gone(self) -> None:
        """Until the TrainJob, its JobSet and its pods are gone: a new one must not inherit them."""
        left = trainjob_gone.wait_until_gone(
            self.custom,
            self.core,
            self.namespace,
            self.name,
            api=self._api,
            sleep=self.backoff.sleep,
            log=self.log,
        )
        if left:
            raise TrainJobError(
                f"TrainJob {self.namespace}/{self.name} was not deleted in time: {', '.join(left)}"
            )

    # Follow -----------------------------------------------------------------------------------------------------

    def _follow(self, created: bool) -> TrainJobResult:
        threads = [
            threading.Thread(
                target=self._guard(self._watch_trainjob), name=f"watch-{self.name}", daemon=True
            ),
            threading.Thread(target=self._guard(self._watch_pods), name=f"pods-{self.name}", daemon=True),
        ]
        log_thread = threading.Thread(
            target=self._guard(self._stream_logs), name=f"log-{self.name}", daemon=True
        )
        self._threads = [*threads, log_thread]
        # Made before the threads start, so that _stop_threads always stops them.
        self._watches = {"trainjob": self._new_watch(), "pods": self._new_watch()}
        for thread in self._threads:
            thread.start()
        next_pending_report = self.pending_warning_after
        pending_since: float | None = None
        reported_suspended = False
        while True:
            self._changed.wait(self.tick)
            self._changed.clear()
            with self._lock:
                error, job, seen = self._thread_error, self._trainjob, self._trainjob_seen
            if error is not None:  # a watch or the log stream hit a non-transient error (e.g. RBAC)
                self._stop.set()
                # Nobody would watch it any more, and a KFP retry would start over anyway.
                self._delete(reason="lost track of it")
                raise TrainJobError(
                    f"lost track of TrainJob {self.namespace}/{self.name} (deleted it): {error}"
                ) from error
            state = terminal_state(job)
            restarts = restarted_node_containers(self._node_pods())
            stuck = self._start_watch.overdue(self._node_pods(), time.monotonic())
            if state or restarts or stuck:
                break
            if seen and job is None:
                self._stop.set()
                raise TrainJobError(f"TrainJob {self.namespace}/{self.name} was deleted by someone else")
            elapsed = time.monotonic() - self._started
            if self.timeout is not None and elapsed > self.timeout:
                self.log.error("TrainJob %s did not finish within %ss: deleting it", self.name, self.timeout)
                self._delete(reason="timeout")
                self._stop.set()
                raise TrainJobTimeout(
                    f"TrainJob {self.namespace}/{self.name} did not finish within {self.timeout:g}s "
                    f"(deleted).{self._tail_text()}"
                )
            if _condition(job, "Suspended"):  # e.g. queued by Kueue: no pods until it is admitted
                if not reported_suspended:
                    self.log.info("TrainJob %s is suspended; waiting for it to be resumed", self.name)
                reported_suspended, pending_since = True, None
                continue
            reported_suspended = False
            if self._any_pod_started():
                pending_since, next_pending_report = None, self.pending_warning_after
            else:
                pending_since = pending_since or time.monotonic()
                if time.monotonic() - pending_since >= next_pending_report:
                    self._report_pending(time.monotonic() - pending_since)
                    next_pending_report += self.pending_warning_after
        # Let the log stream drain what the pod printed last, then stop the watches.
        log_thread.join(0 if stuck and not state else self.log_drain_timeout)  # no log when no pod started
        self._stop.set()
        if restarts and not state:
            ref = self.manifest["spec"]["runtimeRef"]
            return self._finish(
                job, "Failed", created, ("TrainerRestarting", restarting_message(ref, restarts))
            )
        if stuck and not state:
            return self._finish(
                job, "Failed", created, start_failure_message(stuck, self.namespace, self.name)
            )
        return self._finish(job, state, created)

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as error:  # reported to the main thread, which fails clearly
                with self._lock:
                    self._thread_error = self._thread_error or error
                self._changed.set()

        return run

    def _new_watch(self) -> Watch:
        return Watch(
            backoff=self.backoff, timeout_seconds=self.watch_timeout, on_retry=self._on_retry, log=self.log
        )

    def _watch(
        self,
        watch: Watch,
        list_fn: Callable[..., Any],
        args: tuple,
        on_list: Callable[[list[dict]], None],
        on_event: Callable[[str, dict], None],
        **selectors: str,
    ) -> None:
        """Follow one collection (list, then watch; re-list on 410) until the run stops."""
        for event in watch.stream(list_fn, *args, **selectors):
            if event.type == LISTED:
                on_list(event.items)
            else:
                on_event(event.type, event.object or {})
            if self._stop.is_set():
                return

    def _watch_trainjob(self) -> None:
        def on_list(items: list[dict]) -> None:
            self._set_trainjob(items[0] if items else None)

        def on_event(kind: str, obj: dict) -> None:
            self._set_trainjob(None if kind == "DELETED" else obj)

        self._watch(
            self._watches["trainjob"],
            self.custom.list_namespaced_custom_object,
            (tj.GROUP, tj.VERSION, self.namespace, tj.PLURAL),
            on_list,
            on_event,
            field_selector=f"metadata.name={self.name}",
        )

    def _set_trainjob(self, obj: dict | None) -> None:
        with self._lock:
            self._trainjob = obj
            self._trainjob_seen = self._trainjob_seen or obj is not None
        self._changed.set()

    def _watch_pods(self) -> None:
        def on_list(items: list[dict]) -> None:
            with self._lock:
                self._pods = {p["metadata"]["name"]: p for p in items}
            self._changed.set()

        def on_event(kind: str, obj: dict) -> None:
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(obj["metadata"]["name"], None)
                else:
                    self._pods[obj["metadata"]["name"]] = obj
            self._changed.set()

        self._watch(
            self._watches["pods"],
            self.core.list_namespaced_pod,
            (self.namespace,),
            on_list,
            on_event,
            label_selector=f"{LABEL_JOBSET}={self.name},{LABEL_REPLICATED_JOB}={tj.NODE}",
        )

    def _node_pods(self) -> list[dict]:
        with self._lock:
            pods = list(self._pods.values())
        return sorted(
            pods, key=lambda p: int((p["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, 0))
        )

    def _rank0_pod(self) -> dict | None:
        candidates = [
            p
            for p in self._node_pods()
            if (p["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, "0") == "0"
            and not p["metadata"].get("deletionTimestamp")
        ]
        return max(candidates, key=lambda p: p["metadata"].get("creationTimestamp", ""), default=None)

    def _any_pod_started(self) -> bool:
        return any((p.get("status") or {}).get("phase") not in (None, "Pending") for p in self._node_pods())

    # Logs -------------------------------------------------------------------------------------------------------

    def _stream_logs(self) -> None:
        """Follow the rank-0 `node` log from the moment the pod runs until the TrainJob ends."""
        streamed: set[str] = set()  # pods whose log was followed to the end
        while not self._stop.is_set():
            pod = self._rank0_pod()
            with self._lock:
                done = terminal_state(self._trainjob) is not None
            done = done or bool(restarted_node_containers(self._node_pods()))
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
            kwargs: dict[str, Any] = {"container": tj.NODE, "follow": True, "timestamps": True}
            # Reconnecting: ask from a minute before the last line shown (clock skew), then skip what we showed.
            if last_ns is not None:
                kwargs["since_seconds"] = max(1, math.ceil(time.time() - last_ns / 1e9) + 60)
            repeats_left = shown_at_last
            try:
                response = self.core.read_namespaced_pod_log(
                    pod_name,
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=(10, self.log_read_timeout),
                    **kwargs,
                )
                with self._log_streams.reading(response):
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
        now = time.monotonic()
        with self._lock:
            self._steps.append(metrics)
            self._first_step_at = self._first_step_at or (now, metrics.step)
            first_at, first_step = self._first_step_at
        eta = None
        if self.total_steps and metrics.step > first_step:
            rate = (now - first_at) / (metrics.step - first_step)
            eta = rate * (self.total_steps - metrics.step)
        self.log.info("%s", progress_line(metrics, self.total_steps, eta))

    def _tail_text(self) -> str:
        with self._lock:
            tail = list(self._tail)
        if not tail:
            return ""
        return f"\nLast {len(tail)} log lines of the rank-0 node:\n" + "\n".join(f"  {line}" for line in tail)

    # Diagnostics ------------------------------------------------------------------------------------------------

    def _report_pending(self, seconds: float) -> None:
        from kubernetes.client.exceptions import ApiException

        pods = self._node_pods()
        self.log.warning(
            "TrainJob %s: node pods still Pending after %.1fs (%s)",
            self.name,
            seconds,
            ", ".join(p["metadata"]["name"] for p in pods) or "no pods created yet",
        )
        for line in waiting_lines(pods):
            self.log.warning("  %s", line)
        for involved in [self.name, *(p["metadata"]["name"] for p in pods)]:
            try:
                events = self._api(
                    self.core.list_namespaced_event,
                    self.namespace,
                    field_selector=f"involvedObject.name={involved}",
                )
            except ApiException as error:  # diagnostics only: never fail the run for them
                self.log.warning("  cannot list events of %s: %s", involved, _api_message(error))
                return
            for event in events.items:
                if event.metadata.uid in self._shown_events:
                    continue
                self._shown_events.add(event.metadata.uid)
                self.log.warning(
                    "  event %s %s: %s: %s", event.involved_object.kind, involved, event.reason, event.message
                )

    # End --------------------------------------------------------------------------------------------------------

    def _finish(
        self, job: dict, state: str, created: bool, ended: tuple[str, str] | None = None
    ) -> TrainJobResult:
        """Report the end; ``ended``: our own (reason, message) when we stop before the TrainJob ends."""
        condition = (
            dict(zip(("reason", "message"), ended, strict=True)) if ended else _condition(job, state) or {}
        )
        with self._lock:
            result = TrainJobResult(
                name=self.name,
                namespace=self.namespace,
                status=state,
                created=created,
                log_lines=list(self._lines),
                steps=list(self._steps),
                wall_time=time.monotonic() - self._started,
                reason=condition.get("reason") or "",
                message=condition.get("message") or "",
            )
        if state == "Failed":
            terminations = termination_summary(self._node_pods())
            if not result.log_lines:
                self._fetch_tail()
            if self.cleanup == "always":
                result.deleted = self._delete(reason="cleanup policy 'always'")
            elif ended:
                self.log.warning(
                    "kept TrainJob %s (cleanup policy %r) for debugging: it holds its nodes until deleted; "
                    "`kubectl delete trainjob -n %s %s` frees its nodes now",
                    self.name,
                    self.cleanup,
                    self.namespace,
                    self.name,
                )
            text = [
                f"TrainJob {self.namespace}/{self.name} failed: {result.reason or 'Failed'}: {result.message}"
            ]
            text += [f"  {line}" for line in terminations]
            raise TrainJobFailed("\n".join(text) + self._tail_text(), result)
        self.log.info("TrainJob %s completed in %.0fs", self.name, result.wall_time)
        if self.cleanup in ("on-success", "always"):
            result.deleted = self._delete(reason=f"cleanup policy {self.cleanup!r}")
        return result

    def _fetch_tail(self) -> None:
        """The last lines of rank 0 when we never got to stream them (e.g. attached after the end)."""
        from kubernetes.client.exceptions import ApiException

        pod = self._rank0_pod()
        if pod is None:
            return
        with contextlib.suppress(ApiException):
            text = self._api(
                self.core.read_namespaced_pod_log,
                pod["metadata"]["name"],
                self.namespace,
                container=tj.NODE,
                tail_lines=FAILURE_LOG_LINES,
            )
            with self._lock:
                self._tail.extend(text.splitlines())

    def _delete(self, *, reason: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._api(
                self.custom.delete_namespaced_custom_object,
                tj.GROUP,
                tj.VERSION,
                self.namespace,
                tj.PLURAL,
                self.name,
                propagation_policy="Background",
            )
        except ApiException as error:
            if error.status == 404:
                return False
            self.log.error("could not delete TrainJob %s (%s): %s", self.name, reason, _api_message(error))
            return False
        self.log.info("deleted TrainJob %s (%s)", self.name, reason)
        return True

    # Signals ----------------------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any] | None:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return None

        def interrupt(signum: int, _frame: Any) -> None:
            raise _Interrupted(signum)

        return {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any] | None) -> None:
        for sig, handler in (previous or {}).items():
            signal.signal(sig, handler)


def _api_message(error: Any) -> str:
    """The `message` of a Kubernetes Status body, else the HTTP reason."""
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def launch_trainjob(manifest: Mapping[str, Any], api_client: Any, **options: Any) -> TrainJobResult:
    """Create (or attach to) the TrainJob, stream its rank-0 log, wait for the end (see `TrainJobLauncher`)."""
    return TrainJobLauncher(manifest, api_client, **options).run()
