"""Did training change the model (weights.py)? Read from safetensors bytes without torch; checked here against
files torch and safetensors write."""

import pytest
import torch
from safetensors.torch import save_file

from kfp_finetune.components.torchtune_finetune.outputs import ADAPTER_WEIGHTS, FinalCheckpoint
from kfp_finetune.components.torchtune_finetune.weights import is_zero, same_weights, tensors, unchanged


def write(folder, name, state):
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / name))
    return folder


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_zero_means_every_element_is_plus_or_minus_zero(tmp_path, dtype):
    zeros = -torch.zeros(64, 8, dtype=dtype)  # -0.0: only the sign bit set
    zeros[::2] = 0.0
    tiny = zeros.clone()
    tiny[63, 7] = torch.finfo(dtype).tiny  # the smallest normal number: one low bit
    folder = write(
        tmp_path, "w.safetensors", {"zero": zeros, "tiny": tiny, "ints": torch.zeros(3, dtype=torch.int64)}
    )
    found = dict(tensors(folder))
    assert is_zero(found["zero"]) and is_zero(found["ints"]) and not is_zero(found["tiny"])


def test_lora_b_all_zero_is_an_unchanged_model(tmp_path):
    lora = {"base_model.model.layers.0.attn.q_proj.lora_A.weight": torch.randn(4, 16),
            "base_model.model.layers.0.attn.q_proj.lora_B.weight": torch.zeros(16, 4)}  # fmt: skip
    adapter = write(tmp_path / "adapter", ADAPTER_WEIGHTS, lora)
    checkpoint = FinalCheckpoint(tmp_path, None, adapter)
    assert unchanged(checkpoint, method="lora", base_dir=tmp_path) == (
        f"all 1 lora_B matrices in {adapter / ADAPTER_WEIGHTS} are zero, so the adapter adds nothing to the base"
    )
    lora["base_model.model.layers.0.attn.q_proj.lora_B.weight"][3, 1] = 1e-6
    write(adapter, ADAPTER_WEIGHTS, lora)
    assert unchanged(checkpoint, method="dora", base_dir=tmp_path) == ""


def test_full_weights_equal_to_the_base_are_found_across_dtypes_and_files(tmp_path):
    """fp32 training of a bf16 base writes fp32 files, sharded differently: the values decide, not the bytes."""
    base_state = {f"layers.{i}.w": torch.randn(32, 8, dtype=torch.bfloat16) for i in range(3)}
    base = write(tmp_path / "base", "model.safetensors", base_state)
    merged = tmp_path / "merged"
    write(merged, "model-00001-of-00002.safetensors", {k: base_state[k].float() for k in ("layers.0.w",)})
    write(merged, "model-00002-of-00002.safetensors",
          {k: base_state[k].float() for k in ("layers.1.w", "layers.2.w")})  # fmt: skip
    checkpoint = FinalCheckpoint(tmp_path, merged, None)
    assert same_weights(merged, base) == 3
    assert (
        unchanged(checkpoint, method="full", base_dir=base)
        == f"the 3 tensors of {merged} equal the base model's"
    )
    changed = base_state["layers.2.w"].float()
    changed[0, 0] += 0.5
    write(merged, "model-00002-of-00002.safetensors", {"layers.1.w": base_state["layers.1.w"].float(),
                                                       "layers.2.w": changed})  # fmt: skip
    assert same_weights(merged, base) == 0
    assert unchanged(checkpoint, method="full", base_dir=base) == ""
    half = write(tmp_path / "half", "model.safetensors", {k: v.half() for k, v in base_state.items()})
    assert same_weights(half, base) == 3  # these bf16 values are exact in fp16: the same model
