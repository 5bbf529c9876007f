"""Node containers the kubelet cannot start: an image it cannot pull, a Secret the container's env needs that
does not exist. What the pod status and the events then show, as the kubelet writes them."""

from __future__ import annotations

from ._types import Scenario

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


def start_failure(spec: dict, scenario: Scenario) -> tuple[dict, list[dict]] | None:
    """The node container's waiting state and the kubelet's events when it cannot be started, else None.

    A missing Secret is found before the image is pulled only if the image is present; the kubelet pulls first
    (EnsureImageExists, then generateContainerConfig), so an unpullable image wins."""
    container = _node_container(spec)
    if container is None:
        return None
    image = container.get("image", "")
    if scenario.unpullable_image:
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
    missing = [name for name in referenced_secrets(container) if name in scenario.missing_secrets]
    if missing:
        # kuberuntime_container.go: generateContainerConfig fails -> waiting CreateContainerConfigError with the
        # error's message; the secret manager's NotFound reads `secret "<name>" not found`.
        message = f'secret "{missing[0]}" not found'
        return {"reason": "CreateContainerConfigError", "message": message}, [
            {"reason": "Failed", "message": f"Error: {message}"}
        ]
    return None
