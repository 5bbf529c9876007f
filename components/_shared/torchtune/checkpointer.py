"""The checkpointer every run's YAML names: HF-format checkpoints in and out, converted by this project's table.

It reads and writes what torchtune 0.6.1's `FullModelHFCheckpointer` does — the same arguments, the same files
(`epoch_N/model-0000k-of-0000n.safetensors` + index, `adapter_model.pt` / `.safetensors`, `adapter_config.json`,
the checkpoint folder's other files, `recipe_state/recipe_state.pt`) and the same state-dict keys for the
recipes — but converts weights through conversions.py, where the project answers for each layout (torchtune's
Gemma 2 mapping and PEFT adapter rows are wrong in 0.6.1, and families newer than 0.6.1 are not in its table).

Needs torch and torchtune: it runs where training, evaluation and export run (the trainer image).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torchtune import training
from torchtune.models.convert_weights import tune_to_peft_adapter_config
from torchtune.training.checkpointing._utils import (
    ADAPTER_CONFIG_FNAME,
    ADAPTER_MODEL_FNAME,
    RECIPE_STATE_DIRNAME,
    REPO_ID_FNAME,
    SAFETENSOR_INDEX_FNAME,
    SHARD_FNAME,
    SUFFIXES_TO_NOT_COPY,
    TORCH_INDEX_FNAME,
    check_outdir_not_in_ckptdir,
    copy_files,
    get_adapter_checkpoint_path,
    get_model_checkpoint_path,
    get_recipe_checkpoint_path,
    safe_torch_load,
)

from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune.conversions import conversion, tune_to_peft_adapter

log = get_logger(__name__)


class HFCheckpointer:
    """HF-format checkpoints, converted per `model_type` by conversions.CONVERSIONS.

    Args are torchtune's FullModelHFCheckpointer's (minus the deprecated `resume_from_checkpoint`):
        checkpoint_dir: the HF model folder (config.json and the weights).
        checkpoint_files: the weight files in it, or torchtune's {"filename_format", "max_filename"}.
        model_type: the layout's key in conversions.CONVERSIONS (torchtune's ModelType names, plus ours).
        output_dir: where `epoch_N/` and `recipe_state/` are written (not inside checkpoint_dir).
        adapter_checkpoint / recipe_checkpoint / should_load_recipe_state: resuming, as torchtune resolves them.
        safe_serialization: safetensors (True) or torch .bin files.
    """

    def __init__(
        self,
        checkpoint_dir: str,
        checkpoint_files: list[str] | dict[str, str],
        model_type: str,
        output_dir: str,
        adapter_checkpoint: str | None = None,
        recipe_checkpoint: str | None = None,
        safe_serialization: bool = True,
        should_load_recipe_state: bool = False,
    ) -> None:
        self._layout = conversion(model_type)
        self._checkpoint_dir = Path(checkpoint_dir)
        self._output_dir = Path(output_dir)
        self._safe_serialization = safe_serialization
        self._should_load_recipe_state = should_load_recipe_state
        check_outdir_not_in_ckptdir(ckpt_dir=self._checkpoint_dir, out_dir=self._output_dir)
        self._output_dir.mkdir(parents=True, exist_ok=True)
        self._config = json.loads((self._checkpoint_dir / "config.json").read_text())
        repo_id_file = (self._checkpoint_dir / REPO_ID_FNAME).with_suffix(".json")
        # PEFT's adapter_config.json names its base model only when model-initialize recorded the repo id.
        self.repo_id = json.loads(repo_id_file.read_text()).get("repo_id") if repo_id_file.is_file() else None
        self._adapter_checkpoint = get_adapter_checkpoint_path(
            output_dir=self._output_dir,
            adapter_checkpoint=adapter_checkpoint,
            should_load_recipe_state=should_load_recipe_state,
            pattern=r"^epoch_(\d+)",
        )
        self._recipe_checkpoint = get_recipe_checkpoint_path(
            output_dir=self._output_dir,
            recipe_checkpoint=recipe_checkpoint,
            should_load_recipe_state=should_load_recipe_state,
        )
        self._checkpoint_paths = get_model_checkpoint_path(
            checkpoint_files=checkpoint_files,
            checkpoint_dir=self._checkpoint_dir,
            output_dir=self._output_dir,
            should_load_recipe_state=should_load_recipe_state,
            has_adapter_checkpoint=self._adapter_checkpoint is not None,
        )
        self._weight_map: dict[str, str] = {}  # HF key -> shard number ("0001"), to write shards as read

    def load_checkpoint(self) -> dict[str, Any]:
        """{"model": torchtune state dict} (+ "adapter" and the recipe state when resuming)."""
        self._weight_map = {}
        hf_state_dict: dict[str, torch.Tensor] = {}
        for number, path in enumerate(self._checkpoint_paths, start=1):
            shard = safe_torch_load(path)
            for key, value in shard.items():
                if not isinstance(value, torch.Tensor):
                    raise ValueError(f"{path}: {key!r} is a {type(value).__name__}, not a tensor")
                self._weight_map[key] = f"{number:04}"
            hf_state_dict.update(shard)
            del shard
            gc.collect()
        loaded: dict[str, Any] = {training.MODEL_KEY: self._layout.hf_to_tune(hf_state_dict, self._config)}
        if self._adapter_checkpoint:
            loaded[training.ADAPTER_KEY] = safe_torch_load(self._adapter_checkpoint)
        if self._should_load_recipe_state:
            loaded.update(safe_torch_load(self._recipe_checkpoint, mmap=False))
        return loaded

    def save_checkpoint(
        self,
        state_dict: dict[str, Any],
        epoch: int,
        intermediate_checkpoint: bool = False,
        adapter_only: bool = False,
    ) -> None:
        """Write `epoch_<epoch>/` (and `recipe_state/` for an intermediate checkpoint), as torchtune's does."""
        epoch_dir = self._output_dir / f"epoch_{epoch}"
        epoch_dir.mkdir(parents=True, exist_ok=True)
        if not adapter_only:
            self._save_model(self._layout.tune_to_hf(state_dict[training.MODEL_KEY], self._config), epoch_dir)
        if training.ADAPTER_KEY in state_dict:
            self._save_adapter(state_dict[training.ADAPTER_KEY], epoch_dir)
        elif adapter_only:
            raise ValueError("adapter_only=True, but the state dict holds no adapter weights")
        if training.ADAPTER_CONFIG in state_dict and self._layout.peft_adapter:
            peft_config = tune_to_peft_adapter_config(
                adapter_config=dict(state_dict[training.ADAPTER_CONFIG]), base_model_name_or_path=self.repo_id
            )
            # The recipes leave DoRA out of the config: PEFT would load a DoRA adapter as plain LoRA.
            adapter = state_dict.get(training.ADAPTER_KEY, {})
            peft_config["use_dora"] = any(key.endswith(".magnitude") for key in adapter)
            (epoch_dir / f"{ADAPTER_CONFIG_FNAME}.json").write_text(json.dumps(peft_config))
        copy_files(self._checkpoint_dir, epoch_dir, ignore_suffixes=SUFFIXES_TO_NOT_COPY)
        if intermediate_checkpoint:
            recipe_state = {
                key: value
                for key, value in state_dict.items()
                if key not in (training.MODEL_KEY, training.ADAPTER_KEY, training.ADAPTER_CONFIG)
            }
            path = self._output_dir / RECIPE_STATE_DIRNAME / "recipe_state.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(recipe_state, path)
            log.info("recipe state saved to %s", path)

    def _save_model(self, hf_state_dict: dict[str, torch.Tensor], epoch_dir: Path) -> None:
        """Shards as the checkpoint was read (a key not read, e.g. a tied output written back, joins the last)."""
        last = max(self._weight_map.values(), default="0001")
        shards: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in hf_state_dict.items():
            shards.setdefault(self._weight_map.get(key, last), {})[key] = tensor
        suffix = ".safetensors" if self._safe_serialization else ".bin"
        names = {
            number: SHARD_FNAME.format(cpt_idx=number.zfill(5), num_shards=f"{len(shards)}".zfill(5)) + suffix
            for number in shards
        }
        total_size = 0
        for number, tensors in shards.items():
            path = epoch_dir / names[number]
            if self._safe_serialization:
                save_file(tensors, str(path), metadata={"format": "pt"})
            else:
                torch.save(tensors, path)
            total_size += sum(t.numel() * t.element_size() for t in tensors.values())
            log.info("model shard %s saved (%.2f GiB)", path.name, path.stat().st_size / 1024**3)
        index = {
            "metadata": {"total_size": total_size},
            "weight_map": {key: names[number] for number, tensors in shards.items() for key in tensors},
        }
        index_name = SAFETENSOR_INDEX_FNAME if self._safe_serialization else TORCH_INDEX_FNAME
        (epoch_dir / index_name).write_text(json.dumps(index, indent=2))

    def _save_adapter(self, adapter: dict[str, torch.Tensor], epoch_dir: Path) -> None:
        """torchtune's own names (`.pt`, what a resume loads) and, where PEFT can load it, PEFT's."""
        torch.save(adapter, epoch_dir / f"{ADAPTER_MODEL_FNAME}.pt")
        if not self._layout.peft_adapter:
            log.warning(
                "the %s layout has no PEFT adapter format: only adapter_model.pt is written",
                self._layout.model_type,
            )
            return
        peft = tune_to_peft_adapter(adapter, self._config, self._layout)
        if self._safe_serialization:
            save_file(peft, str(epoch_dir / f"{ADAPTER_MODEL_FNAME}.safetensors"), metadata={"format": "pt"})
        else:
            torch.save(peft, epoch_dir / f"{ADAPTER_MODEL_FNAME}.bin")
