"""Resume across several processes: recipe.py's distributed branches (torch.distributed.checkpoint shards, per-rank
dataloader position and RNG, one decision for all ranks) on a two-process FSDP2 training over gloo on CPU
(tests/support/fsdp_resume_probe.py: torchtune's own distributed recipes cannot run on CPU)."""

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_finetune.components._shared.torchtune import resume

pytestmark = pytest.mark.slow

PROBE = Path(__file__).parents[2] / "support" / "fsdp_resume_probe.py"
STEPS = 12
SEED = 20261127


def probe(run_dir, *args, kill_after_step=None):
    """(exit code, {step: (loss, lr)}, its output's tail) of one torchrun of the probe, in a temp folder of its own;
    `kill_after_step`: SIGKILL its whole process group once that step is printed (a node lost: no grace)."""
    command = [
        str(Path(sys.executable).parent / "torchrun"),
        "--nproc_per_node",
        "2",
        str(PROBE),
        str(run_dir),
        *args,
    ]
    temp = Path(run_dir) / "tmp"  # the node container's own, as each has its own /tmp: the stop folder
    temp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(temp)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)  # fmt: skip
    steps, output = {}, []
    for line in process.stdout:
        output.append(line)
        if line.startswith("STEP "):
            _, step, loss, lr = line.split()
            steps[int(step)] = (loss, lr)
            if kill_after_step == int(step):
                os.killpg(process.pid, signal.SIGKILL)
    return process.wait(timeout=300), steps, "".join(output[-30:])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    code, steps, tail = probe(tmp_path_factory.mktemp("straight"))
    assert code == 0 and sorted(steps) == list(range(1, STEPS + 1)), tail
    return steps


def test_a_sigterm_on_one_rank_saves_every_rank_and_the_retry_continues_exactly(uninterrupted, tmp_path):
    after = random.Random(SEED).randint(2, STEPS - 2)
    code, before, tail = probe(tmp_path, "--signal-rank", "1", "--signal-after-step", str(after))
    # The signalled rank exits as SIGTERM ends a process; the other, as a node whose own pod is not stopping
    # (_shared/stop_exit.py), 75.
    exits = dict(re.findall(r"rank +: (\d) \(local_rank: \d\)\n +exitcode +: (\d+)", tail))
    assert code != 0 and exits == {"1": "143", "0": "75"}, tail
    point = resume.latest(tmp_path)
    assert (point.step, point.reason) == (after, "SIGTERM"), tail  # all ranks stopped at the next boundary
    assert sorted(p.name for p in point.path.glob("rank_*.pt")) == ["rank_00000.pt", "rank_00001.pt"]
    # Each rank said how it stops before the save's last barrier: past it, another node's pod may exit with the
    # rendezvous store, and this node's agent, failing at once, ends the process before it could say so.
    barriers = {rank: (tmp_path / f"barriers-{rank}.txt").read_text().split() for rank in (0, 1)}
    assert {rank: said[-1] for rank, said in barriers.items()} == {0: "1", 1: "1"}, barriers

    code, rest, tail = probe(tmp_path)
    assert code == 0, tail
    assert sorted(rest) == list(range(after + 1, STEPS + 1)), tail
    assert {**before, **rest} == uninterrupted, f"signal after step {after} (seed {SEED})"


def test_a_lost_node_resumes_from_the_last_interval_checkpoint(uninterrupted, tmp_path):
    killed = random.Random(SEED + 1).randint(4, STEPS - 1)
    code, before, tail = probe(tmp_path, kill_after_step=killed)
    assert code == -signal.SIGKILL, tail
    point = resume.latest(tmp_path)
    assert point.reason == "interval" and point.step == killed // 3 * 3, tail  # every 3 steps in the probe

    code, rest, tail = probe(tmp_path)
    assert code == 0 and sorted(rest) == list(range(point.step + 1, STEPS + 1)), tail
    assert {**before, **rest} == uninterrupted, f"killed after step {killed} (seed {SEED + 1})"


def test_optimizer_in_backward_on_several_processes_trains_without_checkpoints(tmp_path):
    """Its per-parameter optimizers have no distributed state dict here: said, and no checkpoint is attempted."""
    code, steps, tail = probe(tmp_path, "--optimizer-in-bwd")
    assert code == 0 and sorted(steps) == list(range(1, STEPS + 1)), tail
    assert "optimizer_in_bwd on several processes: no checkpoints for resuming" in tail
    assert resume.latest(tmp_path) is None
