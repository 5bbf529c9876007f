"""Execute mode's GPUs: the host devices a node pod's container sees, as the NVIDIA device plugin hands them out.

Upstream, NVIDIA/k8s-device-plugin allocates devices per container from its node's free ones for the container's
``nvidia.com/gpu`` limit (an extended resource: requests, if given, equal limits), and the NVIDIA container
toolkit exposes only those in the container. Here a pool of host indices (``KubeStandin.execute(gpus=...)``) plays
the node's devices: a node pod's process gets its limit's worth of distinct free ones as CUDA_VISIBLE_DEVICES and
gives them back when it ends; one without that limit gets none (CUDA_VISIBLE_DEVICES empty), as a container
without a GPU request sees none on such a node. The indices are the stand-in process's own (its CUDA_VISIBLE_DEVICES
numbering). An empty pool assigns nothing (every process sees what the test process sees).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

GPU_RESOURCE = "nvidia.com/gpu"


class GpuPool:
    """The host GPU indices execute mode hands out; thread-safe (node processes end on their reader threads)."""

    def __init__(self, gpus: Sequence[int] = ()) -> None:
        if len(set(gpus)) != len(gpus) or any(not isinstance(g, int) or g < 0 for g in gpus):
            raise ValueError(f"gpus must be distinct host GPU indices >= 0 (got {list(gpus)})")
        self.assigns = bool(gpus)  # an empty pool leaves CUDA_VISIBLE_DEVICES alone
        self._free = list(gpus)
        self._lock = threading.Lock()

    def take(self, count: int, pod: str) -> tuple[int, ...]:
        """`count` distinct free devices for `pod`; ValueError when fewer are free (on a cluster the pod would not
        be scheduled on this node)."""
        with self._lock:
            if count > len(self._free):
                raise ValueError(
                    f"pod {pod} limits {GPU_RESOURCE}: {count}, but only {len(self._free)} of the host GPUs "
                    f"given to execute mode are free: give KubeStandin.execute(gpus=...) more, or ask for fewer"
                )
            taken, self._free = tuple(self._free[:count]), self._free[count:]
            return taken

    def give_back(self, devices: tuple[int, ...]) -> None:
        with self._lock:
            self._free = sorted([*self._free, *devices])


def gpu_limit(container: dict) -> int:
    """The container's ``nvidia.com/gpu`` limit (0 without one)."""
    return int(((container.get("resources") or {}).get("limits") or {}).get(GPU_RESOURCE) or 0)
