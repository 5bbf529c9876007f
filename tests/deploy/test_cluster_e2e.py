"""End to end on a real cluster (kind + Kubeflow Trainer v2.3 + `kubectl apply -k runtimes/`).

Skipped unless KFP_FINETUNE_E2E_KUBECONFIG points at a kubeconfig. Optional:
  KFP_FINETUNE_E2E_NAMESPACE   namespace to run in (default: the kubeconfig context's, else "default")
  KFP_FINETUNE_E2E_IMAGE       image with a POSIX shell for the contract checks (default: python:3.12-slim)
  KFP_FINETUNE_E2E_TORCH_IMAGE image with torch, enables the two-node torchrun rendezvous check
"""

from __future__ import annotations

import os
import uuid

import pytest

from kfp_finetune.components._shared.kube.client import current_namespace, load_api_client
from kfp_finetune.components.torchtune_finetune.backends.trainjob import (
    TrainJobFailed,
    launch_trainjob,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj

KUBECONFIG = os.environ.get("KFP_FINETUNE_E2E_KUBECONFIG")
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        not KUBECONFIG, reason="set KFP_FINETUNE_E2E_KUBECONFIG to run against a real cluster"
    ),
]
IMAGE = os.environ.get("KFP_FINETUNE_E2E_IMAGE", "python:3.12-slim")
TORCH_IMAGE = os.environ.get("KFP_FINETUNE_E2E_TORCH_IMAGE")


@pytest.fixture(scope="module")
def api():
    return load_api_client(KUBECONFIG)


@pytest.fixture(scope="module")
def namespace():
    return os.environ.get("KFP_FINETUNE_E2E_NAMESPACE") or current_namespace("default", kubeconfig=KUBECONFIG)


def new_run_id() -> str:
    return f"e2e-{uuid.uuid4().hex[:8]}"


def job(
    command: list[str], *, image: str = IMAGE, num_nodes: int = 1, namespace: str, run_id: str | None = None
) -> dict:
    run_id = run_id or new_run_id()
    return tj.build_trainjob(
        tj.trainjob_name(run_id, "e2e"),
        command,
        namespace=namespace,
        runtime="torchtune-cpu",
        image=image,
        num_nodes=num_nodes,
        pod=tj.NodePodSettings(resources={"requests": {"cpu": "500m", "memory": "512Mi"}}),
        active_deadline_seconds=900,
        run_id=run_id,
        task_name="e2e",
    )


def test_command_passes_through_with_pet_env_and_logs_stream(api, namespace):
    script = 'env | grep ^PET_ | sort; echo "Step 1 | loss:1.25 lr:0.1 tokens_per_second_per_gpu:10"'
    manifest = job(["sh", "-c", script, "tune", "run"], namespace=namespace)  # not the bare `tune run`
    name = manifest["metadata"]["name"]
    result = launch_trainjob(manifest, api, timeout=600, handle_signals=False)
    assert result.status == "Complete" and result.deleted
    assert "PET_NNODES=1" in result.log_lines
    assert f"PET_MASTER_ADDR={name}-node-0-0.{name}" in result.log_lines
    assert result.steps and result.steps[0].loss == 1.25


def test_failure_reports_the_exit_code(api, namespace):
    manifest = job(["sh", "-c", "echo about to fail; exit 3"], namespace=namespace)
    with pytest.raises(TrainJobFailed) as raised:
        launch_trainjob(manifest, api, timeout=600, cleanup="always", handle_signals=False)
    assert "exit code 3" in str(raised.value) and "about to fail" in str(raised.value)


@pytest.mark.skipif(
    not TORCH_IMAGE, reason="set KFP_FINETUNE_E2E_TORCH_IMAGE for the torchrun rendezvous check"
)
def test_two_node_torchrun_rendezvous(api, namespace):
    run_id = new_run_id()
    name = tj.trainjob_name(run_id, "e2e")
    script = (
        "import torch.distributed as d; d.init_process_group('gloo'); "
        "print('rank', d.get_rank(), 'of', d.get_world_size()); d.destroy_process_group()"
    )
    # The same torchrun flags `tune run` gets for distributed recipes; --no-python runs `python -c` directly.
    command = ["torchrun", *tj.torchrun_args(name), "--no-python", "python", "-c", script]
    manifest = job(command, image=TORCH_IMAGE, num_nodes=2, namespace=namespace, run_id=run_id)
    result = launch_trainjob(manifest, api, timeout=900, handle_signals=False)
    assert result.status == "Complete"
    assert any(line.endswith("of 2") for line in result.log_lines)
