"""torchtune 0.6.1's four fine-tuning recipes, resumable at any optimizer step.

    tune run kfp_finetune/components/torchtune_finetune/recipe.py [torchrun flags] --config <resolved yaml>

`tune run` runs a recipe path that is not in its registry as a module, so this file works wherever kfp_finetune is
installed. The resolved YAML's `kfp_finetune:` block (resume.CheckpointSettings) names the torchtune recipe this
extends, whether to resume, and the checkpoint intervals.

torchtune 0.6.1 checkpoints only at epoch ends, and its resume restarts the epoch's data and, in the distributed
recipes, the whole data order (their `_setup_data` never loads the saved dataloader state). Here the recipe's own
training loop runs unchanged; its dataloader is wrapped (`StepBoundaries`) so that between two optimizer steps —
before the next batch is drawn — the recipe may save its whole training state: trainable weights, optimizer, LR
scheduler, the dataloader's position, the step and epoch counters and every RNG. That happens every
`checkpoint_every_steps` steps / `checkpoint_every_minutes` minutes, and at once when the pod stops (its preStop hook's
request, _shared/stop_request.py, or SIGTERM: a preempted or evicted pod gets a grace period before SIGKILL), after
which the process exits 143 as if the signal had ended it (75 on the nodes whose own pod is not stopping:
_shared/stop_exit.py).
A run started on a run folder with a complete checkpoint of the same config continues from it: the steps, the
learning rate at every step and the data order are an uninterrupted run's.

Single device: one `state.pt`. Several processes: model and optimizer through torch.distributed.checkpoint (each
rank writes its shards), the dataloader position and RNG per rank; rank 0 marks the checkpoint complete once every
rank has written (resume.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfp_finetune.components._shared.cancel import StopSignals
from kfp_finetune.components._shared.stop_exit import record_stop, stop_exit_code
from kfp_finetune.components._shared.stop_request import TrainingProcess
from kfp_finetune.components._shared.torchtune import installed, resume
from kfp_finetune.components._shared.torchtune.resume import CheckpointSettings, ResumePoint
from kfp_finetune.components.torchtune_finetune import warm_start

if TYPE_CHECKING:  # torch is imported where it runs: the trainer image; the component image imports no torch
    import torch
    from omegaconf import DictConfig

#: A checkpoint's reason when a pod's preStop hook asked for it (stop_request.py).
STOP_REQUEST = "pod stop"
PREFIX = "kfp-finetune: "


def _say(text: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(PREFIX + text, flush=True)


def config_sha256(cfg: DictConfig) -> str:
    """The training config's identity (everything but the checkpoint settings): another config must not resume."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(cfg, resolve=True)
    plain.pop(resume.CONFIG_KEY, None)
    return hashlib.sha256(OmegaConf.to_yaml(OmegaConf.create(plain)).encode()).hexdigest()


class StepBoundaries:
    """The recipe's StatefulDataLoader, with a pause between optimizer steps (before the next batch is drawn).

    Ends an epoch after `max_batches` batches even when resumed mid-epoch (the recipe's own cap counts from the
    loop's start). Everything else is the wrapped loader's.
    """

    def __init__(
        self, loader: Any, *, batches_per_step: int, max_batches: int | None, on_boundary: Any
    ) -> None:
        self.loader = loader
        self.sampler = loader.sampler
        self._batches_per_step = batches_per_step
        self._max_batches = max_batches
        self._on_boundary = on_boundary  # (batches drawn this epoch) -> None
        self.resume_position = 0  # batches of the current epoch already trained before a resume
        self.on_iter: Any = None  # called once the epoch's iterator exists (RNG restored there)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def __iter__(self):
        position, self.resume_position = self.resume_position, 0
        iterator = iter(self.loader)
        if self.on_iter is not None:
            # Creating the iterator draws from the global RNG: restore after it, as the interrupted run had it.
            self.on_iter, on_iter = None, self.on_iter
            on_iter()
        while True:
            if position and position % self._batches_per_step == 0:
                self._on_boundary(position)
            if self._max_batches is not None and position >= self._max_batches:
                return
            try:
                batch = next(iterator)
            except StopIteration:
                return
            position += 1
            yield batch


