"""The fine-tune step's model_image output: the image evaluate runs on, the one that trained the model (issue 28: a
transformers-engine model evaluated on the torchtune trainer image found no TRL there). engine_images is checked
before anything is read or launched."""

import pytest

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.images import TRAINER_IMAGE, TRANSFORMERS_TRAINER_IMAGE
from kfp_finetune.components.torchtune_finetune.finetune import engine_images, model_image


def test_each_engine_names_its_own_trainer_image():
    assert engines.trainer_images() == {
        "torchtune": TRAINER_IMAGE,
        "transformers": TRANSFORMERS_TRAINER_IMAGE,
    }
    chosen = engine_images({})
    assert model_image({}, chosen, "transformers") == TRANSFORMERS_TRAINER_IMAGE
    assert model_image({}, chosen, "torchtune") == TRAINER_IMAGE
    assert model_image({}, chosen, "") == TRAINER_IMAGE  # a model recorded before engines were named


def test_the_images_a_pipeline_was_compiled_with_and_the_trainjob_image_override_win():
    params = {"engine_images": {"transformers": "registry.example/ml/tx:3"}, "trainer_image": ""}
    chosen = engine_images(params)
    assert model_image(params, chosen, "transformers") == "registry.example/ml/tx:3"
    assert (
        model_image(params, chosen, "torchtune") == TRAINER_IMAGE
    )  # an engine not named: this version's own
    # The node pods trained on trainer_image: the model loads there as training did.
    overridden = {**params, "trainer_image": "registry.example/ml/own:1"}
    assert model_image(overridden, chosen, "transformers") == "registry.example/ml/own:1"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (
            {"trl": "registry.example/x:1"},
            r"engine_images: 'trl' is not an engine: use torchtune, transformers",
        ),
        ({"transformers": "Registry.example/X:1"}, r"engine_images\['transformers'\]: .* lower case"),
        ({"torchtune": 3}, r"engine_images\['torchtune'\]: not a string"),
        (["registry.example/x:1"], r"engine_images must map an engine's name to an image"),
    ],
)
def test_bad_engine_images_are_refused_naming_the_entry(given, message):
    with pytest.raises(ConfigError, match=message):
        engine_images({"engine_images": given})
