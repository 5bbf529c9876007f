"""Execute mode: a TrainJob's node commands as local subprocesses, their output as the pods' logs (see
``KubeStandin.execute``)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable

from ._store import Store
from ._workload import ExecuteConfig, free_port, kill_processes, local_command, mark_terminated


def run_processes(
    store: Store,
    namespace: str,
    pods: list[str],
    config: ExecuteConfig,
    processes: list[subprocess.Popen],
    wait: Callable[[float], str | None],
    *,
    delete_pod: Callable[[str, str], None],
) -> str | None:
    """Each node pod's command as a local process until all ended: "succeeded", "failed", or what ended the
    wait (``wait``'s outcome)."""
    master_port = free_port()  # not 29400: jobs of parallel tests must not meet on one rendezvous port
    readers = []
    for pod_name in pods:
        pod = store.find("pods", namespace, pod_name)
        process = None
        try:
            argv, env, cwd = local_command(pod, config, master_port)
            process = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # so a kill reaches the whole process group (torchrun's workers)
            )
            processes.append(process)
        except (OSError, ValueError) as error:
            store.append_log(namespace, pod_name, f"kube-standin: cannot start node command: {error}\n")
        reader = threading.Thread(target=_pump_log, args=(store, namespace, pod_name, process), daemon=True)
        reader.start()
        readers.append((pod_name, process, reader))
    exit_codes: dict[str, int] = {}
    failed = False
    while len(exit_codes) < len(readers):
        for pod_name, process, reader in readers:
            code = 127 if process is None else process.poll()
            if pod_name in exit_codes or code is None:
                continue
            reader.join(timeout=5)  # the whole log is in before the pod turns terminal
            exit_code = exit_codes[pod_name] = 128 - code if code < 0 else code
            # An active pod of the failed Job: the Job controller deletes it (deleteActivePods).
            if failed:
                delete_pod(namespace, pod_name)
                continue
            reason = "Completed" if exit_code == 0 else "Error"
            store.update(
                "pods", namespace, pod_name, lambda p, c=exit_code, r=reason: mark_terminated(p, c, r)
            )
            if exit_code != 0:
                failed = True
                kill_processes(processes)  # the Job fails, its other pods are deleted
        if len(exit_codes) < len(readers) and (outcome := wait(0.02)):
            return outcome
    return "succeeded" if not any(exit_codes.values()) else "failed"


def _pump_log(store: Store, namespace: str, pod: str, process: subprocess.Popen | None) -> None:
    if process is None or process.stdout is None:
        return
    for raw in iter(process.stdout.readline, b""):
        store.append_log(namespace, pod, raw.decode(errors="replace"))
    process.stdout.close()
