"""Create a TrainJob, follow it to the end, and report like a local run would.

Behaviour (DESIGN.md §3, modelled on GCPC's remote-job launcher):

- Idempotent create (attach.py): a TrainJob of this run and task is attached to (a Failed one replaced), anyone
  else's is left alone with a clear error.
- Wait with watches (`_shared/kube/watch.py`: list, then watch from its resourceVersion with bookmarks; reconnect
  on server timeouts and dropped connections, re-list on 410 Gone, back off exponentially on 429/5xx). State comes
  from the TrainJob's Complete/Failed/Suspended conditions; "running" from its `node` pods.
- A TrainJob in a Kueue queue (kueue.py): its wait for admission is said every minute and bounded by its own
  queue timeout; the training timeout counts from the latest admission; a preempted TrainJob is waited on again.
- The rank-0 `node` container log is streamed into our log as soon as the pod runs, reconnecting without
  repeating lines (kubelet timestamps mark what was already shown), with a progress line per torchtune metric line.
- Failed: raise with the condition reason/message, each failing pod's termination reason (OOMKilled, exit code)
  and the last log lines. Pods Pending too long: log why (events, waiting reasons); node pods that cannot start
  (image pull, missing Secret, unschedulable) fail the step after a grace period (diagnostics.py), and so do node
  pods never created, seen only in Warning events (creation.py). A runtime that restarts a crashed trainer in
  place (no `restartPolicy: Never`): fail at the first crash, naming the fix.
- A NaN or infinite loss in the rank-0 log: fail at once with the step and the usual fixes (TrainJobDiverged),
  ending like any failed TrainJob (the cleanup policy decides whether it is kept).
- SIGTERM/SIGINT (run cancelled, pod evicted) and timeouts delete the TrainJob; after the end the cleanup policy
  decides, and a TrainJob we declare failed before it ended is deleted unless the policy is "never" (finish.py).
- A DELETE is retried (deletion.py); the step log and the final line say "deleted" only when the API said so.
- SIGKILL (OOM, node loss) leaves no handler: the lease the launcher renews on the shared workspace lapses and the
  node pods stop training (lease.py); a KFP retry of the step that comes in time attaches and renews it.
- Degrade, never delete, when following fails: a watch error is said and the collection re-listed, a log error ends
  the log; permissions are asked before anything is created (access.py). Lost nodes and replaced pods are said
  as the pod watch shows them (disruptions.py); a failure is reported from a fresh list of the pods.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.cancel import Interrupted, StopSignals, raise_interrupted, signal_name
from kfp_finetune.components._shared.kube.client import Backoff, call_with_retry
from kfp_finetune.components._shared.kube.watch import LISTED, Watch
from kfp_finetune.components._shared.launch_settings import CLEANUP_POLICIES
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.access import LOG, check_permissions
from kfp_finetune.components.torchtune_finetune.backends.trainjob.annotations import ProgressAnnotations
from kfp_finetune.components.torchtune_finetune.backends.trainjob.attach import create_or_attach
from kfp_finetune.components.torchtune_finetune.backends.trainjob.creation import CreationWatch
from kfp_finetune.components.torchtune_finetune.backends.trainjob.deletion import (
    CANCEL_DELETE_RETRY_SECONDS,
    DELETE_RETRY_SECONDS,
    Deletion,
    delete_trainjob,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.diagnostics import (
    DEFAULT_START_FAILURE_GRACE,
    DEFAULT_UNSCHEDULABLE_GRACE,
    StartWatch,
    report_pending,
    restarted_node_containers,
    restarting_message,
    start_failure_message,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.disruptions import PodChanges
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import (
    TrainJobCancelled,
    TrainJobError,
    TrainJobTimeout,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.finish import finish
from kfp_finetune.components.torchtune_finetune.backends.trainjob.following import (
    by_rank,
    follow_log,
    keep_watching,
    listed_pods,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.kueue import (
    QUEUE_REPORT_INTERVAL,
    QueueWait,
    queue_of,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.placement import POD_NAME_ENV
from kfp_finetune.components.torchtune_finetune.backends.trainjob.pod_logs import RankZeroLog
from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import (
    TrainJobResult,
    condition,
    terminal_state,
)
from kfp_finetune.components.torchtune_finetune.lease import DEFAULT_LEASE_SECONDS, LeaseRenewer
from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged

LABEL_JOBSET = "jobset.sigs.k8s.io/jobset-name"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
# Tells whoever finds the TrainJob (kubectl describe) whether it may outlive its step: only under "never".
ANNOTATION_CLEANUP_POLICY = "kfp-finetune.io/cleanup-policy"
THREAD_STOP_TIMEOUT = 5.0  # seconds run() waits for its watch and log threads once it is done


class TrainJobLauncher:
    """Launches one TrainJob manifest and follows it (see the module docstring).

    Args:
        manifest: The TrainJob (from `trainjob.build_trainjob`); its namespace defaults to `namespace`.
        api_client: A `kubernetes.client.ApiClient` (see `_shared.kube.client.load_api_client`).
        namespace: Namespace to create in when the manifest has none.
        timeout: Seconds to wait for the end before deleting the TrainJob and failing (None: no limit).
        cleanup: "on-success" (delete successful TrainJobs and those we stop; keep ones that failed by themselves),
            "always" or "never".
        total_steps: Expected number of steps, for progress lines with an ETA.
        pending_warning_after: Seconds pods may stay Pending before we log why (repeated at each multiple).
        start_failure_grace: Seconds an image-pull or container-config error of a node pod may persist before
            the step fails naming the image / Secret and the fix (diagnostics.py explains the defaults).
        unschedulable_grace: Seconds node pods may stay unschedulable (cluster autoscalers add nodes) before the
            step fails with the scheduler's reason.
        watch_timeout: Server-side timeout of each watch request; the watch is then re-opened.
        log_read_timeout: Seconds a log stream may stay silent before we reconnect.
        tick: How often the main thread checks for timeout and stuck pods (no API calls on a tick).
        backoff: Retry/backoff for API calls (injectable so tests don't sleep).
        handle_signals: Install SIGTERM/SIGINT handlers that delete the TrainJob (main thread only).
        log_drain_timeout: After the end, how long to wait for the log stream to finish.
        event_poll_interval: While fewer node pods exist than asked for, how often to read the events that say
            why they are not created (creation.py); such a failure gets `start_failure_grace`.
        delete_retry_seconds: Back-off time spent retrying a failed DELETE of the TrainJob (after a signal at most
            `deletion.CANCEL_DELETE_RETRY_SECONDS`).
        lease_path: The lease file the node pods watch (`lease.py`: `<run folder>/launcher.lease` on the shared
            workspace); None: no lease (the TrainJob trains on if this step is killed).
        lease_duration: Seconds without a renewal after which the node pods stop training.
        queue_timeout: Seconds a TrainJob in a Kueue queue may wait for admission, all waits together, before it
            is deleted and the step fails (None: no limit); `timeout` then counts from the latest admission
            (kueue.py).
        queue_report_interval: Seconds between the step log's lines about a TrainJob waiting in its queue.
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
        event_poll_interval: float = 30.0,
        delete_retry_seconds: float = DELETE_RETRY_SECONDS,
        lease_path: Path | None = None,
        lease_duration: float = DEFAULT_LEASE_SECONDS,
        queue_timeout: float | None = None,
        queue_report_interval: float = QUEUE_REPORT_INTERVAL,
    ) -> None:
        from kubernetes import client

        if cleanup not in CLEANUP_POLICIES:
            raise ValueError(f"tune_cleanup_policy must be one of {CLEANUP_POLICIES}, got {cleanup!r}")
        self.manifest = json.loads(json.dumps(manifest))
        metadata = self.manifest.setdefault("metadata", {})
        self.namespace = metadata.get("namespace") or namespace
        if not self.namespace:
            raise ValueError("no namespace: set it in the manifest or pass namespace=")
        metadata["namespace"] = self.namespace
        metadata.setdefault("annotations", {})[ANNOTATION_CLEANUP_POLICY] = cleanup
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
        self.delete_retry_seconds = delete_retry_seconds
        self.lease_path, self.lease_duration = lease_path, lease_duration
        self.log = get_logger("kfp_finetune.trainjob")
        self._queue = QueueWait(
            self.custom,
            self.namespace,
            self.name,
            queued=bool(queue_of(self.manifest)),
            timeout=queue_timeout,
            report_interval=queue_report_interval,
            log=self.log,
        )
        self._creation_watch = CreationWatch(
            self.core,
            self.namespace,
            expected_pods=int((self.manifest["spec"].get("trainer") or {}).get("numNodes") or 1),
            interval=event_poll_interval,
            log=self.log,
        )

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watches: dict[str, Watch] = {}
        self._threads: list[threading.Thread] = []
        self._changed = threading.Event()  # the TrainJob or a pod changed, or a thread died
        self._trainjob: dict | None = None
        self._trainjob_seen = False
        self._pods: dict[str, dict] = {}
        self._missing_permissions: set = set()  # what the ServiceAccount may not do (access.py)
        self._diverged: LossDiverged | None = None
        self._started = time.monotonic()
        self._shown_events: set[str] = set()
        self._pod_changes = PodChanges(
            nodes=int((self.manifest["spec"].get("trainer") or {}).get("numNodes") or 1)
        )
        self._rank0_log = RankZeroLog(
            self.core,
            self.namespace,
            node_pods=self._node_pods,
            ended=self._ended,
            stop=self._stop,
            backoff=self.backoff,
            tick=tick,
            read_timeout=log_read_timeout,
            total_steps=total_steps,
            log=self.log,
            on_diverged=self._on_diverged,
            on_progress=ProgressAnnotations(self.custom, self.namespace, self.name, log=self.log),
        )

    # Public ---------------------------------------------------------------------------------------------------

    def run(self) -> TrainJobResult:
        """Create (or attach), wait for the end, clean up, and return the result or raise a TrainJobError."""
        # Asked before anything exists, and before the clock of the timeout starts.
        self._missing_permissions = check_permissions(
            self.custom.api_client,
            self.namespace,
            backoff=self.backoff,
            on_retry=self._on_retry,
            log=self.log,
        )
        self._started = time.monotonic()
        lease = self._hold_lease()
        try:
            with StopSignals(raise_interrupted, enabled=self.handle_signals) as signals:
                try:
                    created = create_or_attach(
                        self.custom,
                        self.core,
                        self.manifest,
                        cleanup=self.cleanup,
                        api=self._api,
                        backoff=self.backoff,
                        on_retry=self._on_retry,
                        delete=self._delete,
                        log=self.log,
                    )
                    return self._follow(created)
                except Interrupted as interrupt:
                    signals.restore()  # a second signal now ends us the default way
                    name = signal_name(interrupt.signum)
                    self.log.warning("received %s: deleting TrainJob %s", name, self.name)
                    deletion = self._delete(
                        reason=f"{name} received",
                        retry_seconds=min(self.delete_retry_seconds, CANCEL_DELETE_RETRY_SECONDS),
                    )
                    raise TrainJobCancelled(
                        f"cancelled by {name}: TrainJob {self.namespace}/{self.name} "
                        f"{deletion.words(self.namespace, self.name)}",
                        interrupt.signum,
                    ) from None
        finally:
            self._stop.set()
            self._stop_threads()
            if lease is not None:
                lease.release()

    def _hold_lease(self) -> LeaseRenewer | None:
        """Written before the TrainJob is created or attached to, renewed until run() returns (lease.py)."""
        if self.lease_path is None:
            return None
        holder = os.environ.get(POD_NAME_ENV) or socket.gethostname()
        lease = LeaseRenewer(self.lease_path, holder, self.lease_duration, self.log)
        lease.start()
        return lease

    def _stop_threads(self) -> None:
        """Cut the open streams and wait for the watch and log threads: nothing of this run may run on
        (or print) after it returned."""
        self._rank0_log.streams.close_all()
        for watch in self._watches.values():
            watch.stop()
        deadline = time.monotonic() + THREAD_STOP_TIMEOUT
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    # API calls --------------------------------------------------------------------------------------------------

    def _api(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return call_with_retry(fn, *args, backoff=self.backoff, on_retry=self._on_retry, **kwargs)

    def _on_retry(self, error: BaseException, delay: float) -> None:
        if self._stop.is_set():  # a watch or log thread after the end: no retries, no log lines
            raise error
        status = getattr(error, "status", None)
        self.log.warning("Kubernetes API %s; retrying in %.1fs", status or type(error).__name__, delay)

    # Follow -----------------------------------------------------------------------------------------------------

    def _follow(self, created: bool) -> TrainJobResult:
        threads = [
            threading.Thread(
                target=self._keep_watching, args=("trainjob", self._watch_trainjob), name=f"watch-{self.name}"
            ),
            threading.Thread(
                target=self._keep_watching, args=("pods", self._watch_pods), name=f"pods-{self.name}"
            ),
        ]
        log_thread = threading.Thread(target=self._follow_log, name=f"log-{self.name}")
        for thread in (*threads, log_thread):
            thread.daemon = True
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
                job, seen, diverged = self._trainjob, self._trainjob_seen, self._diverged
            for change in self._pod_changes.news(self._node_pods()):
                self.log.warning("TrainJob %s: %s", self.name, change)
            state = terminal_state(job)
            restarts = restarted_node_containers(self._node_pods())
            pods = self._node_pods()
            not_created = self._creation_watch.problems(job, len(pods), api=self._api)
            stuck = self._start_watch.overdue(pods, time.monotonic(), not_created)
            if state or restarts or stuck or diverged:
                break
            if seen and job is None:
                self._stop.set()
                raise TrainJobError(f"TrainJob {self.namespace}/{self.name} was deleted by someone else")
            now = time.monotonic()
            if self._queue.waiting(job, now, api=self._api):  # in a Kueue queue: no pods until admitted
                if self._queue.overdue(now):
                    self.log.error("TrainJob %s was not admitted in time: deleting it", self.name)
                    deletion = self._delete(reason="queue timeout")
                    self._stop.set()
                    raise self._queue.timeout_error(job, deletion.words(self.namespace, self.name))
                pending_since = None
                continue
            # Training time: from Kueue's latest admission (as the Trainer's activeDeadlineSeconds), else the launch.
            since = self._queue.training_since(self._started)
            if self.timeout is not None and since is not None and now - since > self.timeout:
                self.log.error("TrainJob %s did not finish within %ss: deleting it", self.name, self.timeout)
                deletion = self._delete(reason="timeout")
                self._stop.set()
                raise TrainJobTimeout(
                    f"TrainJob {self.namespace}/{self.name} did not finish within {self.timeout:g}s "
                    f"({deletion.words(self.namespace, self.name)}).{self._rank0_log.tail_text()}"
                )
            if condition(job, "Suspended"):  # suspended by someone, not in a Kueue queue
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
                    report_pending(
                        self.core,
                        self.namespace,
                        self.name,
                        self._node_pods(),
                        time.monotonic() - pending_since,
                        api=self._api,
                        log=self.log,
                        shown_events=self._shown_events,
                    )
                    next_pending_report += self.pending_warning_after
        # Let the log stream drain what the pod printed last, then stop the watches.
        # (No log when no pod started; no need for more once the loss diverged.)
        log_thread.join(0 if (stuck and not state) or diverged else self.log_drain_timeout)
        self._stop.set()
        with self._lock:
            diverged = self._diverged  # perhaps seen while draining the log of a TrainJob that ended
        if diverged:
            self.log.error("%s", diverged)
            return self._finish(job, "Failed", created, ("LossDiverged", str(diverged)), diverged)
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

    def _on_diverged(self, diverged: LossDiverged) -> None:
        """From the log thread: the loss became NaN or infinite."""
        where = f"TrainJob {self.namespace}/{self.name}"
        with self._lock:
            self._diverged = self._diverged or LossDiverged(diverged.step, diverged.loss, where)
        self._changed.set()

    def _follow_log(self) -> None:
        if LOG not in self._missing_permissions:
            where, selector = f"TrainJob {self.name}", f"{LABEL_JOBSET}={self.name}"
            kubectl = f"kubectl logs -n {self.namespace} -l {selector} -c {tj.NODE}"
            follow_log(self._rank0_log.follow, stop=self._stop, log=self.log, where=where, kubectl=kubectl)

    def _keep_watching(self, key: str, follow: Callable[[], None]) -> None:
        what = f"the node pods of TrainJob {self.name}" if key == "pods" else f"TrainJob {self.name}"
        keep_watching(
            follow, self._watches[key], what=what, stop=self._stop, backoff=self.backoff, log=self.log
        )

    def _new_watch(self) -> Watch:
        return Watch(
            backoff=self.backoff, timeout_seconds=self.watch_timeout, on_retry=self._on_retry, log=self.log
        )

    def _watch_trainjob(self) -> None:
        """Follow our TrainJob (list, then watch; re-list on 410) until the run stops."""
        for event in self._watches["trainjob"].stream(
            self.custom.list_namespaced_custom_object,
            tj.GROUP,
            tj.VERSION,
            self.namespace,
            tj.PLURAL,
            field_selector=f"metadata.name={self.name}",
        ):
            if event.type == LISTED:
                obj = event.items[0] if event.items else None
            else:
                obj = None if event.type == "DELETED" else event.object or {}
            with self._lock:
                self._trainjob = obj
                # The watch answered. We created or attached to the TrainJob, so an answer without it means it
                # was deleted, even before our first list (a TrainJob deleted then would be awaited for ever).
                self._trainjob_seen = True
            self._changed.set()
            if self._stop.is_set():
                return

    def _watch_pods(self) -> None:
        """Follow the TrainJob's node pods the same way."""
        for event in self._watches["pods"].stream(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=f"{LABEL_JOBSET}={self.name},{LABEL_REPLICATED_JOB}={tj.NODE}",
        ):
            with self._lock:
                if event.type == LISTED:
                    self._pods = {p["metadata"]["name"]: p for p in event.items}
                elif event.type == "DELETED":
                    self._pods.pop((event.object or {})["metadata"]["name"], None)
                else:
                    self._pods[(event.object or {})["metadata"]["name"]] = event.object or {}
            self._changed.set()
            if self._stop.is_set():
                return

    def _node_pods(self) -> list[dict]:
        with self._lock:
            return by_rank(self._pods.values())

    def _listed_node_pods(self) -> list[dict]:
        """Fresh, not from the pod watch, which can trail the TrainJob's Failed condition (following.py)."""
        selector = f"{LABEL_JOBSET}={self.name},{LABEL_REPLICATED_JOB}={tj.NODE}"
        return listed_pods(
            self.core, self.namespace, selector, api=self._api, log=self.log, watched=self._node_pods()
        )

    def _ended(self) -> bool:
        with self._lock:
            return terminal_state(self._trainjob) is not None

    def _any_pod_started(self) -> bool:
        return any((p.get("status") or {}).get("phase") not in (None, "Pending") for p in self._node_pods())

    # End --------------------------------------------------------------------------------------------------------

    def _finish(
        self,
        job: dict | None,
        state: str,
        created: bool,
        ended: tuple[str, str] | None = None,
        diverged: LossDiverged | None = None,
    ) -> TrainJobResult:
        return finish(
            job,
            state,
            created=created,
            ended=ended,
            diverged=diverged,
            core=self.core,
            namespace=self.namespace,
            name=self.name,
            cleanup=self.cleanup,
            started=self._started,
            rank0_log=self._rank0_log,
            node_pods=self._node_pods,
            listed_node_pods=self._listed_node_pods,
            delete=self._delete,
            api=self._api,
            log=self.log,
            shown_events=self._shown_events,
            gone_disruptions=self._pod_changes.gone_disruptions,
        )

    def _delete(self, *, reason: str, retry_seconds: float | None = None) -> Deletion:
        return delete_trainjob(
            self.custom,
            self.namespace,
            self.name,
            reason=reason,
            backoff=self.backoff,
            retry_seconds=self.delete_retry_seconds if retry_seconds is None else retry_seconds,
            log=self.log,
        )


def launch_trainjob(manifest: Mapping[str, Any], api_client: Any, **options: Any) -> TrainJobResult:
    """Create (or attach to) the TrainJob, stream its rank-0 log, wait for the end (see `TrainJobLauncher`)."""
    return TrainJobLauncher(manifest, api_client, **options).run()
