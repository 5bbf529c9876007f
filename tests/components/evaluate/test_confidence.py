"""The improvement's confidence interval: a paired bootstrap over per-example scores (and lm-eval's normal
approximation), checked on paired data whose answer is known."""

import math
import random

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.evaluate import confidence, scoring
from kfp_finetune.components.evaluate.evaluate import EvalSettings
from kfp_finetune.components.evaluate.lm_eval_tasks import LmEvalScores, flatten_stderrs, task_examples
from kfp_finetune.components.evaluate.paired import bootstrap_intervals, lm_eval_intervals


def loss_drop(tuned_mean: float, base_mean: float) -> float:
    return scoring.improvement("eval_loss", tuned_mean, base_mean)


def paired(shift: float, spread: float, count: int = 100, seed: int = 0) -> tuple[list[float], list[float]]:
    """Base losses per example, and tuned = base - shift + noise of `spread` (the same examples, so paired)."""
    rng = random.Random(seed)
    base = [rng.uniform(1.0, 3.0) for _ in range(count)]
    return [b - shift + rng.gauss(0.0, spread) for b in base], base


def test_a_clear_improvement_lies_above_zero():
    tuned, base = paired(shift=0.3, spread=0.2)
    interval = confidence.paired_bootstrap(tuned, base, [1.0] * 100, loss_drop, confidence=0.95, seed=0)
    gain = loss_drop(sum(tuned) / 100, sum(base) / 100)
    assert 0 < interval.low < gain < interval.high
    assert (interval.examples, interval.confidence) == (100, 0.95)
    assert interval.method == f"paired bootstrap, {confidence.RESAMPLES} resamples"


def test_pure_noise_covers_zero():
    """Noise 10x the shift: the base losses' own spread (1 to 3) cancels in the pairs, the noise does not."""
    tuned, base = paired(shift=0.0, spread=0.2)
    interval = confidence.paired_bootstrap(tuned, base, [1.0] * 100, loss_drop, confidence=0.95, seed=0)
    assert interval.low < 0 < interval.high


def test_pairing_cancels_what_both_models_share():
    """The same small shift on examples that differ a lot: unpaired it would drown, paired it is clear."""
    tuned, base = paired(shift=0.05, spread=0.01)
    interval = confidence.paired_bootstrap(tuned, base, [1.0] * 100, loss_drop, confidence=0.95, seed=0)
    assert interval.low > 0.03


def test_deterministic_with_the_seed_and_wider_with_more_confidence():
    tuned, base = paired(shift=0.02, spread=0.2)
    weights = [float(n) for n in range(1, 101)]

    def interval(**kw):
        return confidence.paired_bootstrap(
            tuned, base, weights, loss_drop, **{"confidence": 0.95, "seed": 0, **kw}
        )

    assert interval() == interval()
    assert interval(seed=1) != interval()
    assert interval(confidence=0.99).low < interval().low < interval(confidence=0.5).low
    assert interval(confidence=0.99).high > interval().high > interval(confidence=0.5).high


def test_weights_make_the_interval_that_of_the_token_weighted_mean():
    """eval_loss is weighted by response tokens: an example with many tokens counts for many."""
    tuned, base = [1.0, 2.0, 2.0, 2.0], [2.0, 1.0, 1.0, 1.0]  # improves only on the first example
    heavy_first = confidence.paired_bootstrap(
        tuned, base, [1000.0, 1, 1, 1], loss_drop, confidence=0.9, seed=0
    )
    uniform = confidence.paired_bootstrap(tuned, base, [1.0] * 4, loss_drop, confidence=0.9, seed=0)
    assert uniform.high <= 0 < 0.99 < heavy_first.high  # one example of 1,000 tokens outweighs three of 1


def test_too_few_examples_and_mismatched_pairs_are_bugs():
    with pytest.raises(ValueError, match="at least 2 paired examples"):
        confidence.paired_bootstrap([1.0], [2.0], [1.0], loss_drop, confidence=0.95, seed=0)
    with pytest.raises(ValueError, match="differ in length"):
        confidence.paired_bootstrap([1.0, 2.0], [2.0], [1.0, 1.0], loss_drop, confidence=0.95, seed=0)


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, math.nan, "0.9", True])
def test_confidence_must_lie_between_0_and_1(level):
    with pytest.raises(ConfigError, match=r"confidence must be a number between 0 and 1.*e\.g\. 0\.95"):
        EvalSettings(confidence=level).check()


