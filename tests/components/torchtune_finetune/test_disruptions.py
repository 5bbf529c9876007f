"""The node pods' disruptions a failure message names (backends/trainjob/disruptions.py): on several nodes, also
those of pods already gone, within the window the other nodes' collectives may take to fail with a lost peer."""

from kfp_finetune.components.torchtune_finetune.backends.trainjob.disruptions import (
    COLLATERAL_SECONDS,
    PodChanges,
)


def pod(name: str, rank: int, disrupted: bool = False) -> dict:
    conditions = [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC",
                   "message": "PodGC: node no longer exists"}] if disrupted else []  # fmt: skip
    return {
        "metadata": {"name": name, "labels": {"batch.kubernetes.io/job-completion-index": str(rank)}},
        "status": {"phase": "Failed" if disrupted else "Running", "conditions": conditions},
    }


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_gone_pods_disruption_is_named_on_several_nodes_within_the_collectives_timeout():
    clock = Clock()
    changes = PodChanges(nodes=2, clock=clock)
    changes.news([pod("j-node-0-0-a", 0), pod("j-node-0-1-b", 1, disrupted=True)])
    clock.now += 90
    survivor = [pod("j-node-0-0-a", 0)]  # PodGC's pod was deleted before the TrainJob failed
    (line,) = changes.gone_disruptions(survivor)
    assert line.startswith(
        "pod j-node-0-1-b (rank 1): disrupted (DeletionByPodGC: PodGC: node no longer exists)"
    )
    assert "90s before the TrainJob failed" in line
    # Still listed: disruption_summary names it already.
    assert changes.gone_disruptions([*survivor, pod("j-node-0-1-b", 1, disrupted=True)]) == []
    clock.now += COLLATERAL_SECONDS
    assert changes.gone_disruptions(survivor) == []  # too long ago for the failure to follow from it


def test_on_one_node_a_failure_is_its_own_pods():
    changes = PodChanges(nodes=1, clock=Clock())
    changes.news([pod("j-node-0-0-a", 0, disrupted=True)])
    assert changes.gone_disruptions([]) == []
