"""The Training Operator v1 Hugging Face path through `finetune_pipeline` under kfp.local (issue 28 item 4): Yelp-style
reviews (`text`, a star-rating `label` named by text) as data_type=classification, the project's tiny BERT
classifier as the model, no engine named. The transformers engine trains a sequence classifier, evaluate scores
accuracy and macro-F1 against the base, the gate passes on accuracy beyond the eval set's noise, and export writes
a folder AutoModelForSequenceClassification loads with the data's class names."""

import pytest

from kfp_finetune.pipelines.finetune import finetune_pipeline
from kfp_finetune.tiny.reviews import RATING_WORDS, STARS, write_reviews
from tests.pipelines.test_pipelines import FAST_TRAINING, run_locally

pytest.importorskip("trl")


@pytest.mark.slow
def test_a_bert_classifier_fine_tunes_on_yelp_reviews_through_the_pipeline(tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    base_dir = build_tiny_hf_model(tmp_path / "bert", "bert_classifier")
    destination = tmp_path / "exported"
    settings = {
        **FAST_TRAINING,
        "tune_max_steps_per_epoch": -1,  # whole epochs: 200 rows at batch 8 are 25 steps an epoch, 100 in all
        "tune_epochs": 4,
        "eval_max_samples": 0,
        "data_eval_fraction": 0.2,
    }
    task = run_locally(
        tmp_path, finetune_pipeline, model_uri=str(base_dir), data_uri=str(write_reviews(tmp_path / "yelp.jsonl")),
        data_type="classification", export_destination=str(destination), tune_method="full",
        eval_gate_metric="accuracy", **settings,
    )  # fmt: skip
    outputs = task.outputs
    model = outputs["model"].metadata
    assert (model["engine"], model["task"]) == ("transformers", "classification")
    evaluation = outputs["eval_metrics"].metadata
    assert outputs["passed"] is True and evaluation["num_samples"] == 50
    assert (
        evaluation["tuned_accuracy"] > evaluation["base_accuracy"]
        and evaluation["accuracy_improvement_ci_low"] > 0
    )
    assert evaluation["tuned_macro_f1"] > evaluation["base_macro_f1"]

    exported = AutoModelForSequenceClassification.from_pretrained(destination).eval()
    assert tuple(exported.config.id2label[i] for i in range(5)) == STARS
    tokenizer = AutoTokenizer.from_pretrained(destination)
    reviews = [f"the food was {RATING_WORDS[stars][0]} and the service slow" for stars in range(5)]
    with torch.no_grad():
        predicted = (
            exported(**tokenizer(reviews, return_tensors="pt", padding=True)).logits.argmax(-1).tolist()
        )
    assert sum(p == stars for stars, p in enumerate(predicted)) >= 3  # the exported model reads the stars
    card = (destination / "README.md").read_text()
    assert "pipeline_tag: text-classification" in card and "with TRL on transformers" in card
    assert "| learning rate |" in card  # the hyperparameters trl_config.json recorded
    assert "AutoModelForSequenceClassification.from_pretrained" in card
