"""The simulated Trainer + JobSet + scheduler + kubelet: drives each TrainJob through its scenario."""

from __future__ import annotations

import dataclasses
import secrets
import subprocess
import threading
import time
from collections.abc import Callable

from ._common import DEADLINE_EXCEEDED, JOBSET_COMPLETED, JOBSET_FAILED_MESSAGE, parse_time
from ._container import ExecuteConfig, kill_processes
from ._disruption import mark_disrupted
from ._execute import JobControls, NodeProcesses
from ._gc import mark_terminating
from ._jobpolicy import (
    BACKOFF_LIMIT_EXCEEDED,
    JobPolicy,
    crash_loop_delay,
    mark_crash_looping,
    mark_restarted,
    match_pod_failure_policy,
    node_job_policy,
    restart_count,
    restarts_exceed_limit,
)
from ._podcreate import RESOURCES_CREATION_FAILED, failed_create_message, pod_spec_errors
from ._startup import start_failure
from ._store import Store
from ._types import Scenario
from ._workload import (
    build_jobs_status,
    jobset_finished,
    mark_running,
    mark_scheduled,
    mark_terminated,
    mark_unschedulable,
    multi_attach_error,
    new_condition,
    new_jobset,
    new_pod,
    node_pod_template,
    node_replicated_job,
    required_node,
    unschedulable_event,
)

# kube-scheduler's message for a pod whose required node affinity matches no node (NodeAffinity plugin).
NO_NODE_MATCHES = (
    "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/1 nodes are "
    "available: 1 Preemption is not helpful for scheduling."
)

# What ended a phase of a job's life: None (the phase ran out), "cancel" (deleted / stand-in stopped),
# "deadline" (activeDeadlineSeconds), "succeeded" or "failed".
Outcome = str | None
Wait = Callable[[float], Outcome]


@dataclasses.dataclass
class JobRun:
    """Controller bookkeeping for one TrainJob."""

    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    processes: list[subprocess.Popen] = dataclasses.field(default_factory=list)
    thread: threading.Thread | None = None


