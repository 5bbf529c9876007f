"""Node containers the kubelet cannot start: an image it cannot pull, a Secret the container's env needs that
does not exist. What the pod status and the events then show, as the kubelet writes them.

The kubelet keeps retrying both (pkg/kubelet/pod_workers.go re-syncs the pod with back-off): once the image is
in the registry or the Secret exists, the container starts. Images: only those in the stand-in's registry list
can be pulled (``KubeStandin(images=...)``, ``push_image``); references are compared the way the container
runtime resolves them (distribution/reference ParseNormalizedNamed: ``docker.io`` and ``library/`` implied,
``:latest`` when no tag or digest is given).
"""

from __future__ import annotations

from collections.abc import Collection

from kfp_finetune import __version__
from kfp_finetune.components._shared import images

DOCKER_HUB = "docker.io"
#: What the stand-in's registry holds unless a test says otherwise: the project's images (as published and as
#: configured for this process) and the torch image ``KubeStandin.add_runtime`` uses.
DEFAULT_IMAGES = (
    f"ghcr.io/kfp-finetune/kfp-finetune-trainer:{__version__}",
    f"ghcr.io/kfp-finetune/kfp-finetune-component:{__version__}",
    f"ghcr.io/kfp-finetune/kfp-finetune-trainer-transformers:{__version__}",
    images.TRAINER_IMAGE,
    images.TRANSFORMERS_TRAINER_IMAGE,
    images.COMPONENT_IMAGE,
    "pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime",
)


def normalize_image(reference: str) -> str:
    """The fully qualified reference a container runtime pulls (``busybox`` -> ``docker.io/library/busybox:latest``)."""
    name, digest = reference.split("@", 1) if "@" in reference else (reference, "")
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        first, rest = DOCKER_HUB, name
    if first == DOCKER_HUB and "/" not in rest:
        rest = f"library/{rest}"
    if not digest and ":" not in rest.rsplit("/", 1)[-1]:
        rest += ":latest"
    return f"{first}/{rest}" + (f"@{digest}" if digest else "")


#: kubelet pkg/kubelet/images/image_manager.go (EnsureImageExists): a failed pull records a ``Failed`` event
#: ``Failed to pull image "<image>": <CRI error>`` and the container waits in ``ErrImagePull``; the next sync
#: backs off: a ``BackOff`` event ``Back-off pulling image "<image>"`` and the waiting reason ``ImagePullBackOff``
#: (the two alternate while the back-off grows to 5 minutes). pkg/kubelet/kuberuntime/kuberuntime_container.go
#: (startContainer) adds a ``Failed`` event ``Error: <reason>`` for each.
PULL_ERROR = (
    'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": failed to resolve reference '
    '"{image}": {image}: not found'
)


def _node_container(spec: dict) -> dict | None:
    return next((c for c in spec.get("containers") or [] if c.get("name") == "node"), None)


def referenced_secrets(container: dict) -> list[str]:
    """Secrets a container's env needs: ``env[].valueFrom.secretKeyRef`` and ``envFrom[].secretRef`` that are
    not ``optional`` (kubelet pkg/kubelet/kubelet_pods.go makeEnvironmentVariables)."""
    names = []
    for entry in container.get("envFrom") or []:
        ref = entry.get("secretRef") or {}
        if ref.get("name") and not ref.get("optional"):
            names.append(ref["name"])
    for entry in container.get("env") or []:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef") or {}
        if ref.get("name") and not ref.get("optional"):
            names.append(ref["name"])
    return names


def start_failure(
    spec: dict, *, registry: Collection[str], secrets: Collection[str]
) -> tuple[dict, list[dict]] | None:
    """The node container's waiting state and the kubelet's events when it cannot be started, else None.

    ``registry``: the normalized image references that can be pulled; ``secrets``: the names of the Secrets in
    the pod's namespace. A missing Secret is found before the image is pulled only if the image is present; the
    kubelet pulls first (EnsureImageExists, then generateContainerConfig), so an unpullable image wins."""
    container = _node_container(spec)
    if container is None:
        return None
    image = container.get("image", "")
    if normalize_image(image) not in registry:
        error = PULL_ERROR.format(image=image)
        back_off = f'Back-off pulling image "{image}"'
        waiting = {"reason": "ImagePullBackOff", "message": back_off}
        events = [
            {"reason": "Pulling", "message": f'Pulling image "{image}"', "type": "Normal"},
            {"reason": "Failed", "message": f'Failed to pull image "{image}": {error}'},
            {"reason": "Failed", "message": "Error: ErrImagePull"},
            {"reason": "BackOff", "message": back_off, "type": "Normal"},
            {"reason": "Failed", "message": "Error: ImagePullBackOff"},
        ]
        return waiting, events
    missing = [name for name in referenced_secrets(container) if name not in secrets]
    if missing:
        # kuberuntime_container.go: generateContainerConfig fails -> waiting CreateContainerConfigError with the
        # error's message; the secret manager's NotFound reads `secret "<name>" not found`.
        message = f'secret "{missing[0]}" not found'
        return {"reason": "CreateContainerConfigError", "message": message}, [
            {"reason": "Failed", "message": f"Error: {message}"}
        ]
    return None
