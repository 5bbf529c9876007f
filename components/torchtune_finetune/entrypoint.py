"""The TrainJob node command: check the resolved config with torch, then run `tune run ...` in the same process.

    python -m kfp_finetune.components.torchtune_finetune.entrypoint tune run [torchrun flags] <recipe> --config <yaml>

The launcher step resolves the config without torch (it runs on the component image); what needs torch
(torch_checks.py: torchtune's config validation, prompts against max_seq_len, the model layout's logit parity
with transformers on a tiny random copy) runs here, in the trainer image, within seconds of the pod starting. A
bad config fails the TrainJob with one clear line (exit code 2) instead of a traceback minutes into model loading.
A good one goes on to torchtune's own `tune` CLI, called in this process: torch is imported once per pod, not
again by a `tune` process (seconds of every pod start). One device: the recipe runs here (torchtune runs it with
runpy), so it is this process that receives the pod's SIGTERM and checkpoints on it (recipe.py). Several:
torchrun's agent runs here and starts the workers, forwarding signals to them. The checks
leave the process-wide state training starts from as they found it (process_state.py): RNGs, dtype, grad mode,
flags, signal handlers, memory.

On several nodes, the network between them is measured first (network_probe.py), in a fresh interpreter so that
its CUDA context and NCCL state on GPU 0 end with it: far too slow, and the TrainJob fails the same way before
training.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

MODULE = "kfp_finetune.components.torchtune_finetune.entrypoint"
#: Exit code of a config the checks refuse (training never started).
CONFIG_REFUSED = 2
PREFIX = "kfp-finetune: "
#: `python -m MODULE PROBE <run folder> <node rank>`: the network probe alone (probe_network_apart).
PROBE = "--probe-network"


def node_command(tune_command: list[str]) -> list[str]:
    """The TrainJob's node command for a `tune run ...` command: the checks first, then that command. Another
    engine's command is refused here, before any TrainJob is sent: its node-pod checks are not built yet."""
    if tune_command[:1] != ["tune"]:
        from kfp_finetune.components._shared.errors import ConfigError

        raise ConfigError(
            f"this version launches only torchtune in a TrainJob, not `{' '.join(tune_command[:4])} ...`: train "
            "this model with tune_backend=local"
        )
    return ["python", "-m", MODULE, *tune_command]


def config_path(tune_command: list[str]) -> Path:
    try:
        return Path(tune_command[tune_command.index("--config") + 1])
    except (ValueError, IndexError):
        raise SystemExit(f"{PREFIX}usage: python -m {MODULE} tune run ... <recipe> --config <yaml>") from None


def note_device(run_dir: Path) -> None:
    """Record the GPU's name in the run folder (device.json) for the launcher's MFU; never fails the run."""
    from kfp_finetune.components.torchtune_finetune.throughput import record_device

    try:
        device = record_device(run_dir)
    except Exception as error:  # noqa: BLE001 - a missing metric must not stop training
        print(f"{PREFIX}device not recorded ({error}): MFU will not be reported", flush=True)
        return
    print(
        f"{PREFIX}device {device['name']} x {device['count']} recorded in {run_dir.name}/device.json",
        flush=True,
    )


def probe_network(run_dir: Path, rank: str) -> bool:
    """Several nodes: measure the network between them (network_probe.py); False when it is far too slow to train.
    A probe that cannot run (a port the cluster blocks) is said and training goes on: it meets the network itself."""
    from kfp_finetune.components.torchtune_finetune.network_probe import (
        measure,
        too_slow_message,
        write_result,
    )

    try:
        result = measure()
    except Exception as error:  # noqa: BLE001 - the probe must not be why a run fails
        print(
            f"{PREFIX}network between the nodes not measured (node {rank}: {error}); training goes on",
            flush=True,
        )
        return True
    if result is None:
        return True
    if rank == "0":
        write_result(run_dir, result)
        print(f"{PREFIX}{result.line()}", flush=True)
    if result.too_slow:
        print(f"{PREFIX}{too_slow_message(result)}", file=sys.stderr, flush=True)
        return False
    return True


def probe_network_apart(run_dir: Path, rank: str) -> bool:
    """probe_network in a fresh interpreter: its CUDA context and NCCL buffers on GPU 0 end with it instead of staying
    in this process, which becomes torchrun's agent for the whole training. One node: nothing to measure."""
    if int(os.environ.get("PET_NNODES") or 1) < 2:
        return True
    return (
        subprocess.run([sys.executable, "-m", MODULE, PROBE, str(run_dir), rank], check=False).returncode == 0
    )


def check(argv: list[str]) -> int | None:
    """The node's checks of `tune run ... --config <yaml>`: CONFIG_REFUSED when the run must not train, None when it
    may. The process-wide state is left as it was (process_state.kept)."""
    from kfp_finetune.components._shared.errors import ConfigError
    from kfp_finetune.components._shared.torchtune.torch_checks import check_layout_parity, check_resolved
    from kfp_finetune.components.torchtune_finetune.process_state import kept

    if not argv or argv[0] != "tune":
        raise SystemExit(f"{PREFIX}usage: python -m {MODULE} tune run ... <recipe> --config <yaml>")
    path = config_path(argv)
    rank = os.environ.get("PET_NODE_RANK", "0")
    config = yaml.safe_load(path.read_text())
    with kept():
        try:
            check_resolved(config)
            parity = check_layout_parity(config)
        except ConfigError as error:
            print(
                f"{PREFIX}the resolved config {path} cannot train (node {rank}): {error}",
                file=sys.stderr,
                flush=True,
            )
            return CONFIG_REFUSED
        print(
            f"{PREFIX}config {path.name} checked (torchtune validation, prompts fit max_seq_len)", flush=True
        )
        print(f"{PREFIX}{parity}", flush=True)
        if rank == "0":
            note_device(path.parent)
    if not probe_network_apart(path.parent, rank):
        return CONFIG_REFUSED
    return None


def main(argv: list[str]) -> int:
    from kfp_finetune.components._shared.torchtune.tune_cli import run_tune
    from kfp_finetune.components.torchtune_finetune.lease import guard_with_lease

    if argv[:1] == [PROBE]:
        return 0 if probe_network(Path(argv[1]), argv[2]) else CONFIG_REFUSED
    refused = check(argv)
    if refused is not None:
        return refused
    # The training stops if the step that launched it is gone (lease.py).
    guard_with_lease(config_path(argv).parent)
    return run_tune(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