class Controller:
    """One thread per TrainJob plays the job's :class:`Scenario` (or runs its node command in execute mode)."""

    def __init__(self, store: Store, default_scenario: Scenario) -> None:
        self.store = store
        self.scenarios: dict[str | None, Scenario] = {None: default_scenario}
        self.execute_configs: dict[str | None, ExecuteConfig] = {}
        self._runs: dict[tuple[str, str], JobRun] = {}
        # Kueue's eviction of a TrainJob's workload (_kueue.py; the API server's Kueue sets it).
        self.preempt_workload: Callable[[str, str], None] = _no_kueue

    def start(self, job: dict) -> None:
        name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
        run = JobRun()
        with self.store.cond:
            self._runs[(namespace, name)] = run
        run.thread = threading.Thread(
            target=self._drive, args=(namespace, name, run), name=f"standin-{name}", daemon=True
        )
        run.thread.start()

    def cancel(self, namespace: str, name: str) -> None:
        """Stop driving the job (it is being deleted) and kill its processes."""
        with self.store.cond:
            run = self._runs.pop((namespace, name), None)
        if run:
            run.cancel.set()
            kill_processes(run.processes)

    def stop(self) -> None:
        with self.store.cond:
            runs = list(self._runs.values())
        for run in runs:
            run.cancel.set()
            kill_processes(run.processes)
        for run in runs:
            if run.thread and run.thread is not threading.current_thread():
                run.thread.join(timeout=5)

    # One job's life ---------------------------------------------------------------------------------------------

    def _drive(self, namespace: str, name: str, run: JobRun) -> None:
        """Pods Pending → Running → terminated, TrainJob jobsStatus and conditions, as a cluster would show them.

        A suspended TrainJob (queued by Kueue, _kueue.py) waits until it is unsuspended; suspended again while it
        runs (preempted), its pods are deleted and it waits again, then starts over (kubeflow/trainer v2.3.0
        pkg/controller/trainjob_controller.go setSuspendedCondition; the jobset plugin suspends the JobSet, whose
        Jobs delete their pods)."""
        store = self.store
        job = store.find("trainjobs", namespace, name)
        runtime = store.runtime_of(job) if job else None
        if job is None or runtime is None:
            return
        resumed_at = None  # activeDeadlineSeconds counts from the last resume (reconcileDeadline)
        while True:
            if job["spec"].get("suspend"):
                suspended = new_condition("Suspended", "True", "Suspended", "TrainJob is suspended")
                self._set_status(namespace, name, [suspended], None)
                if not self._wait_resumed(namespace, name, run):
                    return
                resumed_at = time.time()
                resumed = new_condition("Suspended", "False", "Resumed", "TrainJob is resumed")
                self._set_status(namespace, name, [resumed], None)
            with store.cond:  # read at each start: a test may give a resumed job another scenario
                scenario = self.scenarios.get(name) or self.scenarios[None]
                execute = self.execute_configs.get(name) or self.execute_configs.get(None)
            if scenario.execute and execute is None:
                execute = ExecuteConfig({}, {})
            if self._run(job, runtime, scenario, execute, run, resumed_at) != "suspended":
                return
            self._stop_suspended(namespace, name, runtime, run)
            if (job := store.find("trainjobs", namespace, name)) is None:
                return

    def _wait_resumed(self, namespace: str, name: str, run: JobRun) -> bool:
        """Until the TrainJob is unsuspended (True), or deleted / the stand-in stops (False)."""
        with self.store.cond:
            while not (run.cancel.is_set() or self.store.stopping):
                job = self.store.objects.get(("trainjobs", namespace, name))
                if job is None:
                    return False
                if not job["spec"].get("suspend"):
                    return True
                self.store.cond.wait(0.1)
        return False

    def _stop_suspended(self, namespace: str, name: str, runtime: dict, run: JobRun) -> None:
        """Suspended while it ran: the JobSet is suspended and its Jobs delete their pods (processes killed)."""
        kill_processes(run.processes)
        run.processes.clear()
        self.store.update("jobsets", namespace, name, lambda js: js["spec"].update(suspend=True))
        for pod in self.store.job_pods(namespace, name):
            self._delete_pod(namespace, pod["metadata"]["name"])
        self._set_status(namespace, name, None, build_jobs_status(runtime, suspended=1))

    def _run(
        self,
        job: dict,
        runtime: dict,
        scenario: Scenario,
        execute: ExecuteConfig | None,
        run: JobRun,
        resumed_at: float | None,
    ) -> Outcome:
        """One start of the job's pods to its end; "suspended" when it was suspended meanwhile."""
        store = self.store
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        template, num_nodes, _ = node_pod_template(job, runtime)
        with store.cond:  # a concurrent DELETE either sees these pods or has cancelled us already
            if run.cancel.is_set():
                return "cancel"
            old = store.find("jobsets", namespace, name)
            if old is not None and not old["spec"].get("suspend"):
                self._adopt_jobset(namespace, name, old)
                return None
            pods = self._create_workload(job, template, num_nodes, scenario)
            freed = store.freed_nodes  # a node freed from now on can take the unschedulable pods
            self._set_status(namespace, name, None, build_jobs_status(runtime, active=1))
        wait = self._waiter(job, run, resumed_at)

        attach_blocked = self._attach_volumes(namespace, pods)
        if not pods or attach_blocked or (scenario.stay_pending and not unschedulable_event(scenario)):
            outcome = wait(float("inf"))
        else:
            outcome = wait(scenario.pending_seconds) or self._wait_until_startable(
                namespace, pods, scenario, wait, freed
            )
        if outcome is None:
            for pod in pods:
                store.update("pods", namespace, pod, mark_running)
                store.record_event(
                    namespace, "Pod", pod, "Scheduled", f"Successfully assigned {namespace}/{pod}", "Normal"
                )
                store.record_event(namespace, "Pod", pod, "Started", "Started container node", "Normal")
            self._set_status(namespace, name, None, build_jobs_status(runtime, active=1, ready=1))
            if execute is not None:
                controls = JobControls(
                    policy=node_job_policy(node_replicated_job(runtime)),
                    delete_pod=self._delete_pod,
                    replace_pod=lambda rank, lost: self._replace_pod(job, template, rank, scenario, lost),
                    fail_job=lambda ended: self._fail_node_job(job, ended, delete=[]),
                    preempt_workload=lambda: self.preempt_workload(namespace, name),
                )
                nodes = NodeProcesses(store, namespace, execute, run.processes, scenario, controls)
                outcome = nodes.run(pods, wait)
            else:
                policy = node_job_policy(node_replicated_job(runtime))
                outcome = self._simulate_run(job, pods, template, scenario, policy, wait)
        if outcome in ("cancel", "suspended"):
            return outcome
        if outcome == "deadline":  # the Trainer deletes the JobSet, so the pods go
            kill_processes(run.processes)
            if jobset := store.find("jobsets", namespace, name):
                store.put("jobsets", jobset, "DELETED")
            for pod in store.job_pods(namespace, name):
                store.put("pods", pod, "DELETED")
            condition = new_condition("Failed", "True", *DEADLINE_EXCEEDED)
        elif outcome == "succeeded":
            condition = new_condition("Complete", "True", *JOBSET_COMPLETED)
        elif execute is None:
            condition = new_condition("Failed", "True", scenario.failure_reason, scenario.failure_message)
        else:
            condition = new_condition("Failed", "True", "FailedJobs", JOBSET_FAILED_MESSAGE)
        counts = {"succeeded": 1} if outcome == "succeeded" else {"failed": 1}
        store.update("jobsets", namespace, name, lambda js: jobset_finished(js, condition))
        self._set_status(namespace, name, [condition], build_jobs_status(runtime, **counts))
        return outcome

    def _create_workload(self, job: dict, template: dict, num_nodes: int, scenario: Scenario) -> list[str]:
        """The JobSet and the node pods; none when the Trainer cannot create the JobSet or the API server rejects
        the pods (_podcreate.py: Warning events are all that shows, the controllers retry for ever)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        if scenario.resources_creation_error:
            message = f"TrainJob resources reconciliation failed: {scenario.resources_creation_error}"
            self.store.record_event(namespace, "TrainJob", name, RESOURCES_CREATION_FAILED, message)
            return []
        if self.store.find("jobsets", namespace, name) is None:
            self.store.put("jobsets", new_jobset(job), "ADDED")
        else:  # resumed: the Trainer unsuspends the JobSet it suspended
            self.store.update("jobsets", namespace, name, lambda js: js["spec"].update(suspend=False))
        if errors := pod_spec_errors(template.get("spec", {})):
            message = failed_create_message(f"{name}-node-0-0-{secrets.token_hex(3)[:5]}", errors)
            self.store.record_event(namespace, "Job", f"{name}-node-0", "FailedCreate", message)
            return []
        return [self._create_pod(job, template, rank, scenario) for rank in range(num_nodes)]

    def _start_failure(self, namespace: str, spec: dict) -> tuple[dict, list[dict]] | None:
        """Whether the kubelet can start the node container now (_startup.py): the image in the registry, the
        Secrets its env needs in the namespace."""
        with self.store.cond:
            present = {s["metadata"]["name"] for s in self.store.list_objects("secrets", namespace)}
            return start_failure(spec, registry=self.store.registry, secrets=present)

    def _wait_until_startable(
        self, namespace: str, pods: list[str], scenario: Scenario, wait: Wait, freed: int
    ) -> Outcome:
        """Pods wait until they can start, as the cluster retries for ever: unschedulable ones until a node frees
        up (kube-scheduler pkg/scheduler/backend/queue/scheduling_queue.go moves unschedulable pods back to the
        active queue on node add/update and assigned-pod delete events), then the kubelet retries a failed pull or
        a missing Secret at each pod sync (pkg/kubelet/pod_workers.go) until the image or the Secret is there."""
        store = self.store
        if unschedulable_event(scenario):
            while store.freed_nodes == freed:
                if outcome := wait(0.02):
                    return outcome
            for rank, pod in enumerate(pods):
                found = store.find("pods", namespace, pod)
                if found is None:
                    continue
                blocked = self._start_failure(namespace, found["spec"])
                store.update(
                    "pods", namespace, pod, lambda p, r=rank, b=blocked: mark_scheduled(p, r, scenario, b)
                )
                for event in blocked[1] if blocked else []:
                    store.record_event(
                        namespace, "Pod", pod, event["reason"], event["message"], event.get("type", "Warning")
                    )
        while any(
            (found := store.find("pods", namespace, pod)) is not None
            and self._start_failure(namespace, found["spec"])
            for pod in pods
        ):
            if outcome := wait(0.02):
                return outcome
        return None

    def _adopt_jobset(self, namespace: str, name: str, jobset: dict) -> None:
        """A JobSet of that name still exists (an earlier TrainJob's, not yet garbage-collected): the Trainer v2.3
        jobset plugin (pkg/runtime/framework/plugins/jobset/jobset.go) does not touch an existing unsuspended
        JobSet in Build, and Status copies its Completed/Failed conditions into the new TrainJob."""
        conditions = [
            {**c, "type": "Complete" if c["type"] == "Completed" else c["type"]}
            for c in (jobset.get("status") or {}).get("conditions") or []
            if c["type"] in ("Completed", "Failed") and c["status"] == "True"
        ]
        self._set_status(namespace, name, conditions or None, None)

    def _waiter(self, job: dict, run: JobRun, resumed_at: float | None) -> Wait:
        """A sleep that ends early with "cancel", "suspended" (Kueue preempted the job) or "deadline"
        (``spec.activeDeadlineSeconds``, from the creation or the last resume: reconcileDeadline)."""
        # creationTimestamp has second granularity: a seeded old job keeps its age, a new one starts now
        started = resumed_at or min(time.time(), parse_time(job["metadata"]["creationTimestamp"]) + 1.0)
        deadline = job["spec"].get("activeDeadlineSeconds")
        deadline_at = started + deadline if deadline else None
        key = ("trainjobs", job["metadata"]["namespace"], job["metadata"]["name"])

        def wait(seconds: float) -> Outcome:
            end = time.time() + seconds
            while True:
                if run.cancel.is_set() or self.store.stopping:
                    return "cancel"
                with self.store.cond:
                    if (self.store.objects.get(key) or {}).get("spec", {}).get("suspend"):
                        return "suspended"
                now = time.time()
                if deadline_at is not None and now >= deadline_at:
                    return "deadline"
                if now >= end:
                    return None
                run.cancel.wait(min(0.02, end - now))

        return wait

    def _attach_volumes(self, namespace: str, pods: list[str]) -> bool:
        """Record a FailedAttachVolume event for each pod whose ReadWriteOnce claim is attached to another node;
        such pods never start. True if any is blocked."""
        store = self.store
        with store.cond:
            claims = {
                c["metadata"]["name"]: c for c in store.list_objects("persistentvolumeclaims", namespace)
            }
            everyone = store.list_objects("pods", namespace)
        blocked = False
        for pod_name in pods:
            pod = next((p for p in everyone if p["metadata"]["name"] == pod_name), None)
            if pod is None:  # already deleted with its TrainJob (the garbage collector does not wait for us)
                continue
            others = [p for p in everyone if p["metadata"]["name"] not in pods]
            if error := multi_attach_error(pod, claims, others):
                store.record_event(namespace, "Pod", pod_name, "FailedAttachVolume", error, "Warning")
                blocked = True
        return blocked

    def _create_pod(self, job: dict, template: dict, rank: int, scenario: Scenario) -> str:
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        blocked = self._start_failure(namespace, template.get("spec", {}))
        pod = self.store.put("pods", new_pod(job, template, rank, scenario, blocked), "ADDED")
        pod_name = pod["metadata"]["name"]
        for event in scenario.pending_events:
            kind = event.get("kind", "Pod")
            if kind == "TrainJob" and rank:
                continue  # once per job, not per pod
            involved = name if kind == "TrainJob" else pod_name
            self.store.record_event(
                namespace,
                kind,
                involved,
                event["reason"],
                event.get("message", ""),
                event.get("type", "Warning"),
            )
        if blocked and pod["spec"].get("nodeName"):  # the kubelet of the node the pod was scheduled to
            for event in blocked[1]:
                self.store.record_event(
                    namespace,
                    "Pod",
                    pod_name,
                    event["reason"],
                    event["message"],
                    event.get("type", "Warning"),
                )
        return pod_name

    def _simulate_run(
        self, job: dict, pods: list[str], template: dict, scenario: Scenario, policy: JobPolicy, wait: Wait
    ) -> Outcome:
        """Rank 0 prints the log lines, then every pod ends. A failing trainer under ``restartPolicy: OnFailure``
        restarts in place until the restart counts pass ``backoffLimit``; under ``Never`` the failed pod is
        replaced until a podFailurePolicy rule fails the Job or the failures exceed ``backoffLimit``."""
        namespace = job["metadata"]["namespace"]
        failed = scenario.outcome == "fail"
        pod_failures = 0  # failed pods the Job controller counted (restartPolicy Never)
        node_lost_at = scenario.lost_node_after_lines  # once: None after it happened
        for rank, pod in enumerate(pods[1:], start=1):
            self.store.append_log(namespace, pod, f"node rank {rank} started\n")
        while True:
            replaced = False
            for index, line in enumerate(scenario.log_lines, start=1):
                self.store.append_log(namespace, pods[0], line.rstrip("\n") + "\n")
                if outcome := wait(scenario.line_interval):
                    return outcome
                if index == node_lost_at:
                    node_lost_at = None
                    if (
                        outcome := self._lose_node(job, pods, template, scenario, policy, wait)
                    ) != "replaced":
                        return outcome
                    replaced = True
                    break
            if replaced:
                continue
            if not failed:
                for pod in pods:
                    self.store.update("pods", namespace, pod, lambda p: mark_terminated(p, 0, "Completed"))
                return "succeeded"
            code, reason = scenario.exit_code, "OOMKilled" if scenario.oom_killed else "Error"
            crashed = pods[scenario.failed_rank]
            if policy.restart_policy == "OnFailure":  # the kubelet restarts the container in place
                restarts = restart_count(self.store.find("pods", namespace, crashed)) + 1
                shown = crash_loop_delay(restarts, 1.0)  # what the kubelet reports; the wait is scaled
                self.store.update(
                    "pods",
                    namespace,
                    crashed,
                    lambda p, c=code, r=reason, s=shown: mark_crash_looping(p, c, r, s),
                )
                self.store.record_event(
                    namespace,
                    "Pod",
                    crashed,
                    "BackOff",
                    f"Back-off restarting failed container node in pod {crashed}_{namespace}",
                    "Warning",
                )
                if outcome := wait(shown * scenario.restart_backoff_scale):
                    return outcome
                self.store.restart_log(namespace, crashed)
                self.store.update("pods", namespace, crashed, mark_restarted)
                total = sum(restart_count(self.store.find("pods", namespace, p) or {}) for p in pods)
                if restarts_exceed_limit(policy, total):
                    self._fail_node_job(job, BACKOFF_LIMIT_EXCEEDED, delete=pods)
                    return "failed"
                continue
            self.store.update(
                "pods", namespace, crashed, lambda p, c=code, r=reason: mark_terminated(p, c, r)
            )
            action, message = match_pod_failure_policy(
                policy, self.store.find("pods", namespace, crashed)
            ) or (
                "Count",
                "",
            )
            pod_failures += action == "Count"
            if action == "FailJob":
                ended = ("PodFailurePolicy", message)
            elif action == "Ignore" or pod_failures <= policy.backoff_limit:
                # the Job controller replaces the failed pod (after its pod back-off) and the trainer starts over
                if outcome := wait(crash_loop_delay(max(pod_failures, 1), scenario.restart_backoff_scale)):
                    return outcome
                rank = scenario.failed_rank
                pods[rank] = self._create_pod(
                    job, template, rank, dataclasses.replace(scenario, pending_events=())
                )
                self.store.update("pods", namespace, pods[rank], mark_running)
                continue
            else:
                ended = BACKOFF_LIMIT_EXCEEDED
            # The failed pod is kept (restartPolicy Never); the other ranks are active pods of a failed Job.
            self._fail_node_job(job, ended, delete=[p for p in pods if p != crashed])
            return "failed"

    def _lose_node(
        self, job: dict, pods: list[str], template: dict, scenario: Scenario, policy: JobPolicy, wait: Wait
    ) -> Outcome:
        """The node of ``scenario.lost_node_rank`` is lost (_disruption.py): "replaced" when the Job replaced its
        pod (the trainer starts over), else how the job ended."""
        namespace, rank = job["metadata"]["namespace"], scenario.lost_node_rank
        lost = self.store.update("pods", namespace, pods[rank], mark_disrupted)
        action, message = match_pod_failure_policy(policy, lost or {}) or ("Count", "")
        if action == "FailJob" or (action == "Count" and policy.backoff_limit == 0):
            ended = ("PodFailurePolicy", message) if action == "FailJob" else BACKOFF_LIMIT_EXCEEDED
            for pod in pods:
                if pod != pods[rank]:
                    self.store.update("pods", namespace, pod, lambda p: mark_terminated(p, 143, "Error"))
            self._fail_node_job(job, ended, delete=[])
            return "failed"
        if outcome := wait(crash_loop_delay(1, scenario.restart_backoff_scale)):
            return outcome
        if gone := self.store.find("pods", namespace, pods[rank]):  # PodGC deletes it
            self.store.put("pods", gone, "DELETED")
        pods[rank] = self._create_pod(job, template, rank, dataclasses.replace(scenario, pending_events=()))
        self.store.update("pods", namespace, pods[rank], mark_running)
        return "replaced"

    def _replace_pod(
        self, job: dict, template: dict, rank: int, scenario: Scenario, lost_node: str | None
    ) -> str | None:
        """The Job controller's new pod for ``rank`` after a disrupted one, scheduled and started; None when it
        cannot be scheduled: pinned (required node affinity) to ``lost_node``, a node that no longer exists."""
        namespace = job["metadata"]["namespace"]
        name = self._create_pod(job, template, rank, dataclasses.replace(scenario, pending_events=()))
        pod = self.store.find("pods", namespace, name) or {}
        if lost_node and pod.get("spec", {}).get("nodeName") == lost_node:
            if required_node(pod["spec"]) == lost_node:
                self.store.update("pods", namespace, name, lambda p: mark_unschedulable(p, NO_NODE_MATCHES))
                self.store.record_event(namespace, "Pod", name, "FailedScheduling", NO_NODE_MATCHES)
                return None
            self.store.update(
                "pods", namespace, name, lambda p: p["spec"].update(nodeName=f"{lost_node}-spare")
            )
        self.store.update("pods", namespace, name, mark_running)
        node = (self.store.find("pods", namespace, name) or pod)["spec"].get("nodeName")
        self.store.record_event(
            namespace,
            "Pod",
            name,
            "Scheduled",
            f"Successfully assigned {namespace}/{name} to {node}",
            "Normal",
        )
        self.store.record_event(namespace, "Pod", name, "Started", "Started container node", "Normal")
        return name

    def _fail_node_job(self, job: dict, ended: tuple[str, str], delete: list[str]) -> None:
        """The Job controller fails the ``node`` Job: a Warning event with its reason, then deletes active pods
        (job_controller.go: the finished condition as an event, deleteActivePods)."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        self.store.record_event(namespace, "Job", f"{name}-node-0", *ended, "Warning")
        for pod in delete:
            self._delete_pod(namespace, pod)

    def _delete_pod(self, namespace: str, pod: str) -> None:
        """A graceful pod delete by a controller: deletionTimestamp, the kubelet stops the container (SIGTERM:
        exit code 143), then the pod is removed (pkg/registry/core/pod/strategy.go, kubelet killPod)."""

        def stop(p: dict) -> None:
            mark_terminating(p)
            if not any("terminated" in c.get("state", {}) for c in p["status"].get("containerStatuses", [])):
                mark_terminated(p, 143, "Error")  # else the exit the kubelet reported stays (_execute.py)

        with self.store.cond:
            if (stopped := self.store.update("pods", namespace, pod, stop)) is not None:
                self.store.put("pods", stopped, "DELETED")

    def _set_status(
        self, namespace: str, name: str, conditions: list[dict] | None, jobs_status: list[dict] | None
    ) -> None:
        def mutate(job: dict) -> None:
            status = job.setdefault("status", {})
            if (
                conditions is not None
            ):  # by type, as meta.SetStatusCondition: Suspended stays next to Complete
                kept = [
                    c
                    for c in status.get("conditions") or []
                    if c["type"] not in {n["type"] for n in conditions}
                ]
                status["conditions"] = kept + conditions
            if jobs_status is not None:
                status["jobsStatus"] = jobs_status

        self.store.update("trainjobs", namespace, name, mutate)


def _no_kueue(namespace: str, name: str) -> None:
    raise RuntimeError(f"TrainJob {namespace}/{name}: no Kueue to preempt its workload")