class Resumable:
    """Mixed in before a torchtune recipe class: interval and SIGTERM checkpoints, and resume from them."""

    #: (process start, compile cache) from main(): rank 0 records them at the end of its first step.
    startup: tuple[float, warm_start.CompileCache] | None = None

    def setup(self, cfg: DictConfig) -> None:
        import torch

        self._checkpoints = CheckpointSettings.from_config(cfg)
        self._run_dir = Path(cfg.output_dir)
        self._config_sha256 = config_sha256(cfg)
        self._distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if self._distributed and getattr(self, "_optimizer_in_bwd", False) and self._checkpoints.resume:
            # Its per-parameter optimizers have no distributed state dict here: no checkpoint rather than a crash.
            _say("optimizer_in_bwd on several processes: no checkpoints for resuming; a retry starts over")
            self._checkpoints = dataclasses.replace(self._checkpoints, resume=False)
        # SIGTERM is noted and acted on between two steps (a checkpoint, then exit); without checkpoints it ends us.
        self._stop = StopSignals(lambda signum: None, enabled=self._checkpoints.checkpoints).__enter__()
        # The pod's preStop hook asks us to stop and waits while we save (stop_request.py): only when we can save.
        self._stop_request = TrainingProcess()
        super().setup(cfg)
        steps_per_epoch = self._steps_per_epoch
        self._total_steps = self.total_epochs * steps_per_epoch
        self._dataloader = StepBoundaries(
            self._dataloader,
            batches_per_step=self._gradient_accumulation_steps,
            max_batches=steps_per_epoch * self._gradient_accumulation_steps,
            on_boundary=self._between_steps,
        )
        self._last_saved_step = 0
        self._last_saved_time = time.monotonic()
        # Rank 0's logger: the run's steps give percent and ETA for the Trainer's progress API.
        logger = getattr(self, "_metric_logger", None)
        if logger is not None and hasattr(logger, "total_steps"):
            logger.total_steps = self._total_steps
        point = resume.latest(self._run_dir) if self._checkpoints.resume else None
        if point is not None and point.config_sha256 != self._config_sha256:
            _say(f"not resuming from {point.describe()}: it was trained with another config; starting over")
            point = None
        if point is not None:
            self._restore(point)
        elif self._logged_before():  # killed before its first checkpoint: the curve starts over too
            self._mark_resume(0, "no complete checkpoint: training started over")
        self._say_plan()
        if self._checkpoints.checkpoints:
            # From here to the exit a stopping pod's hook waits for us: a request during the first step is seen at
            # its end (held only then, the hook would find no holder and leave us to torchrun's SIGTERM).
            self._stop_request.hold()

    def _mark_resume(self, step: int, how: str) -> None:
        logger = getattr(self, "_metric_logger", None)  # rank 0's only
        if logger is not None and hasattr(logger, "mark_resume"):
            logger.mark_resume(step, how)

    def _logged_before(self) -> bool:
        logger = getattr(self, "_metric_logger", None)
        return logger is not None and hasattr(logger, "has_steps") and logger.has_steps()

    def _say_plan(self) -> None:
        if not self._checkpoints.checkpoints:
            _say("resume is off: no checkpoints for resuming are written")
            return
        every = [f"every {self._checkpoints.every_steps} steps"] if self._checkpoints.every_steps else []
        if self._checkpoints.every_minutes:
            every.append(f"every {self._checkpoints.every_minutes:g} minutes")
        when = f"{' and '.join(every)}, and on SIGTERM" if every else "on SIGTERM"
        _say(f"checkpoints for resuming: {when}, in {resume.resume_root(self._run_dir)}")

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """The recipe's epoch-end checkpoint, without its side effect on a CPU model's weights.

        torchtune 0.6.1's LoRA single-device recipe merges the adapter into `{k: v.cpu() ...}` of the model's state
        dict with `+=`: on CPU `.cpu()` returns the weights themselves, so every epoch end adds the adapter into
        the live base weights and later epochs train (and the final merge counts) it twice. A run that saves only
        its adapter merges nothing (the default: the merge happens after training, _shared/torchtune/merge.py).
        """
        import torch

        merges = self._device.type == "cpu" and not getattr(self, "_save_adapter_weights_only", False)
        base = self._weights_merged_into() if merges else {}
        saved = {name: weight.detach().clone() for name, weight in base.items()}
        super().save_checkpoint(*args, **kwargs)
        with torch.no_grad():
            for name, weight in base.items():
                weight.copy_(saved[name])

    def _weights_merged_into(self) -> dict[str, torch.Tensor]:
        """The base weights of the LoRA'd modules (`<module>.weight` beside `<module>.lora_a.weight`)."""
        state = self._model.state_dict(keep_vars=True)
        modules = [name.removesuffix(".lora_a.weight") for name in state if name.endswith(".lora_a.weight")]
        return {
            f"{module}.weight": state[f"{module}.weight"] for module in modules if f"{module}.weight" in state
        }

    # --- between two optimizer steps ----------------------------------------------------------------------------

    def _between_steps(self, position: int) -> None:
        import torch

        if self.startup is not None and (not self._distributed or torch.distributed.get_rank() == 0):
            _say(warm_start.record_startup(self._run_dir, *self.startup).line())
        self.startup = None  # on this instance: once per process
        step = self.global_step
        if not self._checkpoints.checkpoints or step >= self._total_steps:
            return
        if step == self._last_saved_step:
            return
        signalled, requested = self._stop.received is not None, self._stop_request.requested()
        due = (
            bool(self._checkpoints.every_steps)
            and step - self._last_saved_step >= self._checkpoints.every_steps
        )
        minutes = self._checkpoints.every_minutes
        due = due or bool(minutes) and time.monotonic() - self._last_saved_time >= minutes * 60
        if self._distributed:  # one decision for all ranks: a signal may reach one node only, clocks differ
            flags = torch.tensor([float(signalled), float(requested), float(due)], device=self._device)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            signalled, requested, due = (bool(flag) for flag in flags.tolist())
        stop = signalled or requested
        if not (stop or due):
            return
        # This pod's own stop, or only another node's (asked again: it may have come since the all-reduce).
        own_pod = stop and (self._stop.received is not None or self._stop_request.requested())
        reason = ("SIGTERM" if signalled else STOP_REQUEST) if stop else "interval"
        started = time.monotonic()
        point = resume.new_point(
            step=step,
            epoch=self.epochs_run,
            batches_in_epoch=position,
            reason=reason,
            config_sha256=self._config_sha256,
        )
        code = stop_exit_code(own_pod) if stop else None

        def saved() -> None:
            _say(f"checkpoint at {point.describe()} written in {time.monotonic() - started:.1f}s")
            if code is None:
                return
            why = (
                ("SIGTERM" if signalled else "the pod is stopping")
                if own_pod
                else "another node's pod is stopping"
            )
            _say(f"stopping after the checkpoint at step {step} ({why}): a retry resumes from it")
            sys.stdout.flush()
            record_stop(code)  # for the node's entrypoint, should torchrun lose track of us

        self._save(point, saved)
        self._last_saved_step, self._last_saved_time = step, time.monotonic()
        if code is not None:
            os._exit(code)  # no teardown: the grace period is short, the state is on disk

    # --- the training state -------------------------------------------------------------------------------------

    def _optimizer_object(self) -> Any:
        return self._optim_ckpt_wrapper if getattr(self, "_optimizer_in_bwd", False) else self._optimizer

    def _trainable(self) -> dict[str, torch.Tensor]:
        return {name: p for name, p in self._model.named_parameters() if p.requires_grad}

    def _rank_state(self, point: ResumePoint) -> dict[str, Any]:
        return {
            "dataloader": self._dataloader.state_dict(),
            "rng": _rng_state(),
            "global_step": self.global_step,
            "epochs_run": self.epochs_run,
            "batches_in_epoch": point.batches_in_epoch,
            "lr_scheduler": self._lr_scheduler.state_dict() if self._lr_scheduler is not None else None,
        }

    def _save(self, point: ResumePoint, saved: Callable[[], None]) -> None:
        """Write the checkpoint for `point`, then call `saved()` before the last barrier: past it, another node's
        pod may exit, and with it the rendezvous store its agent may hold, whose loss ends this node's agent and
        this process before it could say so."""
        import torch

        partial = resume.partial_dir(self._run_dir, point.step)
        if not self._distributed:
            partial.mkdir(parents=True, exist_ok=True)
            state = {
                "model": {name: p.detach() for name, p in self._trainable().items()},
                "optimizer": self._optimizer_object().state_dict(),
                **self._rank_state(point),
            }
            _save_file(state, partial / "state.pt")
            resume.publish(partial, point)
            saved()
            return
        import torch.distributed.checkpoint as dcp

        rank = torch.distributed.get_rank()
        if rank == 0:
            partial.mkdir(parents=True, exist_ok=True)
        torch.distributed.barrier()
        model_state, optimizer_state = self._sharded_state()
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
        _save_file(self._rank_state(point), partial / f"rank_{rank:05d}.pt")
        torch.distributed.barrier()  # every rank's files are on disk before the marker says so
        if rank == 0:
            resume.publish(partial, point)
        saved()
        torch.distributed.barrier()

    def _sharded_state(self) -> tuple[dict, dict]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self._model, self._optimizer)
        trainable = {_clean_name(name) for name in self._trainable()}
        return {k: v for k, v in model_state.items() if k in trainable}, optimizer_state

    def _restore(self, point: ResumePoint) -> None:
        import torch

        if not self._distributed:
            state = torch.load(point.path / "state.pt", map_location="cpu", weights_only=False)
            trainable = self._trainable()
            missing = sorted(set(trainable) - set(state["model"]))
            if missing:
                raise RuntimeError(f"checkpoint {point.path} lacks trainable weights {missing[:3]}")
            with torch.no_grad():
                for name, parameter in trainable.items():
                    parameter.copy_(state["model"][name])
            self._optimizer_object().load_state_dict(state["optimizer"])
        else:
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

            model_state, optimizer_state = self._sharded_state()
            loaded = {"model": model_state, "optimizer": optimizer_state}
            dcp.load(loaded, checkpoint_id=str(point.path))
            set_state_dict(
                self._model,
                self._optimizer,
                model_state_dict=loaded["model"],
                optim_state_dict=loaded["optimizer"],
                options=StateDictOptions(strict=False),
            )
            rank = torch.distributed.get_rank()
            state = torch.load(point.path / f"rank_{rank:05d}.pt", map_location="cpu", weights_only=False)
        if self._lr_scheduler is not None and state["lr_scheduler"] is not None:
            self._lr_scheduler.load_state_dict(state["lr_scheduler"])
        self._dataloader.load_state_dict(state["dataloader"])
        self._dataloader.resume_position = state["batches_in_epoch"]
        self._dataloader.on_iter = lambda: _set_rng_state(state["rng"])
        self.global_step = state["global_step"]
        self.epochs_run = state["epochs_run"]
        self._last_saved_step = self.global_step
        self._mark_resume(point.step, f"from the checkpoint saved on {point.reason}")
        _say(f"resuming from the checkpoint at {point.describe()}: {point.path}")


