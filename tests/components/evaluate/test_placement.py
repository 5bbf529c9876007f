"""evaluate's device and dtype (placement.py): auto follows the tuned model's training, from its model metadata
(TunedModel.device/.dtype) or the run's resolved YAML; GPU visibility is an input, so no GPU is needed here."""

import pytest

from kfp_finetune.components._shared.contract import TunedModel
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.evaluate.placement import (
    CPU_BATCH,
    MAX_GPU_BATCH,
    Placement,
    Trained,
    choose_placement,
    eval_batch_size,
)

GPU = {"gpu_visible": True, "bf16_supported": True}
NO_GPU = {"gpu_visible": False, "bf16_supported": False}


def placed(requested, trained, **hardware):
    p = choose_placement(requested, trained, **hardware)
    return p.device, p.dtype


def test_a_model_trained_on_gpus_is_evaluated_on_the_gpu_in_its_training_dtype():
    metadata = TunedModel(workspace_path="runs/x/merged", device="cuda", dtype="bf16").to_metadata()
    trained = Trained.of(metadata, {})
    assert placed("auto", trained, **GPU) == ("cuda", "bf16")
    assert placed("auto", Trained.of({}, {"device": "cuda", "dtype": "fp32"}), **GPU) == ("cuda", "fp32")
    assert placed("cuda:1", trained, **GPU) == ("cuda:1", "bf16")
    assert placed("cpu", trained, **GPU) == ("cpu", "fp32")
    # A GPU without bf16 (e.g. a T4): the step falls back to fp32 rather than fail.
    assert placed("auto", trained, gpu_visible=True, bf16_supported=False) == ("cuda", "fp32")


def test_without_a_gpu_here_the_step_runs_on_cpu_and_says_why():
    trained = Trained.of({"device": "cuda", "dtype": "bf16"}, {})
    choice = choose_placement("auto", trained, **NO_GPU)
    assert (choice.device, choice.dtype) == ("cpu", "fp32") and "eval_gpus" in choice.reason
    assert placed("auto", Trained.of({}, {"device": "cpu", "dtype": "fp32"}), **NO_GPU) == ("cpu", "fp32")
    with pytest.raises(ConfigError, match="sees no GPU"):
        choose_placement("cuda", trained, **NO_GPU)


def test_a_model_trained_on_cpu_still_uses_a_gpu_it_is_given_in_bf16():
    assert placed("auto", Trained.of({"device": "cpu", "dtype": "fp32"}, {}), **GPU) == ("cuda", "bf16")
    assert placed("auto", Trained(), **GPU) == ("cuda", "bf16")  # not trained by this library


def test_the_metadata_wins_over_the_resolved_yaml():
    trained = Trained.of({"device": "cuda", "dtype": "fp16"}, {"device": "cpu", "dtype": "fp32"})
    assert placed("auto", trained, **GPU) == ("cuda", "fp16")


LLAMA_8B = {"vocab_size": 128256, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "hidden_size": 4096}  # fmt: skip
GIB = 1 << 30


def batch(requested, device, weight_gib=16, longest=576, gpu_gib=80):
    placement = Placement(device, "fp32" if device == "cpu" else "bf16", "")
    return eval_batch_size(requested, placement, LLAMA_8B, weight_gib * GIB, longest, gpu_gib * GIB)[0]


def test_the_eval_batch_grows_with_the_gpu_memory_the_weights_leave():
    assert batch(-1, "cpu") == CPU_BATCH  # CPU: the fixed batch
    assert batch(12, "cuda") == batch(12, "cpu") == 12  # set: as given
    # 8B in bf16 on an 80 GB GPU, 512-token prompts + 64 new tokens: ~0.9 MB a token of logits/softmax + KV cache.
    on_h100 = batch(-1, "cuda")
    assert CPU_BATCH < on_h100 <= MAX_GPU_BATCH and on_h100 % CPU_BATCH == 0
    assert batch(-1, "cuda", gpu_gib=141) >= on_h100  # more memory: never fewer
    assert batch(-1, "cuda", longest=4096) < on_h100  # longer sequences: fewer
    assert batch(-1, "cuda", longest=16) == MAX_GPU_BATCH  # short ones: the cap
    assert batch(-1, "cuda", weight_gib=79) == CPU_BATCH  # nothing left beside the weights: the floor
    size, why = eval_batch_size(-1, Placement("cuda", "bf16", ""), LLAMA_8B, 16 * GIB, 576, 80 * GIB)
    assert f"{size} sequences" in why and "576 tokens" in why
