"""The driver stand-in resolves resource fields as upstream's initPodSpecPatch does (kfp_driver.py)."""

import pytest

from tests.support import kfp_driver

RESOURCES = {
    "accelerator": {
        "resourceCount": "{{$.inputs.parameters['pipelinechannel--gpus']}}",
        "resourceType": "nvidia.com/gpu",
        "type": "nvidia.com/gpu",
    }
}


def test_a_text_count_sets_the_limit_and_a_number_sets_none():
    assert kfp_driver.accelerator_limits(RESOURCES, {"pipelinechannel--gpus": "2"}) == {"nvidia.com/gpu": "2"}
    assert kfp_driver.accelerator_limits(RESOURCES, {"pipelinechannel--gpus": 2}) == {}


def test_a_constant_count_is_used_as_it_is_and_a_missing_input_is_an_error():
    assert kfp_driver.accelerator_limits({"accelerator": {"count": 1, "type": "nvidia.com/gpu"}}, {}) == {
        "nvidia.com/gpu": "1"
    }
    with pytest.raises(KeyError, match="executorInput did not contain"):
        kfp_driver.accelerator_limits(RESOURCES, {})
