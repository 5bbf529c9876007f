"""The TrainJob node command: check the engine's training command with torch, then run it in the same process.

    python -m kfp_finetune.components.torchtune_finetune.entrypoint --engine <engine> <training command>

e.g. `--engine torchtune tune run [torchrun flags] <recipe> --config <yaml>`, or `--engine transformers torchrun
[flags] -m <train module> <settings>`. The launcher step plans the run without torch (it runs on the component
image); what needs torch runs here, in the trainer image, within seconds of the pod starting, as the engine's face
says (`check_node_command`: for torchtune its config validation, prompts against max_seq_len and the model
layout's logit parity with transformers; for transformers TRL's argument checks). A bad run fails the TrainJob with
one clear line (exit code 2) instead of a traceback minutes into model loading. A good one goes on to the engine's
command, called in this process (`run_node_command`): torch is imported once per pod. One device: the training
runs here, so it is this process that receives the pod's SIGTERM (torchtune's recipe checkpoints on it,
recipe.py). Several: torchrun's agent runs here and starts the workers, forwarding signals to them; workers that
stopped for a pod's stop give the pod their exit code, not torchrun's error (_shared/stop_exit.py). The checks
leave the process-wide state training starts from as they found it (process_state.py): RNGs, dtype, grad mode,
flags, signal handlers, memory.

The local backend runs the same command as its child (`local_command`, flag --local): the same checks but those
only node pods make (torchtune's layout parity), then the training, in one process that imports torch once; a
refused run's one line becomes the step's ConfigError (`refusal`). The child stops when its step is gone, even
killed outright (`stop_with_step`), as a TrainJob's training stops without its step's lease.

On several nodes, the network between them is measured first (network_probe.py), in a fresh interpreter so that
its CUDA context and NCCL state on GPU 0 end with it: far too slow, and the TrainJob fails the same way before
training.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

MODULE = "kfp_finetune.components.torchtune_finetune.entrypoint"
#: Exit code of a config the checks refuse (training never started).
CONFIG_REFUSED = 2
PREFIX = "kfp-finetune: "
#: `python -m MODULE PROBE <run folder> <node rank>`: the network probe alone (probe_network_apart).
PROBE = "--probe-network"
ENGINE_FLAG = "--engine"
LOCAL_FLAG = "--local"
REFUSED = "the run cannot train"
#: The pid of the step that started a local child (backends/local.py sets it), which the child must not outlive.
STEP_PID_ENV = "KFP_FINETUNE_STEP_PID"


def node_command(training_command: list[str], engine: str) -> list[str]:
    """The TrainJob's node command for `engine`'s training command: the checks first, then that command."""
    return ["python", "-m", MODULE, ENGINE_FLAG, engine, *training_command]


def local_command(training_command: list[str], engine: str) -> list[str]:
    """The local backend's child command: node_command's checks (but the node-only ones), then the training."""
    return ["python", "-m", MODULE, LOCAL_FLAG, ENGINE_FLAG, engine, *training_command]


def stop_with_step() -> None:
    """SIGTERM this process when the step that started it (STEP_PID_ENV) dies, even by SIGKILL, which leaves the
    step no time to stop it (Linux's PR_SET_PDEATHSIG); the run then stops as on any stop: torchtune's recipe
    checkpoints on SIGTERM, torchrun forwards it to its workers. Nothing without the variable or off Linux."""
    step = os.environ.get(STEP_PID_ENV)
    if not step or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    set_parent_death_signal = 1  # PR_SET_PDEATHSIG, <linux/prctl.h>
    if ctypes.CDLL(None, use_errno=True).prctl(set_parent_death_signal, signal.SIGTERM, 0, 0, 0) != 0:
        print(
            f"{PREFIX}cannot ask to stop with the step (errno {ctypes.get_errno()})",
            file=sys.stderr,
            flush=True,
        )
    elif os.getppid() != int(step):  # the step died before the request: its signal will never come
        os.kill(os.getpid(), signal.SIGTERM)


def refusal(lines: list[str]) -> str | None:
    """The problem a refused run printed (from its refusal line to its last), None when it printed none."""
    for index, line in enumerate(lines):
        if line.startswith(f"{PREFIX}{REFUSED} "):
            return "\n".join([line.split("): ", 1)[-1], *lines[index + 1 :]])
    return None


def split_engine(argv: list[str]) -> tuple[str, list[str]]:
    """(engine, training command) of the node command's arguments; without --engine the default engine's (a
    command written before engines were named)."""
    if argv[:1] == [ENGINE_FLAG]:
        if len(argv) < 3:
            raise SystemExit(f"{PREFIX}usage: python -m {MODULE} {ENGINE_FLAG} <engine> <training command>")
        return argv[1], argv[2:]
    return "", argv


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
    """The node's checks of the engine's training command: CONFIG_REFUSED when the run must not train, None when
    it may. The process-wide state is left as it was (process_state.kept)."""
    return checked_run(*split_engine(argv))[0]


def checked_run(engine: str, command: list[str], *, local: bool = False) -> tuple[int | None, Path | None]:
    """check's answer, with the run folder the command trains into (None when refused); `local`: the local
    backend's child."""
    from kfp_finetune.components._shared import engines
    from kfp_finetune.components._shared.errors import ConfigError
    from kfp_finetune.components.torchtune_finetune.process_state import kept

    rank = os.environ.get("PET_NODE_RANK", "0")
    with kept():
        try:
            run_dir, said = engines.face(engine).check_node_command(command, local=local)
        except ConfigError as error:
            print(f"{PREFIX}{REFUSED} (node {rank}): {error}", file=sys.stderr, flush=True)
            return CONFIG_REFUSED, None
        for line in said:
            print(f"{PREFIX}{line}", flush=True)
        if rank == "0":
            note_device(run_dir)
    if not probe_network_apart(run_dir, rank):
        return CONFIG_REFUSED, None
    return None, run_dir


def main(argv: list[str]) -> int:
    from kfp_finetune.components.torchtune_finetune.lease import guard_with_lease

    if argv[:1] == [PROBE]:
        return 0 if probe_network(Path(argv[1]), argv[2]) else CONFIG_REFUSED
    local = argv[:1] == [LOCAL_FLAG]
    if local:
        stop_with_step()
    engine, command = split_engine(argv[1:] if local else argv)
    refused, run_dir = checked_run(engine, command, local=local)
    if refused is not None:
        return refused
    if not local:  # a TrainJob's training stops if the step that launched it is gone (lease.py)
        guard_with_lease(run_dir)
    return train(engine, command)


def train(engine: str, command: list[str]) -> int:
    """The engine's training command in this process; under torchrun, workers that all stopped for a pod's stop
    give the pod their exit code (stop_exit.py) rather than torchrun's error, which Python would end with 1."""
    import time

    from kfp_finetune.components._shared import engines

    started = time.time()
    try:
        return engines.face(engine).run_node_command(command)
    except Exception as error:  # torchrun's: its workers failed, a signal came, its rendezvous store went
        code = stopped_node_exit_code(error, since=started)
        if code is None:
            raise
        return code


def stopped_node_exit_code(error: BaseException, *, since: float) -> int | None:
    """The pod's exit code where this node's workers all stopped for a pod's stop (said in one line), else None.
    Their exit codes come from torchrun's ChildFailedError, also where the kubelet's SIGTERM (which follows the
    preStop hook as soon as the workers exited) interrupted torchrun's cleanup of it, a SignalException with the
    ChildFailedError as its context; else from what the workers recorded since `since` (stop_exit.record_stop),
    where torchrun failed before it saw them end."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from kfp_finetune.components._shared.stop_exit import (
        OTHER_POD_STOPPING,
        node_exit_code,
        recorded_stop_codes,
    )

    failed: BaseException | None = error
    while failed is not None and not isinstance(failed, ChildFailedError):
        failed = failed.__context__
    if failed is not None:
        code = node_exit_code(failure.exitcode for failure in failed.failures.values())
    else:
        code = node_exit_code(recorded_stop_codes(since))
    if code is not None:
        why = "another node's pod is stopping" if code == OTHER_POD_STOPPING else "this pod is stopping"
        print(f"{PREFIX}the training processes stopped ({why}): exit code {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
