"""Execute mode's node container as a local process (see ``KubeStandin.execute``): its command line and environment
with the mapped volumes rewritten to local folders, a temp folder of its own, and the processes it holds."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

from ._devices import GpuPool
from ._workload import expand_kube_vars


@dataclasses.dataclass
class ExecuteConfig:
    """Execute mode settings (see ``KubeStandin.execute``): volume name or claimName -> local dir, extra env, the
    host GPUs node pods get (_devices.py)."""

    volume_dirs: dict[str, str]
    extra_env: dict[str, str]
    gpus: GpuPool = dataclasses.field(default_factory=GpuPool)
    # Each pod's container gets a temp folder of its own under this (TMPDIR), as each container has its own /tmp.
    temp_root: str = dataclasses.field(default_factory=lambda: tempfile.mkdtemp(prefix="kube-standin-pods-"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def resolve_field_ref(pod: dict, path: str) -> str | None:
    """The value of an env ``fieldRef`` (downward API) for a pod running on 127.0.0.1."""
    if match := re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path):
        return (pod["metadata"].get(match.group(1)) or {}).get(match.group(2))
    return {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"]["uid"],
        "spec.nodeName": pod["spec"].get("nodeName"),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
    }.get(path)


def local_command(
    pod: dict, config: ExecuteConfig, port: int, command: list[str] | None = None
) -> tuple[list[str], dict[str, str], str | None]:
    """argv, env and cwd of the pod's node container with mapped volumes rewritten to local directories
    (`command`: one run in the container, a lifecycle hook's exec, instead of the container's own)."""
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
    mounts: list[tuple[str, str]] = []
    for volume in pod["spec"].get("volumes", []):
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        local = config.volume_dirs.get(volume["name"]) or (claim and config.volume_dirs.get(claim))
        if not local:
            continue
        for mount in container.get("volumeMounts", []):
            if mount["name"] == volume["name"]:
                target = os.path.join(local, mount["subPath"]) if mount.get("subPath") else local
                mounts.append((mount["mountPath"].rstrip("/") or "/", target))
    mounts.sort(key=lambda m: len(m[0]), reverse=True)

    def rewrite(text: str) -> str:
        for mount_path, local in mounts:
            text = re.sub(
                r"(?<![\w.\-/])" + re.escape(mount_path) + r"(?=/|$|[^\w.\-])", lambda _, d=local: d, text
            )
        return text

    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = rewrite(expand_kube_vars(entry["value"], env))
        elif field := (entry.get("valueFrom") or {}).get("fieldRef"):
            value = resolve_field_ref(pod, field["fieldPath"])
            if value is not None:
                env[entry["name"]] = value
    env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
    env.update(config.extra_env)
    env["TMPDIR"] = os.path.join(config.temp_root, pod["metadata"]["name"])
    env[CONTAINER_ENV] = pod["metadata"]["uid"]  # what container_pids finds the container's processes by
    os.makedirs(env["TMPDIR"], exist_ok=True)
    if command is None and not container.get("command"):
        raise ValueError(
            "the node container has no command (the image entrypoint is unknown to the stand-in)"
        )
    if command is None:  # the kubelet expands $(VAR) in a container's command and args, not in its hooks'
        argv = [
            rewrite(expand_kube_vars(part, env)) for part in container["command"] + container.get("args", [])
        ]
    else:
        argv = [rewrite(part) for part in command]
    cwd = rewrite(container["workingDir"]) if container.get("workingDir") else None
    return argv, {**os.environ, **env}, cwd


#: Marks the processes of one pod's container (its name), which every process it starts inherits.
CONTAINER_ENV = "KUBE_STANDIN_CONTAINER"


def container_pids(pod_uid: str) -> list[int]:
    """The processes of the pod's container: those whose environment carries its mark, as a container's cgroup
    holds every process started in it (in a session of its own, or left behind by a parent that exited)."""
    mark = f"{CONTAINER_ENV}={pod_uid}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def kill_processes(processes: list[subprocess.Popen]) -> None:
    """SIGTERM each live process's group, as the kubelet stops a container."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
