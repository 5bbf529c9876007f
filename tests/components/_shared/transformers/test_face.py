"""The transformers wing's face: every name engines.FACE asks for, in its wing's folder."""

from __future__ import annotations

from pathlib import Path

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.transformers import face


def test_the_face_has_every_name_and_lives_in_its_wing():
    assert face.NAME == "transformers" and face.PACKAGES == ("trl",)
    assert [name for name in engines.FACE if not hasattr(face, name)] == []
    assert Path(face.__file__).parent.name == face.NAME
    assert Path(face.evaluation().__file__).parent.name == face.NAME


def test_both_engines_evaluation_modules_have_the_same_names():
    from kfp_finetune.components._shared.torchtune import evaluation as torchtune_evaluation

    assert face.evaluation().__all__ == torchtune_evaluation.__all__
    for module in (face.evaluation(), torchtune_evaluation):
        assert [name for name in module.__all__ if not hasattr(module, name)] == []


def test_it_serves_causal_lms_transformers_has_natively_and_says_why_not_otherwise(tmp_path):
    served, why = face.serves(tmp_path, {"model_type": "qwen3_moe"})
    assert served and "Qwen3MoeForCausalLM" in why
    served, why = face.serves(tmp_path, {"model_type": "made_up_lm"})
    assert not served and "no causal-LM class for model_type 'made_up_lm'" in why
    remote = {"model_type": "qwen3_moe", "auto_map": {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}}
    served, why = face.serves(tmp_path, remote)
    assert not served and "remote code" in why


def test_the_wing_is_registered_after_torchtune():
    assert list(engines.WINGS) == ["torchtune", face.NAME]  # auto tries torchtune first


def test_serving_is_decided_from_transformers_files_without_importing_torch():
    import subprocess
    import sys

    code = (
        "import sys; from kfp_finetune.components._shared.transformers import face; "
        "print(face.serves(None, {'model_type': 'qwen3_moe'})[0], 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "False"]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from kfp_finetune.components._shared.transformers.installed import model_classes

    assert model_classes() == dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def test_a_classifier_is_served_by_the_sequence_classification_mapping(tmp_path):
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    from kfp_finetune.components._shared.transformers.installed import model_classes

    assert model_classes("classification") == dict(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)
    served, why = face.serves(tmp_path, {"model_type": "bert"}, "classification")
    assert served and "BertForSequenceClassification" in why
    # A causal LM transformers has no sequence-classification head for (cohere) is refused for classification.
    served, why = face.serves(tmp_path, {"model_type": "cohere"}, "classification")
    assert not served and "no sequence-classification class" in why
    assert face.serves(tmp_path, {"model_type": "cohere"})[0]

    assert face.read_resolved_config(tmp_path) == {}
    assert face.last_adapter_state(tmp_path) is None
