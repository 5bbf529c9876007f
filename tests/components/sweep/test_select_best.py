"""select-best: the sweep's best trial, and the image that trained it (where the sweep's export runs)."""

from types import SimpleNamespace

import pytest

from kfp_finetune.components._shared.errors import ContractError
from kfp_finetune.components.sweep.sweep import select_best


def _artifact(tmp_path, name, metadata):
    return SimpleNamespace(path=str(tmp_path / name), metadata=metadata)


def _trials(tmp_path, images):
    models = [
        _artifact(
            tmp_path,
            f"model-{i}",
            {"run_dir": f"runs/trial-{i}", "engine": "transformers", "model_image": image},
        )
        for i, image in enumerate(images)
    ]
    metrics = [
        _artifact(tmp_path, f"metrics-{i}", {"tuned_eval_loss": loss, "passed": passed})
        for i, (loss, passed) in enumerate([(2.0, 1.0), (1.5, 0.0), (1.8, 1.0)])
    ]
    return models, metrics, _artifact(tmp_path, "best-model", {}), _artifact(tmp_path, "best-metrics", {})


def test_the_best_trial_its_verdict_and_its_image_are_passed_on(tmp_path):
    models, metrics, best_model, best_metrics = _trials(tmp_path, ["reg.example/a:1", "reg.example/b:1", "c"])
    image = tmp_path / "outputs" / "model_image"
    passed = select_best(models, metrics, best_model, best_metrics, str(image), metric="eval_loss")
    assert (passed, image.read_text()) == (False, "reg.example/b:1"), "trial 1: the lowest loss, gate failed"
    assert best_model.metadata["run_dir"] == "runs/trial-1"
    assert (best_model.metadata["sweep_trial"], best_metrics.metadata["tuned_eval_loss"]) == (1, 1.5)


def test_a_best_trial_without_its_image_is_refused_naming_the_input(tmp_path):
    """No image to fall back on would be right: the trial may have trained on a trainer_image of the user's."""
    models, metrics, best_model, best_metrics = _trials(tmp_path, ["reg.example/a:1", "", "c"])
    with pytest.raises(ContractError, match=r"models\[1\] artifact has no model_image"):
        select_best(models, metrics, best_model, best_metrics, str(tmp_path / "image"), metric="eval_loss")
