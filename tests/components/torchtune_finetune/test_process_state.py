"""process_state.kept: whatever a block changes of the process-wide state training starts from is put back."""

from __future__ import annotations

import os
import random
import signal

import numpy
import torch

from kfp_finetune.components.torchtune_finetune import process_state


def test_everything_a_block_changes_is_put_back(monkeypatch):
    monkeypatch.delenv("KFP_FINETUNE_TEST_ADDED", raising=False)
    monkeypatch.setenv("KFP_FINETUNE_TEST_CHANGED", "before")
    before = process_state.snapshot()
    handler = signal.getsignal(signal.SIGTERM)
    with process_state.kept():
        torch.manual_seed(7), numpy.random.seed(7), random.seed(7)
        torch.rand(3), numpy.random.rand(3), random.random()
        torch.set_default_dtype(torch.float64)
        torch.set_default_device("meta")
        torch.set_grad_enabled(False)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.autograd.set_detect_anomaly(True)
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.benchmark = True
        torch.set_num_threads(1)
        os.environ["KFP_FINETUNE_TEST_ADDED"] = "1"
        os.environ["KFP_FINETUNE_TEST_CHANGED"] = "after"
        signal.signal(signal.SIGTERM, lambda *_: None)
    after = process_state.snapshot()
    assert torch.equal(after.pop("torch random"), before.pop("torch random"))
    numpy_after, numpy_before = after.pop("numpy random"), before.pop("numpy random")
    assert numpy_after[0] == numpy_before[0] and (numpy_after[1] == numpy_before[1]).all()
    assert numpy_after[2:] == numpy_before[2:]
    assert after == before
    assert signal.getsignal(signal.SIGTERM) is handler
    assert torch.empty(1).device.type == "cpu" and torch.empty(1).dtype == torch.float32
