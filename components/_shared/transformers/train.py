"""Supervised fine-tuning with TRL's SFTTrainer (+ PEFT LoRA / QLoRA, or full), writing run_layout.py's folder.

What a TrainJob node runs, under torchrun (one process per GPU):

    torchrun --nproc-per-node N -m kfp_finetune.components._shared.transformers.train settings.json

torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK) is what the Trainer's accelerate state reads to train
data-parallel; `accelerate launch` is not used (without its own config it trains at world size 1, silently).

The rows become TRL's dataset formats (rows.py); a classification run trains a sequence classifier with
transformers' Trainer (classify.py), with the same callbacks, checkpoints and outputs.

Only rank 0 writes the outputs. torch, transformers and TRL are imported inside the functions.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.metrics_file import RESUMED, parse_metric_line
from kfp_finetune.components._shared.stop_exit import record_stop, stop_exit_code
from kfp_finetune.components._shared.stop_request import TrainingProcess
from kfp_finetune.components._shared.transformers import run_layout, run_length, seq_len
from kfp_finetune.components._shared.transformers.rows import (
    DATASETS_CACHE,
    LAST_ASSISTANT_TURN,
    trained_rows,
)
from kfp_finetune.components._shared.transformers.settings import (
    CLASSIFICATION,
    IMAGE_TEXT,
    TRAINER_DIR,
    SftSettings,
)
from kfp_finetune.components._shared.unfit_rows import too_many_unfit
from kfp_finetune.components._shared.workspace import atomic_dir, write_json_atomic

log = get_logger(__name__)

#: The label of a position left out of the loss (transformers' and TRL's -100).
IGNORED_LABEL = -100


def world_size() -> int:
    """The number of training processes torchrun started (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


@dataclass
class TrainedTokens:
    """This rank's trained tokens so far: label positions not masked out of the loss, as torchtune counts its
    tokens/s (TRL's own `num_tokens` counts every token of the batch, masked prompt included); a classifier's:
    the tokens it read (each row's, padding left out)."""

    count: int = 0


def batch_tokens(inputs: dict) -> int:
    """The trained tokens of one micro-batch (TrainedTokens)."""
    labels = inputs.get("labels")
    if labels is not None and labels.dim() > 1:
        return int((labels != IGNORED_LABEL).sum())
    mask = inputs.get("attention_mask")
    return int(mask.sum()) if mask is not None else 0


def counting_trainer(trained: TrainedTokens, checkpoints: Any, trainer_class: type) -> type:
    """`trainer_class` (TRL's SFTTrainer, transformers' Trainer), counting each micro-batch's trained tokens into
    `trained` and holding the run's `checkpoints` callback (checkpoint_callback) for train() to ask whether
    the pod's stop ended it."""

    class CountingTrainer(trainer_class):
        trained_tokens = trained
        checkpoint_callback = checkpoints

        def training_step(self, model, inputs, *args, **kwargs):
            trained.count += batch_tokens(inputs)
            return super().training_step(model, inputs, *args, **kwargs)

        def _get_train_sampler(self, *args, **kwargs):
            sampler = super()._get_train_sampler(*args, **kwargs)
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            return epoch_seeded(sampler, seed)

    return CountingTrainer


def epoch_seeded(sampler: Any, seed: int) -> Any:
    """`sampler`, where it is transformers' LengthGroupedSampler, drawing each epoch's order from `seed` + the epoch
    (the Trainer and accelerate call set_epoch before each epoch): the order it draws from the process's global
    RNG differs in a restarted process, so a run resumed in its second epoch or later would train some rows twice
    and skip others. Every process draws the same order, as the batches' sharding assumes."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    if type(sampler) is not LengthGroupedSampler:
        return sampler

    class EpochSeededSampler(LengthGroupedSampler):
        def set_epoch(self, epoch: int) -> None:
            self.generator = torch.Generator().manual_seed(seed + epoch)

    seeded = EpochSeededSampler(sampler.batch_size, lengths=sampler.lengths)
    seeded.set_epoch(0)
    return seeded


def metrics_callback(path: Path, trained: TrainedTokens) -> Any:
    """A TrainerCallback that appends each logged step to `path` in the metrics-file format (_shared/
    metrics_file.py), flushed at once, so a watcher (the fine-tune step, a pod-log reader) sees it live."""
    from transformers import TrainerCallback

    class MetricsFile(TrainerCallback):
        def __init__(self) -> None:
            self.last: tuple[float, int] | None = None  # (monotonic time, this rank's trained tokens)
            self.last_step = 0

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:  # resumed: the steps up to the checkpoint's stay
                path.parent.mkdir(parents=True, exist_ok=True)
                kept = path.read_text().splitlines(keepends=True) if path.is_file() else []
                path.write_text("".join(line for line in kept if _step_of(line) <= state.global_step))
                if state.global_step or any(_step_of(line) for line in kept):  # an earlier start trained
                    how = (
                        f"from checkpoint-{state.global_step}"
                        if state.global_step
                        else "no complete checkpoint: training started over"
                    )
                    line = f"{RESUMED} {state.global_step} ({how})"
                    with path.open("a") as f:
                        f.write(line + "\n")
                    print(line, flush=True)
            self.last, self.last_step = (time.monotonic(), trained.count), state.global_step

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs or "loss" not in logs:
                return  # the end-of-training summary has train_loss, not loss
            values = {"loss": logs["loss"], "lr": logs.get("learning_rate")}
            if logs.get("grad_norm") is not None:
                values["grad_norm"] = logs["grad_norm"]
            now, tokens = time.monotonic(), trained.count
            if self.last is not None and tokens > self.last[1] and now > self.last[0]:
                # Rank 0's own tokens: per GPU, as torchtune reports it.
                values["tokens_per_second_per_gpu"] = (tokens - self.last[1]) / (now - self.last[0])
                if state.global_step > self.last_step:
                    values["seconds_per_step"] = (now - self.last[0]) / (state.global_step - self.last_step)
            self.last, self.last_step = (now, tokens), state.global_step
            pairs = " ".join(f"{k}:{float(v):.6g}" for k, v in values.items() if v is not None)
            line = f"Step {state.global_step} | {pairs}"
            with path.open("a") as f:
                f.write(line + "\n")
                f.flush()
            print(line, flush=True)

    return MetricsFile()


def _step_of(line: str) -> int:
    found = parse_metric_line(line)
    return found.step if found else 0


def last_checkpoint(trainer_dir: Path) -> Path | None:
    """The newest complete checkpoint an earlier start of this run saved, None when there is none: the Trainer
    writes trainer_state.json into a checkpoint last, so one without it (a start killed while saving) is skipped."""
    numbered = [p for p in trainer_dir.glob("checkpoint-*") if p.name.rpartition("-")[2].isdigit()]
    for path in sorted(numbered, key=lambda p: int(p.name.rpartition("-")[2]), reverse=True):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue
        return path
    return None


def agreed(*flags: bool) -> tuple[bool, ...]:
    """Each flag, True where any process of the run says so (one all-reduce): every rank saves and stops at the
    same step."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    found = torch.tensor([int(flag) for flag in flags], device=device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return tuple(bool(value) for value in found.tolist())


def checkpoint_callback(every_minutes: float) -> Any:
    """A TrainerCallback that saves a checkpoint every `every_minutes` (0: never by time) and, when the pod stops
    (its preStop hook asks, _shared/stop_request.py; or SIGTERM: a preempted or drained pod gets it before its grace
    period ends), saves one and stops training."""
    from transformers import TrainerCallback

    class Checkpoints(TrainerCallback):
        def __init__(self) -> None:
            self.stop_requested = False
            self.own_pod_stopping = False
            self.saved_at = time.monotonic()
            self.previous_handler: Any = None
            self.pod_stop = TrainingProcess()

        def _on_sigterm(self, signum, frame) -> None:
            self.stop_requested = True

        def on_train_begin(self, args, state, control, **kwargs):
            self.saved_at = time.monotonic()
            self.previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.pod_stop.hold()  # the hook now waits for this process to save and exit

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step >= state.max_steps:
                # The run ends at this step and writes its outputs, which the preStop hook waits for. No checkpoint
                # here, not even the one the Trainer's own flow asks for at the end under save_strategy "steps":
                # a restart would resume it into one step too many (the Trainer trains one before it checks).
                control.should_save = False
                return
            due = every_minutes > 0 and time.monotonic() - self.saved_at >= every_minutes * 60
            due, stop = agreed(due, self.stop_requested or self.pod_stop.requested())
            if due or stop:
                control.should_save = True
            if stop:
                # This pod's own stop, or only another node's (asked again: it may have come since agreed).
                self.own_pod_stopping = self.stop_requested or self.pod_stop.requested()
                self.stop_requested = control.should_training_stop = True

        def on_save(self, args, state, control, **kwargs):
            self.saved_at = time.monotonic()

        def on_train_end(self, args, state, control, **kwargs):
            if self.previous_handler is not None:
                signal.signal(signal.SIGTERM, self.previous_handler)

    return Checkpoints()


def formatted_rows(settings: SftSettings, tokenizer: Any, processes: int = 1) -> tuple[Any, Any, Any]:
    """TRL's SFTConfig and PEFT's LoraConfig for the settings, and the data rows in TRL's format, masked as they
    train (chat rows: every assistant turn, or the last one where the template cannot mark the turns). The
    evaluate step builds its eval rows with this too (evaluation.py), so they are masked as training masked."""
    seq_len.require_chosen(settings)
    sft_config, lora_config = settings.trl_config(processes)
    rows, chat_loss = trained_rows(settings, tokenizer)
    if chat_loss == LAST_ASSISTANT_TURN:
        sft_config.assistant_only_loss, sft_config.completion_only_loss = False, True
    return sft_config, lora_config, rows


def build_trainer(settings: SftSettings) -> Any:
    """The trainer for `settings`: TRL's SFTTrainer (model and tokenizer read from model_dir, rows formatted, PEFT
    applied), or for classification transformers' Trainer (classify.py)."""
    metrics_path = Path(settings.output_dir) / run_layout.METRICS_FILE
    trained = TrainedTokens()
    checkpoints = checkpoint_callback(settings.checkpoint_every_minutes)
    callbacks = [metrics_callback(metrics_path, trained), checkpoints]
    if settings.task == CLASSIFICATION:
        from transformers import Trainer

        from kfp_finetune.components._shared.transformers import classify

        return classify.build_trainer(settings, counting_trainer(trained, checkpoints, Trainer), callbacks)
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    if settings.task == IMAGE_TEXT:  # the processor: the tokenizer, the image processor, the chat template
        from kfp_finetune.components._shared.transformers.vision import load_processor

        processing = load_processor(settings.model_dir)
    else:
        processing = AutoTokenizer.from_pretrained(settings.model_dir)
    sft_config, lora_config, rows = formatted_rows(settings, processing, world_size())
    trainer = counting_trainer(trained, checkpoints, SFTTrainer)(
        model=settings.model_dir,
        args=sft_config,
        train_dataset=rows,
        processing_class=processing,
        peft_config=lora_config,
        callbacks=callbacks,
    )
    trainer.rows_given = len(rows)  # what unfit_rows_problem compares TRL's prepared rows with
    return trainer


def unfit_rows_problem(settings: SftSettings, trainer: Any) -> str:
    """TRL cuts each row at max_length and drops those left with no trained token (a masked prompt that fills
    tune_max_seq_len: trl SFTTrainer._prepare_dataset): the step log's line about them, "" when none was dropped;
    ConfigError when too many were (unfit_rows.py). Packed runs are not cut row by row."""
    given = getattr(trainer, "rows_given", None)
    if given is None or trainer.args.packing:
        return ""
    dropped = given - len(trainer.train_dataset)
    if dropped <= 0:
        return ""
    line = (
        f"{dropped} of {given} training rows train nothing at tune_max_seq_len={settings.max_seq_len}: their "
        "prompt fills it, so the cut leaves no trained token"
    )
    refused = too_many_unfit(dropped, given)
    if refused:
        raise ConfigError(f"{line} ({refused}): set tune_max_seq_len higher, or shorten or remove those rows")
    return f"{line}; they are left out"


def train(settings: SftSettings) -> dict:
    """Run the fine-tune and write the run folder; returns a summary (steps, mean training loss, output paths)."""
    settings.check()
    settings = seq_len.fit_to_rows(settings)
    processes = world_size()
    settings = run_length.fit_micro_batch(settings, processes)
    run_dir = Path(settings.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("training %s with TRL (%s) on %d process(es)", settings.model_dir, settings.method, processes)
    trainer = build_trainer(settings)
    unpacked = run_length.unpacked_for_floor(settings, trainer)
    if unpacked is not None:  # the packs are too few for a run that learns: the rows, one per sample
        del trainer
        settings = unpacked
        trainer = build_trainer(settings)
    if settings.max_steps is None and settings.max_steps_per_epoch is not None:
        trainer.args.max_steps = run_length.trained_steps(trainer, settings)
        log.info(
            "tune_max_steps_per_epoch=%d: %d steps", settings.max_steps_per_epoch, trainer.args.max_steps
        )
    unfit = unfit_rows_problem(settings, trainer)
    if unfit:
        log.warning("%s", unfit)
    note = experts_note(settings, trainer.model)
    if note:
        log.info("%s", note)
    if is_rank_zero():
        peft_config = getattr(trainer.model, "peft_config", {}).get("default")
        resolved = settings.resolved(processes, trainer.args, peft_config)
        if "sft_config" in resolved:  # what TRL trains on, as it decided (chat rows: every turn, or the last)
            resolved["sft_config"]["completion_only_loss"] = trainer.completion_only_loss
        write_json_atomic(run_dir / run_layout.RESOLVED_CONFIG, resolved)
        # The fast defaults chosen here (fast.py), as the report shows them.
        for choice in resolved["choices"]:
            log.info("chosen %s=%s: %s", choice["setting"], json.dumps(choice["value"]), choice["reason"])
    resume = last_checkpoint(run_dir / TRAINER_DIR)
    if resume is not None:
        log.info("an earlier start of this run saved %s: training resumes from it", resume.name)
    started = time.monotonic()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    summary = {"global_step": result.global_step, "train_loss": result.training_loss, "run_dir": str(run_dir)}
    if trainer.checkpoint_callback.stop_requested and result.global_step < trainer.state.max_steps:
        own_pod = trainer.checkpoint_callback.own_pod_stopping
        # Said before the barrier, for the node's entrypoint and for people: past it, another node's pod may exit,
        # and with it the rendezvous store its agent may hold, whose loss ends this node's agent and this process.
        record_stop(stop_exit_code(own_pod))
        log.info(
            "stopped (%s) at step %d, its checkpoint saved: a restart resumes from it",
            "the pod is stopping" if own_pod else "another node's pod is stopping",
            result.global_step,
        )
        # Every process's part of the checkpoint (its RNG state) is written before any exits: torchrun stops the
        # other workers as soon as one has exited.
        trainer.accelerator.wait_for_everyone()
        return {**summary, "interrupted": True, "own_pod_stopping": own_pod}
    log.info("trained %d steps in %.0f s", result.global_step, time.monotonic() - started)
    trainer.checkpoint_callback.pod_stop.finishing()  # a stop hook now waits for the outputs
    # Every process is done training; the others leave now rather than wait in a barrier while rank 0 merges and
    # writes (a large model's merge on CPU can outlast the collectives' timeout, which would fail the finished run).
    state = gathered_state(trainer)
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.state.destroy_process_group()
    if trainer.is_world_process_zero():
        summary.update(write_outputs(trainer, settings, state))
        shutil.rmtree(run_dir / DATASETS_CACHE, ignore_errors=True)
        shutil.rmtree(run_dir / TRAINER_DIR, ignore_errors=True)  # its checkpoints: the run is complete
    return summary


def experts_note(settings: SftSettings, model: Any) -> str | None:
    """For people, what an adapter run leaves to the base: the mixture-of-experts weights stored as 3D parameters
    (transformers 5's fused experts, e.g. `mlp.experts.down_proj`), which PEFT's all-linear does not reach."""
    if settings.method == "full" or settings.target_parameters:
        return None
    names = {re.sub(r"^.*?layers\.\d+\.", "", name) for name, p in model.named_parameters() if p.ndim == 3}
    if not names:
        return None
    return (
        f"LoRA adapts the linear layers; the experts' weights ({', '.join(sorted(names))}) are 3D parameters "
        "PEFT's all-linear does not reach, so they stay the base's: name them in tune_lora_target_parameters to "
        "adapt them too, or tune_method=full trains them"
    )


def gathered_state(trainer: Any) -> dict | None:
    """Under FSDP2, the whole model's weights gathered to rank 0's CPU (every process takes part, so it runs before
    the process group ends; the other ranks get an empty dict); None where each process holds the whole model."""
    if not trainer.is_fsdp_enabled:
        return None
    return trainer.accelerator.get_state_dict(trainer.model)


def write_outputs(trainer: Any, settings: SftSettings, state: dict | None = None) -> dict:
    """The adapter (PEFT runs) and the merged HF folder, each renamed into place only when complete; `state`: the
    weights gathered from the processes that each held a shard (gathered_state), else the model's own."""
    run_dir = Path(settings.output_dir)
    model = trainer.accelerator.unwrap_model(trainer.model)
    written = {}
    if settings.method == "full":
        state = stored_as_base(model, settings.model_dir, state)
        with atomic_dir(run_dir / run_layout.MERGED_DIR) as tmp:
            model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            run_layout.copy_model_files(settings.model_dir, tmp)
    else:
        with atomic_dir(run_dir / run_layout.ADAPTER_DIR) as tmp:
            # PEFT keeps the adapter's weights of a given state dict.
            model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            if settings.task == CLASSIFICATION:
                from kfp_finetune.components._shared.transformers.classify import write_labels

                write_labels(model, tmp)
        written["adapter_dir"] = str(run_dir / run_layout.ADAPTER_DIR)
        # Merged from the saved adapter into the base read afresh on CPU: the same files whether the run trained
        # a bf16 or a 4-bit (QLoRA) base, and the same merge as a later step's (face.merged_model_dir).
        # Replaced, not reused: a merged folder from an earlier run into this folder would be stale.
        with atomic_dir(run_dir / run_layout.MERGED_DIR) as tmp:
            run_layout.merge_adapter(settings.model_dir, run_dir / run_layout.ADAPTER_DIR, tmp)
    written["merged_dir"] = str(run_dir / run_layout.MERGED_DIR)
    return written


def stored_as_base(model: Any, base_dir: str, state: dict | None = None) -> dict | None:
    """A full fine-tune's floating weights cast to the dtype its base is stored in, the one a consumer's
    from_pretrained(dtype="auto") reads the base in (config.json's dtype, else the weights'): it trained fp32 master
    weights, which saved as they are would make merged/ twice a bf16 base's size. What transformers keeps in fp32
    at that dtype (the model's _keep_in_fp32_modules_strict; for fp16 also _keep_in_fp32_modules) stays fp32.
    The model's own tensors are cast in place (None returned); a gathered `state` is returned cast."""
    import torch
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(base_dir).dtype or run_layout.weights_dtype(base_dir)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    tensors = state if state is not None else dict([*model.named_parameters(), *model.named_buffers()])
    if dtype is None or all(t.dtype == dtype for t in tensors.values() if t.is_floating_point()):
        return state
    kept = set(getattr(model, "_keep_in_fp32_modules_strict", None) or ())
    if dtype == torch.float16:
        kept |= set(getattr(model, "_keep_in_fp32_modules", None) or ())
    log.info("merged model in the base's dtype, %s", str(dtype).removeprefix("torch."))
    cast = {}
    for name, tensor in tensors.items():
        cast[name] = (
            tensor.to(dtype) if tensor.is_floating_point() and not kept & set(name.split(".")) else tensor
        )
        if state is None:
            tensor.data = cast[name]
    return None if state is None else cast


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", help="a JSON file with the SftSettings fields")
    args = parser.parse_args(argv)
    summary = train(SftSettings.from_json(args.settings))
    if is_rank_zero():
        print(summary, flush=True)
    # Stopped by a pod's stop: not taken for a finished run, and replaced as the runtimes' podFailurePolicy says.
    return stop_exit_code(summary["own_pod_stopping"]) if summary.get("interrupted") else 0


if __name__ == "__main__":
    sys.exit(main())
