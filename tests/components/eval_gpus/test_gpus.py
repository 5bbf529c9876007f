"""eval-gpus: the evaluate step gets one GPU when the fine-tune used GPUs, unless eval_gpus says otherwise."""

import pytest

from kfp_finetune.components.eval_gpus.gpus import gpus_for_evaluate


def test_one_gpu_when_training_used_gpus_else_none_and_an_explicit_count_wins():
    assert gpus_for_evaluate(-1, 8) == 1
    assert gpus_for_evaluate(-1, 0) == 0
    assert gpus_for_evaluate(0, 8) == 0
    assert gpus_for_evaluate(2, 0) == 2
    with pytest.raises(ValueError, match="eval_gpus must be -1"):
        gpus_for_evaluate(-2, 1)