def test_normal_interval_from_standard_errors():
    interval = confidence.normal_interval(0.1, 0.03, 0.04, confidence=0.95, examples=50)
    assert interval.low == pytest.approx(0.1 - 1.959964 * 0.05) and interval.high == pytest.approx(
        0.1 + 1.959964 * 0.05
    )
    assert "normal approximation" in interval.method and interval.text() == "95% CI [0.002002, 0.198]"


# --- per-example scores of both models, as evaluate pairs them -------------------------------------------------


def per_example(losses, tokens, exact):
    return {"eval_loss": losses, "tokens": tokens, "exact_match": exact, "token_f1": exact, "rouge_l": exact}


def test_evaluate_pairs_each_metric_as_its_summary_is_computed():
    """Loss intervals are token-weighted over examples with response tokens, perplexity is exp of the resampled
    mean loss, generation metrics use the examples both models generated for."""
    tuned = per_example([1.0, 1.1, 0.9, None, 1.2], [10.0, 20, 30, 0, 40], [1.0, 1.0, 0.0, 1.0, None])
    base = per_example([2.0, 2.2, 1.7, None, 2.1], [10.0, 20, 30, 0, 40], [0.0, 1.0, 0.0, 0.0, None])
    intervals, missing = bootstrap_intervals({"tuned": tuned, "base": base}, confidence=0.95, seed=0)
    assert not missing
    assert intervals["eval_loss"].examples == 4 and intervals["exact_match"].examples == 4
    every_drop = [2.0 - 1.0, 2.2 - 1.1, 1.7 - 0.9, 2.1 - 1.2]
    assert min(every_drop) <= intervals["eval_loss"].low <= intervals["eval_loss"].high <= max(every_drop)
    tokens = [10, 20, 30, 40]
    tuned_loss = sum(x * n for x, n in zip([1.0, 1.1, 0.9, 1.2], tokens, strict=True)) / 100
    base_loss = sum(x * n for x, n in zip([2.0, 2.2, 1.7, 2.1], tokens, strict=True)) / 100
    ppl_gain = math.exp(base_loss) - math.exp(tuned_loss)
    assert intervals["perplexity"].low < ppl_gain < intervals["perplexity"].high
    assert (
        intervals["perplexity"].low > intervals["eval_loss"].high
    )  # exp(2) - exp(1) is ~4.7, a loss drop ~1


def test_one_paired_example_gives_no_interval_and_says_why():
    tuned = per_example([1.0, None], [5.0, 0.0], [1.0, None])
    base = per_example([2.0, None], [5.0, 0.0], [0.0, None])
    intervals, missing = bootstrap_intervals({"tuned": tuned, "base": base}, confidence=0.95, seed=0)
    assert not intervals
    assert "only 1 eval example has eval_loss for both models" in missing["eval_loss"]
    assert "eval_max_samples" in missing["eval_loss"] and "data_eval_fraction" in missing["eval_loss"]


def test_lm_eval_metrics_use_their_standard_errors():
    results = {"arc_easy": {"alias": "arc_easy", "acc,none": 0.6, "acc_stderr,none": 0.02, "f1,none": 0.5,
                            "f1_stderr,none": "N/A"}}  # fmt: skip
    assert flatten_stderrs(results) == {"lm_eval_arc_easy_acc": 0.02}
    examples = task_examples(
        {"results": results, "n-samples": {"arc_easy": {"original": 2376, "effective": 100}}}
    )
    assert examples["lm_eval_arc_easy_acc"] == 100
    tuned = LmEvalScores(
        {"lm_eval_arc_easy_acc": 0.6, "lm_eval_arc_easy_f1": 0.5}, {"lm_eval_arc_easy_acc": 0.02}, examples
    )
    base = LmEvalScores(
        {"lm_eval_arc_easy_acc": 0.5, "lm_eval_arc_easy_f1": 0.4}, {"lm_eval_arc_easy_acc": 0.02}, examples
    )
    intervals, missing = lm_eval_intervals(tuned, base, 0.95)
    assert intervals["lm_eval_arc_easy_acc"].low == pytest.approx(0.1 - 1.959964 * math.hypot(0.02, 0.02))
    assert intervals["lm_eval_arc_easy_acc"].examples == 100
    assert "no standard error for lm_eval_arc_easy_f1" in missing["lm_eval_arc_easy_f1"]
    assert "eval_gate_metric" in missing["lm_eval_arc_easy_f1"]
