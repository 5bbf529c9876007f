"""Resume checkpoints in a run folder: where they live, when one is complete, which one a run resumes from.

    <run>/resume/step_00000120/   state (recipe.py writes it) + complete.json, the marker, written last
    <run>/resume/.partial-.../    a checkpoint being written: never read, removed by the next one

A checkpoint is written into a partial folder, its marker last, and renamed into place: a kill at any moment leaves
either the previous complete checkpoint or the new one, never a half-written one that looks complete. Only the
newest complete checkpoint is kept (the disk holds one model's training state, not one per interval).

Torch-free: the launcher reads where a run will resume without importing torch; the fine-tune's recipe module
(torchtune_finetune/recipe.py) writes and reads the state.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RESUME_DIR = "resume"
MARKER = "complete.json"
_PARTIAL = ".partial-"
#: The settings block of a resolved YAML that recipe.py reads (`kfp_finetune:` at the top level).
CONFIG_KEY = "kfp_finetune"
#: What `tune run` is given for a resumable recipe: torchtune runs a recipe path outside its registry as a module.
RECIPE_PATH = "kfp_finetune/components/torchtune_finetune/recipe.py"
#: torchtune 0.6.1's recipes the recipe module extends, with their classes; any other (QAT, distillation) runs as
#: torchtune ships it, with no checkpoints inside an epoch.
RESUMABLE = {
    "full_finetune_single_device": "FullFinetuneRecipeSingleDevice",
    "full_finetune_distributed": "FullFinetuneRecipeDistributed",
    "lora_finetune_single_device": "LoRAFinetuneRecipeSingleDevice",
    "lora_finetune_distributed": "LoRAFinetuneRecipeDistributed",
}
#: A checkpoint of an 8B full fine-tune's state (~100 GB) takes minutes; every 30 minutes a kill without a grace
#: period (node loss) costs at most half an hour of training.
DEFAULT_EVERY_MINUTES = 30.0


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint: after `step` optimizer steps, `batches_in_epoch` batches into epoch `epoch` (0-based)."""

    step: int
    epoch: int
    batches_in_epoch: int
    reason: str  # "interval", "SIGTERM" or "pod stop" (its preStop hook asked, recipe.py)
    config_sha256: str  # the resolved config it was trained with: another config does not resume from it
    saved_at: float  # seconds since the epoch
    path: Path | None = None

    def describe(self) -> str:
        return f"step {self.step} (epoch {self.epoch + 1}, saved on {self.reason})"


@dataclass(frozen=True)
class CheckpointSettings:
    """The `kfp_finetune:` block of a resolved YAML."""

    recipe: str
    resume: bool = True
    every_steps: int = 0  # 0: no step interval
    every_minutes: float = DEFAULT_EVERY_MINUTES  # 0: no time interval

    @property
    def checkpoints(self) -> bool:
        """Resume off: no checkpoint is written (none would be read)."""
        return self.resume

    @classmethod
    def from_config(cls, config: dict) -> CheckpointSettings:
        block = dict(config.get(CONFIG_KEY) or {})
        return cls(
            recipe=str(block["recipe"]),
            resume=bool(block.get("resume", True)),
            every_steps=int(block.get("checkpoint_every_steps") or 0),
            every_minutes=float(block.get("checkpoint_every_minutes") or 0.0),
        )

    def as_config(self) -> dict:
        return {
            "recipe": self.recipe,
            "resume": self.resume,
            "checkpoint_every_steps": self.every_steps,
            "checkpoint_every_minutes": self.every_minutes,
        }


def resume_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / RESUME_DIR


def checkpoint_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return resume_root(run_dir) / f"step_{step:08d}"


def partial_dir(run_dir: str | os.PathLike, step: int) -> Path:
    """Where the checkpoint after `step` is written before it is complete (the same name on every rank)."""
    return resume_root(run_dir) / f"{_PARTIAL}step_{step:08d}"


def _read_marker(folder: Path) -> ResumePoint | None:
    try:
        fields = json.loads((folder / MARKER).read_text())
        return ResumePoint(**{**fields, "path": folder})
    except (OSError, ValueError, TypeError):
        return None  # no marker, or one that is not ours: not a complete checkpoint


def latest(run_dir: str | os.PathLike) -> ResumePoint | None:
    """The newest complete checkpoint of the run, or None."""
    root = resume_root(run_dir)
    if not root.is_dir():
        return None
    points = [
        point
        for folder in root.iterdir()
        if folder.is_dir() and not folder.name.startswith(_PARTIAL)
        for point in [_read_marker(folder)]
        if point is not None
    ]
    return max(points, key=lambda p: p.step, default=None)


def publish(partial: Path, point: ResumePoint) -> Path:
    """Mark `partial` complete and move it into place; then drop every older checkpoint and stale partial."""
    marker = partial / MARKER
    scratch = partial / f".{MARKER}.tmp"
    scratch.write_text(json.dumps({k: v for k, v in asdict(point).items() if k != "path"}))
    _fsync_file(scratch)
    os.replace(scratch, marker)
    final = partial.parent / partial.name.removeprefix(_PARTIAL)
    if final.exists():  # the same step saved by an earlier attempt: the new one replaces it
        shutil.rmtree(final)
    os.replace(partial, final)
    _fsync_dir(final.parent)
    for folder in final.parent.iterdir():
        if folder != final and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    return final


def new_point(
    *, step: int, epoch: int, batches_in_epoch: int, reason: str, config_sha256: str
) -> ResumePoint:
    return ResumePoint(step, epoch, batches_in_epoch, reason, config_sha256, round(time.time(), 3))


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
