"""Node pods that are disrupted or replaced while a TrainJob runs: said in the step log as soon as the pod watch
shows them, so a lost node is not waited on in silence until the timeout.

A pod whose node is lost, drained or preempted gets the `DisruptionTarget` condition (PodGC: `DeletionByPodGC`,
taint eviction: `DeletionByTaintManager`, preemption: `PreemptionByScheduler`, eviction API: `EvictionByEvictionAPI`;
kubernetes pkg/apis/core/types.go DisruptionTarget). The runtime's podFailurePolicy then decides: `Ignore` (as
runtimes/torchtune.yaml does) lets the Job replace the pod and the trainer resumes from its newest checkpoint (recipe.py); otherwise the failure counts
and, with `backoffLimit: 0`, fails the TrainJob.

On several nodes a lost node takes the others with it: their collectives wait on the vanished peer until they
time out or fail, and those pods then crash, which the runtime's FailJob rule turns into the TrainJob's failure.
By then the lost pod may be gone (PodGC deleted it), so the disruptions seen while following are kept and a
failure message names those of the last COLLATERAL_SECONDS: the step's retry then takes the failure for the
infrastructure's (attempts.py) and trains again from the newest checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: How long after a node pod's disruption the other nodes' failure may be its consequence: their collectives wait
#: for the lost peer up to their timeout (torch's NCCL default: 10 min; transformers' ddp_timeout: 30 min).
COLLATERAL_SECONDS = 35 * 60.0


def disruption(pod: Mapping[str, Any]) -> dict | None:
    """The pod's DisruptionTarget condition when it is True."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return condition
    return None


def _live(pod: Mapping[str, Any]) -> bool:
    """A pod that is the rank's current one: not being deleted, not failed or disrupted."""
    phase = (pod.get("status") or {}).get("phase")
    return not pod["metadata"].get("deletionTimestamp") and phase != "Failed" and disruption(pod) is None


class PodChanges:
    """Remembers each rank's pod and the disruptions already said; `news` answers what changed since."""

    def __init__(self, nodes: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self._pod_of_rank: dict[str, str] = {}
        self._disrupted: set[str] = set()
        self._nodes, self._clock = nodes, clock
        self._seen: list[tuple[float, str, str]] = []  # (when, pod, its disruption_summary line)

    def news(self, pods: Iterable[Mapping[str, Any]]) -> list[str]:
        """One line per node pod newly disrupted and per rank now running in another pod."""
        lines = []
        live: dict[str, Mapping[str, Any]] = {}
        for pod in pods:
            name = pod["metadata"]["name"]
            rank = (pod["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, "?")
            condition = disruption(pod)
            if condition is not None and name not in self._disrupted:
                self._disrupted.add(name)
                self._seen.append((self._clock(), name, disruption_summary([pod])[0]))
                lines.append(
                    f"node pod {name} (rank {rank}) is disrupted: {condition.get('reason') or 'DisruptionTarget'}: "
                    f"{condition.get('message') or ''}. Its node was lost, drained or preempted; the runtime's "
                    "podFailurePolicy decides whether the Job replaces it (Ignore on DisruptionTarget) or fails"
                )
            newest = live.get(rank)
            if _live(pod) and (
                newest is None
                or pod["metadata"].get("creationTimestamp", "")
                >= newest["metadata"].get("creationTimestamp", "")
            ):
                live[rank] = pod
        for rank, pod in sorted(live.items()):
            name, before = pod["metadata"]["name"], self._pod_of_rank.get(rank)
            if before is not None and before != name:
                lines.append(
                    f"rank {rank} runs in a new pod {name} (replacing {before}); the trainer resumes from its newest checkpoint, if any"
                )
            self._pod_of_rank[rank] = name
        return lines

    def gone_disruptions(self, listed: Iterable[Mapping[str, Any]]) -> list[str]:
        """For the failure message of a TrainJob on several nodes: the node pods disrupted in the last
        COLLATERAL_SECONDS that are no longer `listed` (disruption_summary names those that are), whose loss the
        other nodes' failure may follow from. None on one node: its failure is its own pod's."""
        if self._nodes < 2:
            return []
        names, now = {pod["metadata"]["name"] for pod in listed}, self._clock()
        return [
            f"{line}, {now - when:.0f}s before the TrainJob failed (the pod is gone): the other nodes' collectives "
            "fail with a lost peer"
            for when, name, line in self._seen
            if name not in names and now - when <= COLLATERAL_SECONDS
        ]


def disruption_summary(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per disrupted node pod, for a failure message: pod, rank, the condition's reason and message."""
    lines = []
    for pod in pods:
        condition = disruption(pod)
        if condition is not None:
            rank = (pod["metadata"].get("labels") or {}).get(LABEL_COMPLETION_INDEX, "?")
            lines.append(
                f"pod {pod['metadata']['name']} (rank {rank}): disrupted ({condition.get('reason')}: "
                f"{condition.get('message')})"
            )
    return lines
