"""Build a torchtune LoRA / DoRA / QLoRA model from a run's `model` node, its base weights and its adapter, as the
LoRA recipes' `_setup_model` builds and loads it: the one loader for every step that needs the tuned model back
(evaluate scores it; merge.py folds the adapter into the base).

Memory: one copy of the model in its dtype. The model is built on the meta device and takes the loaded tensors
themselves (`assign`) instead of a second, initialised copy; RoPE caches are not in a state dict, so they are
rebuilt afterwards, as torchtune's distributed recipes do after a meta-device build. A QLoRA model is built for
real on the target device: its NF4 weights quantize what is copied into them.

torch and torchtune are imported inside the functions: the module imports where they are not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_lora_model(
    model_node: dict, checkpointer: Any, adapter_file: Path, *, dtype: Any, device: Any
) -> Any:
    """The LoRA model of `model_node` (a resolved YAML's LoRA builder node) on `device` in `dtype`: the base
    weights from `checkpointer`, then the adapter `adapter_file` (torchtune's names; DoRA magnitudes included),
    both checked with torchtune's validator. Returned in train mode, as built."""
    import torch
    from omegaconf import OmegaConf
    from torchao.dtypes.nf4tensor import NF4Tensor
    from torchtune import config, training
    from torchtune.modules.peft import validate_missing_and_unexpected_for_lora

    node = OmegaConf.create(model_node)
    with training.set_default_dtype(dtype), torch.device("meta"):
        model = config.instantiate(node)
    quantized = any(isinstance(p, NF4Tensor) for p in model.parameters())
    if quantized:
        with training.set_default_dtype(dtype), torch.device(device):
            model = config.instantiate(node)
    # Tensors assigned to a meta-device model are first converted to the dtypes that copying them into the
    # model's own weights would give.
    dtypes = None if quantized else {name: tensor.dtype for name, tensor in model.state_dict().items()}
    base = _as_dtypes(checkpointer.load_checkpoint()[training.MODEL_KEY], dtypes)
    base_missing, base_unexpected = model.load_state_dict(base, strict=False, assign=not quantized)
    del base
    # DoRA's magnitudes are in the adapter: the recipe's initialize_dora_magnitude would be overwritten here.
    adapter = _as_dtypes(torch.load(adapter_file, map_location="cpu", weights_only=True), dtypes)
    lora_missing, lora_unexpected = model.load_state_dict(adapter, strict=False, assign=not quantized)
    validate_missing_and_unexpected_for_lora(
        lora_attn_modules=list(model_node["lora_attn_modules"]),
        apply_lora_to_mlp=bool(model_node.get("apply_lora_to_mlp")),
        apply_lora_to_output=bool(model_node.get("apply_lora_to_output")),
        base_missing=base_missing,
        base_unexpected=base_unexpected,
        lora_missing=lora_missing,
        lora_unexpected=lora_unexpected,
    )
    if not quantized:
        for module in model.modules():
            if hasattr(module, "rope_init"):
                module.rope_init()
        model.to(device)
    on_meta = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if on_meta:
        raise RuntimeError(f"the LoRA model left tensors without values (on the meta device): {on_meta[:5]}")
    return model


def _as_dtypes(state_dict: dict, dtypes: dict | None) -> dict:
    """Each tensor in the dtype of the model weight it loads into, contiguous, as a copy into it would be (None:
    as they are, for a model whose weights are real and copied into)."""
    if dtypes is None:
        return state_dict
    for name, tensor in state_dict.items():
        state_dict[name] = tensor.to(dtypes.get(name, tensor.dtype)).contiguous()
    return state_dict
