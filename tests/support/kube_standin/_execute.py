"""Execute mode: a TrainJob's node commands as local subprocesses, their output as the pods' logs (see
``KubeStandin.execute``), and a node pod disrupted while it trains (``Scenario.preempt_on_line`` /
``lose_node_on_line``; _disruption.py names the upstream behaviour)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable

from ._container import ExecuteConfig, container_pids, free_port, kill_processes, local_command
from ._devices import gpu_limit
from ._disruption import PREEMPTION, WORKLOAD_PREEMPTION, Disruption, mark_disrupted, mark_preempted
from ._gc import DEFAULT_TERMINATION_GRACE_SECONDS, mark_terminating
from ._jobpolicy import BACKOFF_LIMIT_EXCEEDED, JobPolicy, crash_loop_delay, match_pod_failure_policy
from ._store import Store
from ._types import Scenario
from ._workload import mark_terminated

Wait = Callable[[float], str | None]


@dataclasses.dataclass
class NodeProcess:
    """One node pod's container process (None: it could not start) and the thread copying its output."""

    pod: str
    process: subprocess.Popen | None
    uid: str = ""  # the pod's: the mark of its container's processes (_container.container_pids)
    reader: threading.Thread | None = None
    kill_at: float | None = None  # when a graceful delete's grace period ends: SIGKILL
    disruption: Disruption | None = None
    gpus: tuple[int, ...] = ()  # host GPUs of the pod's container, given back when it ended (_devices.py)


@dataclasses.dataclass
class JobControls:
    """What the Job controller does for the node pods, from the simulated controller (_controller.py)."""

    policy: JobPolicy
    delete_pod: Callable[[str, str], None]  # a graceful delete of an active pod (the Job failed)
    replace_pod: Callable[[int, str | None], str | None]  # rank, lost node -> the new running pod, or None
    fail_job: Callable[[tuple[str, str]], None]  # the Job's failure event (reason, message)
    preempt_workload: Callable[[], None]  # Kueue evicts the TrainJob's workload: it is suspended


