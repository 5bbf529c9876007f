"""gpu-counts: both steps' GPU counts as text (what KFP's driver reads); evaluation gets one GPU when the
fine-tune used GPUs, unless eval_gpus says otherwise."""

import pytest

from kfp_finetune.components._shared.gpus import gpu_counts


def test_one_gpu_for_evaluation_when_training_used_gpus_else_none_and_an_explicit_count_wins():
    assert gpu_counts(8, -1) == ("8", "1")
    assert gpu_counts(0, -1) == ("0", "0")
    assert gpu_counts(8, 0) == ("8", "0")
    assert gpu_counts(0, 2) == ("0", "2")


@pytest.mark.parametrize(
    ("tune", "evaluate", "message"),
    [(1, -2, "eval_gpus must be -1"), (-1, -1, "tune_gpus_per_node must be 0")],
)
def test_negative_counts_are_refused(tune, evaluate, message):
    with pytest.raises(ValueError, match=message):
        gpu_counts(tune, evaluate)
