"""Merge a fine-tune's LoRA / DoRA / QLoRA adapter into its base model after training, on CPU, off the GPUs.

Adapter runs save only the adapter while they train (resolve.py: save_adapter_weights_only), so no GPU waits at an
epoch end while rank 0 merges and writes the whole model. The step that needs merged weights (export, evaluate's
lm-eval tasks) builds them here, once per run: `<run>/merged/`, written into a temp folder and renamed into place,
reused by every later consumer.

The merged folder is what torchtune 0.6.1's LoRA recipes write at an epoch end, tensor for tensor: the run's own
`model` node instantiated in the training dtype (so QLoRA's base weights go through NF4 and back, as the recipe's
state-dict hook dequantizes them), the base weights and the adapter loaded as the recipe loads them, torchtune's
`get_merged_lora_ckpt` on the CPU state dict (where the recipes merge too), and the run's own checkpointer writing
the HF files (same shards, index, copied config and tokenizer files).

Memory: one copy of the model in the training dtype, as the recipes' rank-0 save holds (lora_model.py builds it on
the meta device; QLoRA's NF4 weights take about a quarter of their bf16 size beside the loaded base).

torch and torchtune are imported inside the functions: the module imports where they are not installed.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune import flex_attention, run_layout
from kfp_finetune.components._shared.torchtune.lora_model import load_lora_model
from kfp_finetune.components._shared.torchtune.run_layout import ADAPTER_STATE, MERGED_DIR, RESOLVED_CONFIG
from kfp_finetune.components._shared.workspace import atomic_dir

log = get_logger(__name__)

# Checkpointer arguments that would make it resume from the run folder instead of reading the base model.
_RESUME_ARGUMENTS = ("adapter_checkpoint", "recipe_checkpoint", "resume_from_checkpoint")
_CHECKPOINTER_SCRATCH = ".checkpointer"
_PROGRESS_EVERY = 0.1  # log the merge's progress every tenth of the modules


def merged_model_dir(run_dir: str | os.PathLike, base_dir: str | os.PathLike) -> Path:
    """`<run_dir>/merged/`, merged from the run's last adapter into `base_dir` unless an earlier step built it."""
    run_dir = Path(run_dir)
    final = run_dir / MERGED_DIR
    if final.is_dir():  # atomic_dir renames only a complete folder into place
        log.info("merged model: reusing %s", final)
        return final
    config = run_layout.read_resolved_config(run_dir)
    if not config:
        raise ConfigError(
            f"cannot merge the adapter: the fine-tune run folder {run_dir} has no {RESOLVED_CONFIG}"
        )
    with atomic_dir(final) as tmp:
        merge_adapter(base_dir, config, last_adapter(run_dir), tmp)
    return final


def last_adapter(run_dir: str | os.PathLike) -> Path:
    """The adapter of the run's last epoch, `epoch_N/adapter_model.pt`."""
    found = run_layout.last_adapter_state(run_dir)
    if found is None:
        raise ConfigError(
            f"cannot merge the adapter: no epoch_N/{ADAPTER_STATE} in the fine-tune run folder {run_dir}"
        )
    return found


def merge_adapter(
    base_dir: str | os.PathLike, run_config: dict, adapter_file: str | os.PathLike, out_dir: str | os.PathLike
) -> None:
    """Write into the empty folder `out_dir` the HF model torchtune's LoRA recipe would have saved: `base_dir`'s
    weights with the adapter `adapter_file` (torchtune's names) merged in, as the run's resolved YAML
    `run_config` (its `model`, `checkpointer` and `dtype`) trained them."""
    import torch
    from omegaconf import OmegaConf
    from torchtune import config, training

    started = time.monotonic()
    # The builder without the packed-CUDA attention wrapper: attention does not change the weights.
    model_node = flex_attention.unwrap(run_config.get("model") or {})
    if "lora_rank" not in model_node or "lora_alpha" not in model_node:
        raise ConfigError(
            "cannot merge: the run's `model` node is not a LoRA model (it has no LoRA rank or alpha)"
        )
    out_dir = Path(out_dir)
    scratch = out_dir / _CHECKPOINTER_SCRATCH
    checkpointer = config.instantiate(OmegaConf.create(_checkpointer_node(run_config, base_dir, scratch)))
    dtype = training.get_dtype(run_config.get("dtype"), device=torch.device("cpu"))
    log.info(
        "merging %s into the base model %s (%s)", adapter_file, base_dir, str(dtype).removeprefix("torch.")
    )
    model = load_lora_model(
        model_node, checkpointer, Path(adapter_file), dtype=dtype, device=torch.device("cpu")
    )
    log.info("model built with the base weights and the adapter (%.0f s)", time.monotonic() - started)
    state_dict = model.state_dict()
    del model  # its weights live on in state_dict, merged in place
    merged = _merge(state_dict, rank=model_node["lora_rank"], alpha=model_node["lora_alpha"])
    log.info("adapter merged (%.0f s); writing the HF files", time.monotonic() - started)
    checkpointer.save_checkpoint({training.MODEL_KEY: merged}, epoch=0)
    for path in (scratch / "epoch_0").iterdir():
        path.rename(out_dir / path.name)
    shutil.rmtree(scratch)
    log.info("merged model written to %s (%.0f s)", out_dir, time.monotonic() - started)


def _checkpointer_node(run_config: dict, base_dir: str | os.PathLike, output_dir: Path) -> dict:
    """The run's checkpointer, reading the base model from `base_dir` (where this step sees it) into `output_dir`."""
    node = {k: v for k, v in (run_config.get("checkpointer") or {}).items() if k not in _RESUME_ARGUMENTS}
    if "_component_" not in node:
        raise ConfigError("cannot merge: the run's config has no `checkpointer` node")
    node.update(checkpoint_dir=str(base_dir), output_dir=str(output_dir))
    if "should_load_recipe_state" in node:
        node["should_load_recipe_state"] = False
    return node


def _merge(state_dict: dict, *, rank: int, alpha: float) -> dict:
    """torchtune's get_merged_lora_ckpt, one LoRA module at a time so that a long merge logs its progress."""
    from torchtune.modules.peft import get_merged_lora_ckpt

    modules = [key.removesuffix(".lora_a.weight") for key in state_dict if key.endswith(".lora_a.weight")]
    step = max(1, int(len(modules) * _PROGRESS_EVERY))
    for done, module in enumerate(modules, start=1):
        keys = [k for k in (f"{module}.{p}" for p in ("weight", "lora_a.weight", "lora_b.weight", "magnitude"))
                if k in state_dict]  # fmt: skip
        part = get_merged_lora_ckpt({k: state_dict[k] for k in keys}, rank=rank, alpha=alpha)
        for key in keys:  # in place, as torchtune merges the whole state dict: the keys keep their order
            if key in part:
                state_dict[key] = part[key]
            else:
                del state_dict[key]
        if done % step == 0 or done == len(modules):
            log.info("merged %d of %d LoRA modules", done, len(modules))
    return state_dict