class NodeProcesses:
    """The node pods of one start of a TrainJob, their commands run as local processes."""

    def __init__(
        self,
        store: Store,
        namespace: str,
        config: ExecuteConfig,
        processes: list[subprocess.Popen],
        scenario: Scenario,
        controls: JobControls,
    ) -> None:
        self.store, self.namespace, self.config = store, namespace, config
        self.processes, self.scenario, self.controls = processes, scenario, controls
        self.master_port = (
            free_port()
        )  # not 29400: jobs of parallel tests must not meet on one rendezvous port
        self.nodes: dict[int, NodeProcess] = {}
        self._planned = Disruption.of(scenario)  # once: None after it happened
        self._lock = threading.Lock()
        self._failed_pods = 0  # the Job's pod-failure back-off counts every failed pod (ignored ones too)
        self._counted_failures = 0  # failures counted against backoffLimit

    def run(self, pods: list[str], wait: Wait) -> str | None:
        """Until every pod ended: "succeeded", "failed", or what ended the wait (``wait``'s outcome)."""
        for rank, pod_name in enumerate(pods):
            self._start(rank, pod_name)
        exit_codes: dict[int, int] = {}
        failed = False
        while len(exit_codes) < len(self.nodes):
            for rank, node in list(self.nodes.items()):
                if rank in exit_codes or (code := self._poll(node)) is None:
                    continue
                # An active pod of the failed Job: the Job controller deletes it (deleteActivePods).
                if failed:
                    exit_codes[rank] = code
                    self.controls.delete_pod(self.namespace, node.pod)
                    continue
                # restartPolicy OnFailure would restart a failed container in place, which execute mode does not
                # do: the Job fails at once instead, never kinder than the cluster.
                if node.disruption is None and (code == 0 or self.controls.policy.restart_policy != "Never"):
                    reason = "Completed" if code == 0 else "Error"
                    self.store.update(
                        "pods", self.namespace, node.pod, lambda p, c=code, r=reason: mark_terminated(p, c, r)
                    )
                    exit_codes[rank] = code
                    if code != 0:
                        failed = True
                        kill_processes(self.processes)  # the Job fails, its other pods are deleted
                    continue
                ended = self._pod_ended(rank, node, code, wait)
                if ended == "replaced":
                    continue
                if ended not in ("succeeded", "failed"):
                    return ended
                exit_codes[rank] = 0 if ended == "succeeded" else code or 1
                if ended == "failed":
                    failed = True
                    kill_processes(self.processes)  # the Job fails, its other pods are deleted
            if len(exit_codes) < len(self.nodes) and (outcome := wait(0.02)):
                if outcome == "suspended":
                    self._stop_running([n for r, n in self.nodes.items() if r not in exit_codes])
                return outcome
        return "succeeded" if not any(exit_codes.values()) else "failed"

    def _stop_running(self, nodes: list[NodeProcess]) -> None:
        """The Job was suspended (Kueue preempted the workload; the JobSet suspends its Jobs): the Job controller
        deletes the active pods (job_controller.go deleteActivePods: a graceful delete), the kubelet stops each
        container (_stop_container) and reports its own exit; a pod the Job then removes keeps it. The stand-in
        stopping meanwhile kills what is left."""
        stopping = []
        for node in nodes:
            pod = self.store.update("pods", self.namespace, node.pod, mark_terminating)
            if pod is None or node.process is None or node.process.poll() is not None:
                continue
            self.store.record_event(
                self.namespace, "Pod", node.pod, "Killing", "Stopping container node", "Normal"
            )
            self._stop_container(
                node, pod, pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_SECONDS)
            )
            stopping.append(node)
        for node in stopping:
            while (code := self._poll(node)) is None:
                if self.store.stopping:
                    _signal_container(node, signal.SIGKILL)
                time.sleep(0.02)
            _signal_container(node, signal.SIGKILL)  # the container's other processes end with it
            reason = "Completed" if code == 0 else "Error"
            self.store.update(
                "pods", self.namespace, node.pod, lambda p, c=code, r=reason: mark_terminated(p, c, r)
            )

    # One pod's process ------------------------------------------------------------------------------------------

    def _start(self, rank: int, pod_name: str) -> None:
        pod = self.store.find("pods", self.namespace, pod_name)
        node = NodeProcess(pod_name, None, pod["metadata"]["uid"])
        try:
            argv, env, cwd = local_command(pod, self.config, self.master_port)
            if self.config.gpus.assigns:
                container = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
                node.gpus = self.config.gpus.take(gpu_limit(container), pod_name)
                env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, node.gpus))
            node.process = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # so a kill reaches the whole process group (torchrun's workers)
            )
            self.processes.append(node.process)
        except (OSError, ValueError) as error:
            self._give_back_gpus(node)
            self.store.append_log(
                self.namespace, pod_name, f"kube-standin: cannot start node command: {error}\n"
            )
        self.nodes[rank] = node
        node.reader = threading.Thread(target=self._pump_log, args=(rank, node), daemon=True)
        node.reader.start()

    def _poll(self, node: NodeProcess) -> int | None:
        """The container's exit code once it ended (signals as 128+N), its whole log read by then."""
        if node.kill_at is not None and time.monotonic() >= node.kill_at:
            node.kill_at = None
            _signal_container(node, signal.SIGKILL)  # the grace period is over
        code = 127 if node.process is None else node.process.poll()
        if code is None:
            return None
        if node.disruption is not None:  # the container's other processes go with its main one
            _signal_container(node, signal.SIGKILL)
        if node.reader is not None:
            node.reader.join(timeout=5)  # the whole log is in before the pod turns terminal
        self._give_back_gpus(node)
        return 128 - code if code < 0 else code

    def _give_back_gpus(self, node: NodeProcess) -> None:
        with self._lock:  # once: the pod's end is seen by its reader and by the poll
            gpus, node.gpus = node.gpus, ()
        self.config.gpus.give_back(gpus)

    def _pump_log(self, rank: int, node: NodeProcess) -> None:
        process = node.process
        if process is None or process.stdout is None:
            return
        for raw in iter(process.stdout.readline, b""):
            line = raw.decode(errors="replace")
            self.store.append_log(self.namespace, node.pod, line)
            self._maybe_disrupt(rank, line)
        process.stdout.close()
        process.wait()  # the container's processes are gone (none holds its output open): its GPUs are free
        self._give_back_gpus(node)

    # Disruption ---------------------------------------------------------------------------------------------

    def _maybe_disrupt(self, rank: int, line: str) -> None:
        """At the scenario's line in rank 0's log, where training logs (in its reader thread, so the process has
        gone no further than a pipe's worth): the scheduler preempts the planned rank's pod, or its node is lost."""
        with self._lock:
            planned = self._planned
            if planned is None or rank != 0 or planned.on_line not in line or planned.rank not in self.nodes:
                return
            self._planned = None
            node = self.nodes[planned.rank]
        if planned.kind == WORKLOAD_PREEMPTION:  # the Job's graceful stop of its pods follows (_stop_running)
            _signal_container(node, signal.SIGSTOP)
            self.controls.preempt_workload()
            return
        node.disruption = planned
        if planned.kind == PREEMPTION:
            pod = self.store.update("pods", self.namespace, node.pod, mark_preempted)
            if pod is None:
                return
            self.store.record_event(
                self.namespace,
                "Pod",
                node.pod,
                "Preempted",
                f"Preempted by pod {uuid.uuid4()} on node {pod['spec'].get('nodeName')}",
                "Normal",
            )
            grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_TERMINATION_GRACE_SECONDS)
            self.store.update("pods", self.namespace, node.pod, mark_terminating)  # the scheduler's DELETE
            self.store.record_event(
                self.namespace, "Pod", node.pod, "Killing", "Stopping container node", "Normal"
            )
            self._stop_container(node, pod, grace)
        else:  # the node is gone, and every process of the pod with it
            _signal_container(node, signal.SIGKILL)

    def _stop_container(self, node: NodeProcess, pod: dict, grace: float) -> None:
        """The kubelet stops the node container (kuberuntime_container.go killContainer): its preStop exec hook
        first, given at most the grace period (a failed hook: a FailedPreStopHook event, and the stop goes on),
        then SIGTERM to the main process and SIGKILL when the rest of the grace period is over (at least 2 s,
        minimumGracePeriodInSeconds). The hook runs in a thread of its own, as the kubelet's does, while the
        reader goes on copying the log.

        Synchronisation for tests (the kubelet does not do it): the container's processes are stopped (SIGSTOP)
        from the disruption until the hook printed its first line or ended, so a short run cannot finish in the
        moment a hook process takes to start."""
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
        hook = (((container.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command")
        if not hook or node.process is None or node.process.poll() is not None:
            node.kill_at = time.monotonic() + grace
            _terminate(node.process)
            # Held since the disruption's line (kueue_preempt_on_line): it goes on, and handles the SIGTERM.
            _signal_container(node, signal.SIGCONT)
            return
        _signal_container(node, signal.SIGSTOP)
        started = time.monotonic()

        def stop() -> None:
            if not self._run_hook(node, pod, hook, grace):
                # kuberuntime_container.go executePreStopHook: the event carries no output, so that no secret leaks
                self.store.record_event(
                    self.namespace, "Pod", node.pod, "FailedPreStopHook", "PreStopHook failed", "Warning"
                )
            node.kill_at = time.monotonic() + max(grace - (time.monotonic() - started), 2)
            _terminate(node.process)

        threading.Thread(target=stop, daemon=True).start()

    def _run_hook(self, node: NodeProcess, pod: dict, hook: list[str], grace: float) -> bool:
        """The exec hook in the container, at most `grace` seconds; whether it exited 0. The container's processes
        go on once the hook printed its first line or ended (see _stop_container)."""
        try:
            argv, env, cwd = local_command(pod, self.config, self.master_port, command=hook)
            process = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except (OSError, ValueError):
            _signal_container(node, signal.SIGCONT)
            return False
        self.processes.append(process)

        def read() -> None:
            for number, _ in enumerate(iter(process.stdout.readline, b"")):
                if number == 0:
                    _signal_container(node, signal.SIGCONT)
            _signal_container(node, signal.SIGCONT)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            code = process.wait(timeout=grace)
        except subprocess.TimeoutExpired:  # the kubelet stops waiting; the container is killed soon after
            process.kill()
            process.wait()
            code = None
        reader.join(timeout=5)
        return code == 0

    def _pod_ended(self, rank: int, node: NodeProcess, code: int, wait: Wait) -> str | None:
        """A disrupted pod's process ended, or a pod's process failed: the kubelet's (or PodGC's) last word on the
        pod, then the Job controller's, which applies the podFailurePolicy to every failed pod
        (pod_failure_policy.go): "replaced", "succeeded", "failed", or what ended the wait. A disrupted pod is
        being deleted and goes; a failed one stays (restartPolicy Never), also when the Job replaces it."""
        namespace, disruption = self.namespace, node.disruption
        if disruption is None or disruption.kind == PREEMPTION:
            reason = "Completed" if code == 0 else "Error"
            pod = self.store.update("pods", namespace, node.pod, lambda p: mark_terminated(p, code, reason))
        else:  # PodGC: phase Failed, container statuses as the lost kubelet last reported them
            pod = self.store.update("pods", namespace, node.pod, mark_disrupted)
        lost_node = (
            (pod or {}).get("spec", {}).get("nodeName")
            if disruption is not None and disruption.kind != PREEMPTION
            else None
        )
        if pod is not None and pod["status"]["phase"] == "Succeeded":
            self._remove(node.pod)
            return "succeeded"
        action, message = match_pod_failure_policy(self.controls.policy, pod or {}) or ("Count", "")
        self._failed_pods += 1
        self._counted_failures += action == "Count"
        if action == "FailJob" or self._counted_failures > self.controls.policy.backoff_limit:
            self.controls.fail_job(
                ("PodFailurePolicy", message) if action == "FailJob" else BACKOFF_LIMIT_EXCEEDED
            )
            if disruption is not None:
                self._remove(node.pod)
            return "failed"
        # podReplacementPolicy Failed: a replacement once the pod is terminal, after the pod-failure back-off
        if outcome := wait(crash_loop_delay(self._failed_pods, self.scenario.restart_backoff_scale)):
            return outcome
        if disruption is not None:
            self._remove(node.pod)
        replacement = self.controls.replace_pod(rank, lost_node)
        if replacement is None:  # it can never start: the job waits for its deadline or deletion
            del self.nodes[rank]
            return wait(float("inf"))
        self._start(rank, replacement)
        return "replaced"

    def _remove(self, pod_name: str) -> None:
        """The terminal pod goes (the deleting controller's request completes once the Job has counted it)."""
        with self.store.cond:
            if (pod := self.store.find("pods", self.namespace, pod_name)) is not None:
                self.store.put("pods", pod, "DELETED")


def _terminate(process: subprocess.Popen | None) -> None:
    """SIGTERM to the container's main process only (the runtime signals its init process)."""
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)


def _signal_container(node: NodeProcess, signum: int) -> None:
    """`signum` to every process of the node pod's container, as the runtime signals a container's cgroup: its main
    process and all it started, also those in sessions of their own (torchrun's workers: torch elastic
    subprocess_handler.py) or left behind by a parent that exited."""
    pids = set(container_pids(node.uid)) | ({node.process.pid} if node.process is not None else set())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
