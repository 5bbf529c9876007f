"""Node-pod placement for the workspace's access mode, against the Kubernetes API stand-in (real client)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from kubernetes import client

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune.config import ConfigError
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import (
    NodePodSettings,
    build_trainjob,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.placement import (
    place_node_pods,
    require_node,
)
from tests.support import kube_standin as standin

kube_standin = standin.kube_standin  # started, namespace team-a, runtime torch-distributed
NS = "team-a"
STEP_NODE = "kfp-node-a"
STEP_POD = "finetune-step-pod"


def workspace(claim_name: str, **settings) -> NodePodSettings:
    return NodePodSettings(
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": claim_name}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}],
        **settings,
    )


def place(kube, pod: NodePodSettings, num_nodes: int = 1) -> NodePodSettings:
    return place_node_pods(pod, api_client=kube.api_client(), namespace=NS, num_nodes=num_nodes)


@pytest.fixture
def in_step_pod(kube_standin, monkeypatch):
    """This process is the KFP step pod (KFP sets KFP_POD_NAME from the downward API)."""
    monkeypatch.setenv("KFP_POD_NAME", STEP_POD)
    return kube_standin


def test_shared_workspace_leaves_placement_to_the_scheduler(in_step_pod):
    kube = in_step_pod
    kube.add_claim("ws", "ReadWriteMany")
    kube.add_running_pod(STEP_POD, STEP_NODE, claims=("ws",))
    pod = workspace("ws")
    assert place(kube, pod, num_nodes=4) == pod


def test_rwo_workspace_pins_the_node_pod_to_the_steps_node_and_keeps_other_terms(in_step_pod):
    kube = in_step_pod
    kube.add_claim("ws", "ReadWriteOnce")
    kube.add_running_pod(STEP_POD, STEP_NODE, claims=("ws",))
    gpu_pool = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a100", "h100"]}]}
    spot = {"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [gpu_pool, spot]}
        }
    }
    placed = place(kube, workspace("ws", affinity=affinity))
    on_step_node = {"key": "metadata.name", "operator": "In", "values": [STEP_NODE]}
    terms = placed.affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # Terms are ORed: the node requirement is ANDed into each one.
    assert terms == [{**gpu_pool, "matchFields": [on_step_node]}, {**spot, "matchFields": [on_step_node]}]
    assert dataclasses.replace(placed, affinity=affinity) == workspace("ws", affinity=affinity)


def test_pinned_node_pod_starts_where_an_unpinned_one_hangs_on_multi_attach(in_step_pod):
    """The stand-in's attach/detach rule: what the pin is for."""
    kube = in_step_pod
    kube.add_claim("ws", "ReadWriteOnce")
    kube.add_running_pod(STEP_POD, STEP_NODE, claims=("ws",))
    core, custom = client.CoreV1Api(kube.api_client()), client.CustomObjectsApi(kube.api_client())
    for name, pod in (("unpinned", workspace("ws")), ("pinned", place(kube, workspace("ws")))):
        manifest = build_trainjob(
            name, ["tune", "run", "full_finetune_single_device"], runtime="torch-distributed", pod=pod
        )
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", NS, "trainjobs", manifest)
    kube.wait_for_trainjob("pinned", condition="Complete")
    (pinned,) = kube.pods("pinned")
    assert pinned["spec"]["nodeName"] == STEP_NODE
    (unpinned,) = kube.pods("unpinned")
    assert unpinned["status"]["phase"] == "Pending" and unpinned["spec"]["nodeName"] != STEP_NODE
    (event,) = core.list_namespaced_event(
        NS, field_selector=f"involvedObject.name={unpinned['metadata']['name']}"
    ).items
    assert event.reason == "FailedAttachVolume"
    assert event.message.startswith('Multi-Attach error for volume "pv-ws"') and STEP_POD in event.message
    assert "conditions" not in kube.trainjob("unpinned")["status"]


def test_rwo_workspace_refuses_a_multi_node_job_before_it_exists(in_step_pod):
    kube = in_step_pod
    kube.add_claim("ws", "ReadWriteOnce")
    with pytest.raises(
        ConfigError, match=r"num_nodes=2 needs .*PVC 'ws' is ReadWriteOnce.*ReadWriteMany.*num_nodes=1"
    ):
        place(kube, workspace("ws"), num_nodes=2)


def test_rwop_workspace_is_refused(in_step_pod):
    kube = in_step_pod
    kube.add_claim("ws", "ReadWriteOncePod")
    with pytest.raises(ConfigError, match=r"PVC 'ws' is ReadWriteOncePod.*ReadWriteMany"):
        place(kube, workspace("ws"))


def test_missing_claim_is_refused_naming_it_and_the_namespace(in_step_pod):
    with pytest.raises(ConfigError, match=r"PVC 'other-ws', which does not exist in namespace 'team-a'"):
        place(in_step_pod, workspace("other-ws"))


@pytest.fixture
def step_log():
    """Records of the step log (the kfp_finetune logger does not propagate to caplog)."""
    caught: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = caught.append
    logger = get_logger("kfp_finetune")
    logger.addHandler(handler)
    yield caught
    logger.removeHandler(handler)


def test_unknown_step_node_or_unreadable_claim_launches_unpinned_with_a_warning(
    kube_standin, monkeypatch, step_log
):
    kube = kube_standin
    kube.add_claim("ws", "ReadWriteOnce")
    caught = step_log
    monkeypatch.delenv("KFP_POD_NAME", raising=False)  # e.g. kfp.local with the trainjob backend
    assert place(kube, workspace("ws")) == workspace("ws")
    kube.fail_next(status=403, method="GET", path_contains="persistentvolumeclaims")
    assert place(kube, workspace("ws"), num_nodes=2) == workspace("ws")
    warnings = [r.getMessage() for r in caught if r.levelno == logging.WARNING]
    assert "KFP_POD_NAME unset" in warnings[0] and "ReadWriteOnce" in warnings[0]
    assert "cannot read PVC ws (403)" in warnings[1] and "persistentvolumeclaims" in warnings[1]


def test_require_node_without_affinity():
    assert require_node(None, "n1") == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
                ]
            }
        }
    }
