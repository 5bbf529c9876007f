"""Several nodes need RDMA: a multi-node TrainJob on a runtime that requests none is refused before it is created
(launcher and pre-flight, against the stand-in), unless tune_allow_slow_network allows it."""

import copy

import pytest
import yaml

from kfp_finetune.components._shared.launch_settings import NETWORK_LABEL
from kfp_finetune.components.preflight.preflight import PreflightError, run_preflight
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobError
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.network import ANNOTATION_ALLOW_SLOW_NETWORK
from tests.components.torchtune_finetune import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

pytestmark = pytest.mark.slow  # a Kubernetes stand-in per test

kube = base.kube
user_log = base.user_log
GPUS = tj.NodePodSettings(resources={"limits": {"nvidia.com/gpu": "8"}})


def add_rdma_runtime(kube, name="torchtune-rdma"):
    runtime = copy.deepcopy(yaml.safe_load((base.REPO / "runtimes" / "torchtune-cpu.yaml").read_text()))
    runtime["metadata"]["name"] = name
    runtime["metadata"].setdefault("labels", {})[NETWORK_LABEL] = "rdma"
    kube.add_object(runtime)


def test_two_nodes_without_rdma_are_refused_before_the_trainjob_exists(kube):
    with pytest.raises(TrainJobError, match=r"2 nodes on ClusterTrainingRuntime 'torchtune-cpu', which requests no RDMA.*"
                       r"tune_allow_slow_network=true"):  # fmt: skip
        base.launcher(kube, base.manifest(num_nodes=2, pod=GPUS)).run()
    assert not kube.requests_for("POST", "trainjobs")


def test_two_nodes_train_where_rdma_is_requested_or_a_slow_network_allowed(kube, user_log):
    add_rdma_runtime(kube)
    kube.scenario(None, Scenario.success(["Step 1 | loss:1.0"]))
    on_rdma = base.manifest(num_nodes=2, pod=GPUS)
    on_rdma["spec"]["runtimeRef"]["name"] = "torchtune-rdma"
    assert base.launcher(kube, on_rdma).run().status == "Complete"
    assert "RDMA network requested" in user_log.text

    allowed = base.manifest(
        run_id="run-2", num_nodes=2, pod=GPUS, annotations={ANNOTATION_ALLOW_SLOW_NETWORK: "true"}
    )
    assert base.launcher(kube, allowed).run().status == "Complete"
    assert "going on, as tune_allow_slow_network=true asks" in user_log.text


def test_one_node_or_cpu_nodes_need_no_rdma(kube):
    kube.scenario(None, Scenario.success(["Step 1 | loss:1.0"]))
    assert base.launcher(kube, base.manifest(pod=GPUS)).run().status == "Complete"
    assert base.launcher(kube, base.manifest(run_id="run-2", num_nodes=2)).run().status == "Complete"


def test_preflight_refuses_two_nodes_without_rdma_before_any_download(kube, monkeypatch):
    add_rdma_runtime(kube)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    with pytest.raises(
        PreflightError, match=r"tune_num_nodes: 2 nodes on ClusterTrainingRuntime 'torchtune-cpu'"
    ):
        run_preflight(tune_runtime="torchtune-cpu", settings={"tune_num_nodes": 2, "tune_gpus_per_node": 8})
    assert run_preflight(
        tune_runtime="torchtune-rdma", settings={"tune_num_nodes": 2, "tune_gpus_per_node": 8}
    ) == ["tune_runtime"]
    allowed = {"tune_num_nodes": 2, "tune_gpus_per_node": 8, "tune_allow_slow_network": True}
    assert run_preflight(tune_runtime="torchtune-cpu", settings=allowed) == ["tune_runtime"]
