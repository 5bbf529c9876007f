"""evaluate's device and dtype (placement.py): auto follows the tuned model's training, from its model metadata
(TunedModel.device/.dtype) or the run's resolved YAML; GPU visibility is an input, so no GPU is needed here."""

import pytest

from kfp_finetune.components._shared.contract import TunedModel
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.evaluate.placement import Trained, choose_placement

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
