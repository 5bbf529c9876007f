"""A two-process FSDP2 training (gloo, CPU) run through recipe.py's `Resumable`, for its distributed branches.

torchtune 0.6.1's distributed recipes cannot run on CPU (the LoRA one initialises NCCL, the full one logs CUDA
memory stats), so this stands in for the recipe around the mixin: the same shape of loop (epochs, `set_epoch`,
the dataloader, an optimizer step per `gradient_accumulation_steps` batches, `global_step`), a model sharded with
FSDP2's `fully_shard`, AdamW, a LambdaLR schedule, dropout, a StatefulDataLoader over a shuffled
StatefulDistributedSampler — what the mixin saves through torch.distributed.checkpoint and per-rank files.

    torchrun --nproc_per_node 2 fsdp_resume_probe.py <run_dir> [--signal-rank R --signal-after-step K]

Prints `STEP <n> <loss> <lr>` on rank 0. With --signal-*, rank R alone notes a SIGTERM after step K (as when one
node's pod is preempted): every rank must save together and exit 143. Each rank writes a line to
`<run_dir>/barriers-<rank>.txt` as it enters a barrier: 1 when its stop's record (stop_exit.record_stop) is on disk
by then, else 0 (a file of its own: the ranks' lines on one stdout could interleave).
"""

import argparse
import os
import signal

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from kfp_finetune.components._shared import stop_exit
from kfp_finetune.components._shared.stop_request import folder
from kfp_finetune.components._shared.torchtune import resume
from kfp_finetune.components.torchtune_finetune.recipe import Resumable

EPOCHS, BATCHES_PER_STEP, ROWS, BATCH = 2, 2, 48, 2


class ProbeRecipe:
    """The parts of a torchtune distributed recipe the mixin reads and drives."""

    def __init__(
        self, signal_rank: int | None, signal_after: int | None, optimizer_in_bwd: bool = False
    ) -> None:
        self._signal = (signal_rank, signal_after)
        self._optimizer_in_bwd = optimizer_in_bwd  # as the recipes' __init__ sets it from the config

    def setup(self, cfg) -> None:
        torch.manual_seed(0)
        self._device = torch.device("cpu")
        self._gradient_accumulation_steps = BATCHES_PER_STEP
        self.total_epochs, self.epochs_run, self.global_step = EPOCHS, 0, 0
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        self._model = fully_shard(model)
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=1e-2)
        self._lr_scheduler = torch.optim.lr_scheduler.LambdaLR(self._optimizer, lambda step: 1.0 / (1 + step))
        data = torch.utils.data.TensorDataset(
            torch.randn(ROWS, 8, generator=torch.Generator().manual_seed(1)),
            torch.randn(ROWS, 4, generator=torch.Generator().manual_seed(2)),
        )
        sampler = StatefulDistributedSampler(
            data, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True, seed=0
        )
        self._dataloader = StatefulDataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
        self._steps_per_epoch = len(self._dataloader) // BATCHES_PER_STEP

    def train(self) -> None:
        for epoch in range(self.epochs_run, self.total_epochs):
            self._dataloader.sampler.set_epoch(epoch)
            running = torch.zeros(())
            for idx, (x, y) in enumerate(self._dataloader):
                loss = ((self._model(x) - y) ** 2).mean() / BATCHES_PER_STEP
                loss.backward()
                running += loss.detach()
                if (idx + 1) % BATCHES_PER_STEP == 0:
                    self._optimizer.step()
                    self._optimizer.zero_grad(set_to_none=True)
                    self._lr_scheduler.step()
                    self.global_step += 1
                    dist.all_reduce(running)
                    if dist.get_rank() == 0:
                        print(
                            f"STEP {self.global_step} {running.item():.9g} {self._lr_scheduler.get_last_lr()[0]:.9g}",
                            flush=True,
                        )
                    running = torch.zeros(())
                    rank, after = self._signal
                    if rank == dist.get_rank() and after == self.global_step:
                        self._stop.received = signal.SIGTERM  # what the SIGTERM handler records
            self.epochs_run += 1


class ResumableProbe(Resumable, ProbeRecipe):
    pass


def said_barrier(barrier, run_dir: str):
    """`barrier`, which first writes whether this process's stop record is on disk."""

    def said(*args, **kwargs):
        record = folder() / f"{stop_exit._STOPPED}{os.environ['LOCAL_RANK']}"
        with open(os.path.join(run_dir, f"barriers-{dist.get_rank()}.txt"), "a") as out:
            out.write(f"{int(record.exists())}\n")
        return barrier(*args, **kwargs)

    return said


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir")
    parser.add_argument("--signal-rank", type=int)
    parser.add_argument("--signal-after-step", type=int)
    parser.add_argument("--optimizer-in-bwd", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    dist.barrier = said_barrier(
        dist.barrier, args.run_dir
    )  # recipe.py calls torch.distributed.barrier: this one
    settings = resume.CheckpointSettings("full_finetune_distributed", every_steps=3, every_minutes=0)
    cfg = OmegaConf.create({"output_dir": args.run_dir, resume.CONFIG_KEY: settings.as_config()})
    recipe = ResumableProbe(args.signal_rank, args.signal_after_step, args.optimizer_in_bwd)
    recipe.setup(cfg)
    recipe.train()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