def _clean_name(name: str) -> str:
    """A parameter's name as torch.distributed.checkpoint's state dicts spell it (wrappers' prefixes removed)."""
    return name.replace("._checkpoint_wrapped_module", "").replace("_orig_mod.", "")


def _save_file(state: dict, path: Path) -> None:
    import torch

    torch.save(state, path)
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())


def recipe_module(name: str) -> Any:
    """torchtune's recipe module `name`, its recipe class replaced by the same class with resume mixed in.

    Its own `recipe_main` then runs as shipped (process group, threads, config logging) with our class: the
    module's global is rebound in this process only; no installed file changes.
    """
    if name not in resume.RESUMABLE:
        raise SystemExit(
            f"{PREFIX}{name!r} is not one of the recipes this module extends: {', '.join(resume.RESUMABLE)}"
        )
    # torchtune's recipes/ is not a package (its __init__ refuses imports): the file is loaded as `tune run` does.
    path = installed.recipe_file(name)
    spec = importlib.util.spec_from_file_location(f"torchtune_recipe_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base = getattr(module, resume.RESUMABLE[name])
    if not issubclass(base, Resumable):
        setattr(
            module, resume.RESUMABLE[name], type(base.__name__, (Resumable, base), {"__module__": __name__})
        )
    return module


def resolved_config(argv: list[str]) -> dict:
    """The resolved YAML `--config` names."""
    import yaml

    try:
        path = argv[argv.index("--config") + 1]
    except (ValueError, IndexError):
        raise SystemExit(f"{PREFIX}usage: tune run {resume.RECIPE_PATH} --config <resolved yaml>") from None
    return yaml.safe_load(Path(path).read_text())


def main() -> None:
    import torch

    started_at = warm_start.process_started_at()
    config = resolved_config(sys.argv)
    gpu = (
        torch.cuda.get_device_name(int(os.environ.get("LOCAL_RANK", 0)))
        if torch.cuda.is_available()
        else "cpu"
    )
    cache = warm_start.use_compile_cache(config["output_dir"], torch.__version__, gpu)
    if config.get("compile") and cache.folder is not None:
        _say(f"torch.compile caches: {cache.folder} ({cache.state}, on the {cache.place})")
    Resumable.startup = (started_at, cache)
    recipe_module(CheckpointSettings.from_config(config).recipe).recipe_main()


if __name__ == "__main__":
    main()
