"""The fine-tune launcher imports no torch (it runs on the component image); what needs torch runs first thing in
the TrainJob (entrypoint.py), so a config torch refuses fails the TrainJob in its first seconds, with the reason."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobFailed
from kfp_finetune.components.torchtune_finetune.entrypoint import MODULE
from tests.components.torchtune_finetune.test_finetune_trainjob import (  # noqa: F401 (fixtures)
    WORKSPACE_PVC,
    call_component,
    kube_standin,
    task_config,
)
from tests.components.torchtune_finetune.test_finetune_trainjob import cpu_runtime as cpu_runtime  # noqa: F401
from tests.components.torchtune_finetune.test_finetune_trainjob import inputs as inputs  # noqa: F401

pytestmark = pytest.mark.slow
HEAVY = ("torch", "torchtune", "torchao", "bitsandbytes")


def _node_path_env() -> dict[str, str]:
    return {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def test_the_trainjob_step_imports_no_torch(inputs, cpu_runtime, tmp_path):
    """The step's whole code path (resolve, manifest, create, follow, finalize, outputs) in a child process, the
    TrainJob's node command run for real by the stand-in: torch is loaded by the node process only."""
    kube = cpu_runtime
    workspace, base_model, train = inputs
    kube.execute({WORKSPACE_PVC: workspace}, extra_env=_node_path_env())
    step = textwrap.dedent(f"""
        import json, sys
        from kfp.dsl import Dataset, Model
        from tests.components.torchtune_finetune.test_finetune_trainjob import call_component, task_config
        from pathlib import Path
        base = Model(uri={str(base_model.path)!r}, metadata=json.loads({json.dumps(base_model.metadata)!r}))
        train = Dataset(uri={str(train.path)!r}, metadata=json.loads({json.dumps(train.metadata)!r}))
        workspace = Path({str(workspace)!r})
        result, _ = call_component(workspace, base, train, Path({str(tmp_path)!r}), "trainjob", task_config(workspace))
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print("RESULT " + json.dumps({{"steps": len(result.steps), "heavy": heavy}}))
    """)
    env = {**os.environ, "KUBECONFIG": str(kube.kubeconfig_path)}
    done = subprocess.run(
        [sys.executable, "-c", step], env=env, capture_output=True, text=True, timeout=300,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ")[-1])
    assert result["steps"] == 4, "the TrainJob trained"
    assert result["heavy"] == [], f"the launcher step imported {result['heavy'][:5]}"
    command = kube.requests_for("POST", "trainjobs")[0].body["spec"]["trainer"]["command"]
    assert command[:5] == ["python", "-m", MODULE, "--engine", "torchtune"] and command[5:8] == [
        "tune",
        "run",
        "kfp_finetune/components/torchtune_finetune/recipe.py",
    ]


def test_a_config_torch_refuses_fails_the_trainjob_first_with_the_reason(
    inputs, cpu_runtime, tmp_path, monkeypatch
):
    """max_seq_len=8 cuts every prompt (prompt_fit.py needs torchtune's tokenizer): the launcher cannot know, the
    node pod's entrypoint refuses it before `tune run` starts, and the step fails naming the fix."""
    kube = cpu_runtime
    workspace, base_model, train = inputs
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))
    kube.execute({WORKSPACE_PVC: workspace}, extra_env=_node_path_env())
    with pytest.raises(TrainJobFailed) as failed:
        call_component(
            workspace, base_model, train, tmp_path, "trainjob", task_config(workspace), max_seq_len=8
        )
    message = str(failed.value)
    assert (
        "kfp-finetune: the run cannot train (node 0): the resolved config" in message
        and "8-token tune_max_seq_len" in message
    )
    assert "tune_train_on_input=true" in message
    run_dir = workspace / "runs"
    assert not list(run_dir.glob("*/logs/metrics.txt")), "training never started"


def test_a_config_torch_refuses_fails_a_local_step_with_the_same_reason(inputs, tmp_path):
    """The local backend's child makes the node pod's checks before training (entrypoint.py --local); its refusal
    is the step's ConfigError, naming the fix."""
    workspace, base_model, train = inputs
    with pytest.raises(ConfigError) as refused:
        call_component(workspace, base_model, train, tmp_path, "local", task_config(workspace), max_seq_len=8)
    message = str(refused.value)
    assert message.startswith("the resolved config") and "8-token tune_max_seq_len" in message, message
    assert "tune_train_on_input=true" in message
    assert not list((workspace / "runs").glob("*/logs/metrics.txt")), "training never started"


def test_the_entrypoint_refuses_before_tune_starts(tiny_llama, tiny_dataset, tmp_path):
    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run, tune_command

    run = resolve_run(
        TorchtuneConfig(method="lora", device="cpu", max_seq_len=8), tiny_llama, tiny_dataset["train.jsonl"],
        tmp_path / "run",
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", MODULE, *tune_command(run.recipe, run.yaml_path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **_node_path_env()},
    )  # fmt: skip
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kfp-finetune: the run cannot train (node 0): the resolved config")
    assert "8-token tune_max_seq_len" in last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["resolve-config", "trainjob"])
def test_previewing_a_gpu_job_imports_no_torch(command, tiny_llama, tiny_dataset, tmp_path):
    """`resolve-config --device cuda` and `trainjob --dry-run` preview a single-GPU full fine-tune (bitsandbytes'
    8-bit AdamW in its config) on a laptop: no torch, no bitsandbytes."""
    data = ["--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]), "--method", "full"]
    argv = {
        "resolve-config": ["resolve-config", *data, "--device", "cuda"],
        "trainjob": ["trainjob", "--dry-run", *data, "--gpus", "1", "--workspace", str(tmp_path)],
    }[command]
    code = textwrap.dedent(f"""
        import sys
        from kfp_finetune.cli import main
        code = main({argv!r})
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print("HEAVY", heavy, "CODE", code)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "HEAVY [] CODE 0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    if command == "resolve-config":
        assert "bitsandbytes.optim.PagedAdamW8bit" in done.stdout  # the GPU config keeps its 8-bit optimizer
