"""Turn torchtune's last `epoch_N/` folder into what consumers load: `merged/` (an HF model folder with no
adapter files) and, for PEFT methods, `adapter/` (a PEFT adapter whose config names the base model).

An adapter run saves only its adapter by default (no GPU idles while rank 0 merges at each epoch end): then there
is no `merged/` yet; export and evaluate build it after training, on CPU (_shared/torchtune/merge.py).

torchtune puts both in one folder, and its `adapter_config.json` lacks `base_model_name_or_path` unless the base
model folder had `original_repo_id.json`, and lacks `use_dora`; PEFT and serving stacks need both.
Files are hard-linked from `epoch_N/` when the filesystem allows (no second copy of the weights).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.storage import hash_files
from kfp_finetune.components._shared.torchtune.merge import merged_model_dir
from kfp_finetune.components._shared.torchtune.run_layout import MERGED_DIR, TRAINING_STATE, last_epoch_dir
from kfp_finetune.components._shared.workspace import atomic_dir

log = get_logger(__name__)

# Set by `kfp-finetune run-local` and `demo` (inherited by kfp.local's step processes): a folder outside the run
# workspace, which kfp.local deletes when the run ends, even when the quality gate stopped the export.
LOCAL_OUTPUT_ENV = "KFP_FINETUNE_LOCAL_OUTPUT"
TUNED_MODEL_DIR = "tuned-model"
ADAPTER_DIR = "adapter"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class FinalCheckpoint:
    run_dir: Path
    merged_dir: Path | None
    adapter_dir: Path | None
    # run-dir-relative path -> {size, mtime_ns, sha256 (, md5, git_blob_sha1)}: the one hash of each final file
    # after training; export reuses it for every file it publishes unchanged.
    files: dict[str, dict] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f["size"] for f in self.files.values())


def finalize_checkpoint(run_dir: str | os.PathLike, *, method: str, base_model: str) -> FinalCheckpoint:
    """Build `merged/` and `adapter/` from the last epoch; `base_model` names the base (repo id or path)."""
    run_dir = Path(run_dir)
    epoch = last_epoch_dir(run_dir)
    adapter_names = {ADAPTER_WEIGHTS, ADAPTER_CONFIG}
    merged_files = [
        p
        for p in epoch.rglob("*")
        if p.is_file() and p.relative_to(epoch).parts[0] not in TRAINING_STATE | adapter_names
    ]
    has_merged = any(p.name.endswith(".safetensors") for p in merged_files)
    result = FinalCheckpoint(run_dir, None, None)
    if has_merged:
        with atomic_dir(run_dir / MERGED_DIR) as tmp:
            for source in merged_files:
                _link(source, tmp / source.relative_to(epoch))
        result.merged_dir = run_dir / MERGED_DIR
    else:  # an earlier attempt's merge would be reused for this training's adapter (merge.merged_model_dir)
        shutil.rmtree(run_dir / MERGED_DIR, ignore_errors=True)
    if method != "full":
        if not (epoch / ADAPTER_WEIGHTS).is_file():
            raise FileNotFoundError(f"{method} training wrote no {ADAPTER_WEIGHTS} in {epoch}")
        with atomic_dir(run_dir / ADAPTER_DIR) as tmp:
            _link(epoch / ADAPTER_WEIGHTS, tmp / ADAPTER_WEIGHTS)
            config = json.loads((epoch / ADAPTER_CONFIG).read_text())
            config["base_model_name_or_path"] = config.get("base_model_name_or_path") or base_model
            config.setdefault("task_type", "CAUSAL_LM")
            config["use_dora"] = method == "dora"
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        result.adapter_dir = run_dir / ADAPTER_DIR
    return hashed(result, epoch)


def hand_on(run_dir: str | os.PathLike, merged_dir: Path | None, adapter_dir: Path | None) -> FinalCheckpoint:
    """The final folders an engine wrote in their consumers' layout already (the transformers engine), hashed."""
    return hashed(FinalCheckpoint(Path(run_dir), merged_dir, adapter_dir), Path(run_dir))


def hashed(result: FinalCheckpoint, source: Path) -> FinalCheckpoint:
    """`result` with the one hash of each final file (`source`: where training wrote them, for the error)."""
    final = [
        path
        for folder in (result.merged_dir, result.adapter_dir)
        for path in sorted(p for p in (folder.rglob("*") if folder else []) if p.is_file())
    ]
    for path, digest in hash_files(final, max_workers=min(8, os.cpu_count() or 1)).items():
        result.files[path.relative_to(result.run_dir).as_posix()] = digest.as_dict()
    if not result.files:
        raise FileNotFoundError(f"no model weights in {source}: nothing to hand on")
    return result


def keep_local_copy(checkpoint: FinalCheckpoint, task_name: str, base_dir: Path) -> Path | None:
    """Under a local run (LOCAL_OUTPUT_ENV set), link the final model folders into
    `<that folder>/tuned-model/<task_name>/{merged,adapter}`; returns that folder, or None when not asked. An
    adapter run that saved only its adapter is merged into `base_dir` first (on CPU, after training: a local run's
    user gets a model to load even when the quality gate stops the export; the export reuses the merge)."""
    root = os.environ.get(LOCAL_OUTPUT_ENV)
    if not root:
        return None
    target = Path(root) / TUNED_MODEL_DIR / re.sub(r"[^A-Za-z0-9._-]+", "-", task_name)
    merged = checkpoint.merged_dir
    if merged is None and checkpoint.adapter_dir is not None:
        try:
            merged = merged_model_dir(checkpoint.run_dir, base_dir)
        except ImportError as err:  # a step without torch: the adapter alone is kept
            log.warning("tuned model: only the adapter is kept (merging it needs torch: %s)", err)
    for folder in (merged, checkpoint.adapter_dir):
        if folder is None:
            continue
        with atomic_dir(target / folder.name) as tmp:
            for source in (p for p in folder.rglob("*") if p.is_file()):
                _link(source, tmp / source.relative_to(folder))
    return target


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:  # filesystems without hard links (some network volumes)
        shutil.copy2(source, target)
