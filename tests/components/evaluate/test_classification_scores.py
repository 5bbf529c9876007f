"""A sequence classifier's evaluation scores (issue 28 item 4): accuracy and macro-F1 from the predicted classes,
the improvement's paired-bootstrap interval for each (macro-F1 recomputed on every resample, as its summary is),
and the gate on either. Checked on predictions whose answer is worked out by hand."""

import random

import pytest

from kfp_finetune.components._shared.errors import SettingError
from kfp_finetune.components._shared.eval_examples import Example, ModelScores
from kfp_finetune.components._shared.eval_settings import EvalSettings
from kfp_finetune.components.evaluate import paired, scoring


def test_macro_f1_is_the_mean_of_each_class_f1():
    # class 0: TP 2, FP 1, FN 0 -> 4/5; class 1: TP 1, FP 0, FN 2 -> 1/2; class 2: never true, predicted once -> 0.
    predicted, actual = [0, 0, 0, 1, 2], [0, 0, 1, 1, 1]
    assert scoring.macro_f1(predicted, actual) == pytest.approx((4 / 5 + 1 / 2 + 0) / 3)
    assert scoring.macro_f1([1, 1, 1], [1, 1, 1]) == 1.0
    # A majority-class predictor has a high accuracy on skewed data, but a low macro-F1.
    actual = [0] * 9 + [1]
    assert scoring.macro_f1([0] * 10, actual) == pytest.approx((2 * 9 / (2 * 9 + 1) + 0) / 2)


def scores(predictions: list[int], losses: list[float]) -> ModelScores:
    return ModelScores(sum(losses), len(losses), losses, [1] * len(losses), [str(p) for p in predictions], 0.0,
                       predictions=predictions)  # fmt: skip


def examples(classes: list[int]) -> list[Example]:
    return [Example(i, [1, 2], [c], None, "text", str(c), class_id=c) for i, c in enumerate(classes)]


def test_a_classifier_is_summarized_by_its_loss_accuracy_and_macro_f1():
    rows = examples([0, 1, 2, 1])
    result = scores([0, 1, 1, 1], [0.5, 1.0, 2.0, 0.5])
    per_example = paired.example_scores(result, rows)
    assert per_example["accuracy"] == [1.0, 1.0, 0.0, 1.0]
    summary = paired.summarize(result, per_example)
    assert summary == {
        "eval_loss": pytest.approx(1.0),
        "accuracy": 0.75,
        "macro_f1": pytest.approx(scoring.macro_f1([0, 1, 1, 1], [0, 1, 2, 1])),
    }
    assert "perplexity" not in summary and "exact_match" not in summary  # no text is generated


def test_the_improvement_of_each_classification_metric_has_a_paired_interval():
    rng = random.Random(0)
    classes = [rng.randrange(3) for _ in range(200)]
    rows = examples(classes)
    base = [0] * 200  # the majority guess
    tuned = [c if rng.random() < 0.8 else (c + 1) % 3 for c in classes]  # right 80% of the time
    per_example = {
        "tuned": paired.example_scores(scores(tuned, [0.5] * 200), rows),
        "base": paired.example_scores(scores(base, [1.1] * 200), rows),
    }
    intervals, missing = paired.bootstrap_intervals(per_example, confidence=0.95, seed=0)
    assert not missing and set(intervals) == {"eval_loss", "accuracy", "macro_f1"}
    gain = scoring.macro_f1(tuned, classes) - scoring.macro_f1(base, classes)
    assert 0 < intervals["macro_f1"].low < gain < intervals["macro_f1"].high
    accuracy_gain = sum(t == c for t, c in zip(tuned, classes, strict=False)) / 200 - classes.count(0) / 200
    assert intervals["accuracy"].low < accuracy_gain < intervals["accuracy"].high
    # The same predictions for both models: no gain, an interval of nothing.
    same = {"tuned": per_example["tuned"], "base": per_example["tuned"]}
    assert paired.bootstrap_intervals(same, confidence=0.95, seed=0)[0]["macro_f1"].high == 0
    # One example has no spread to measure: both metrics say why.
    one = {label: {k: v[:1] for k, v in found.items()} for label, found in per_example.items()}
    _, missing = paired.bootstrap_intervals(one, confidence=0.95, seed=0)
    assert "macro_f1" in missing["macro_f1"] and "accuracy" in missing["accuracy"]


def test_the_gate_can_be_set_on_accuracy_or_macro_f1():
    for metric in ("accuracy", "macro_f1"):
        EvalSettings(gate_metric=metric).check()
        EvalSettings(thresholds={metric: 0.5}).check()
    assert not scoring.improvement("macro_f1", 0.4, 0.5) > 0  # higher is better


def test_a_metric_the_model_is_not_scored_on_is_refused_before_any_model_is_loaded():
    EvalSettings(gate_metric="macro_f1", thresholds={"eval_loss": 1.0}).check_scored(classifier=True)
    EvalSettings(gate_metric="rouge_l").check_scored(classifier=False)
    with pytest.raises(SettingError, match=r"^gate_metric names exact_match, which a sequence classifier is not "
                                           r"scored on: use eval_loss, accuracy, macro_f1$"):  # fmt: skip
        EvalSettings(gate_metric="exact_match").check_scored(classifier=True)
    with pytest.raises(
        SettingError, match="^thresholds names accuracy, which a language model is not scored on"
    ):
        EvalSettings(thresholds={"accuracy": 0.5}).check_scored(classifier=False)
