"""Both models' scores on the same eval examples, paired: per-example scores, the summary metrics computed from
them, and the confidence interval of each metric's improvement (confidence.py) — computed as its summary is."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from kfp_finetune.components._shared.eval_examples import Example, ModelScores
from kfp_finetune.components._shared.eval_settings import GENERATION_METRICS
from kfp_finetune.components.evaluate import scoring
from kfp_finetune.components.evaluate.confidence import (
    MIN_EXAMPLES,
    Interval,
    normal_interval,
    paired_bootstrap,
    paired_bootstrap_of,
)
from kfp_finetune.components.evaluate.lm_eval_tasks import LmEvalScores


def perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


def example_scores(scores: ModelScores, examples: list[Example]) -> dict[str, list[float | None]]:
    """Per example: its mean loss on the response tokens, its generation scores (None where it has none) and
    its response tokens under "tokens" (its weight in the token-weighted eval_loss). A classifier's: its loss on
    the class, "accuracy" (1 when the predicted class is right), "predicted" and "actual" (the class ids)."""
    per_example: dict[str, list[float | None]] = {"eval_loss": list(scores.example_losses)}
    per_example["tokens"] = [float(n) for n in scores.example_tokens]
    if scores.predictions is not None:
        actual = [e.class_id for e in examples]
        per_example["accuracy"] = [float(p == a) for p, a in zip(scores.predictions, actual, strict=True)]
        per_example["predicted"], per_example["actual"] = list(scores.predictions), actual
        return per_example
    for name in GENERATION_METRICS:
        per_example[name] = [
            None if g is None else scoring.score_generation(g, e.reference)[name]
            for g, e in zip(scores.generations, examples, strict=True)
        ]
    return per_example


def summarize(scores: ModelScores, per_example: dict[str, list[float | None]]) -> dict[str, float]:
    """eval_loss and perplexity (token-weighted over the response tokens) + mean generation scores; a classifier's
    eval_loss (the mean cross-entropy of the classes), accuracy and macro_f1."""
    if "accuracy" in per_example:
        accuracy = per_example["accuracy"]
        return {
            "eval_loss": scores.eval_loss,
            "accuracy": sum(accuracy) / len(accuracy),
            "macro_f1": scoring.macro_f1(per_example["predicted"], per_example["actual"]),
        }
    values = {"eval_loss": scores.eval_loss, "perplexity": perplexity(scores.eval_loss)}
    for name in GENERATION_METRICS:
        scored = [v for v in per_example[name] if v is not None]
        if scored:
            values[name] = sum(scored) / len(scored)
    return values


def bootstrap_intervals(
    per_example: dict[str, dict[str, list[float | None]]], *, confidence: float, seed: int
) -> tuple[dict[str, Interval], dict[str, str]]:
    """The paired bootstrap interval of the improvement for each metric with per-example scores, computed as
    its summary is: eval_loss weighted by response tokens, perplexity as exp of that weighted mean loss,
    generation scores as plain means. Returns (intervals, why not) by metric."""
    tuned, base = per_example["tuned"], per_example["base"]
    intervals, missing = {}, {}
    classifier = "accuracy" in tuned
    for metric, source, transform in (
        ("eval_loss", "eval_loss", None),
        *((("accuracy", "accuracy", None),) if classifier else (("perplexity", "eval_loss", perplexity),)),
        *((name, name, None) for name in GENERATION_METRICS if name in tuned),
    ):
        weighted = source == "eval_loss"
        rows = [
            i
            for i, (t, b) in enumerate(zip(tuned[source], base[source], strict=True))
            if t is not None and b is not None and (not weighted or tuned["tokens"][i])
        ]
        if not rows:
            continue
        if len(rows) < MIN_EXAMPLES:
            missing[metric] = (
                f"only {len(rows)} eval example has {metric} for both models: at least "
                f"{MIN_EXAMPLES} are needed to measure the eval set's noise (raise eval_max_samples "
                "or data_eval_fraction)"
            )
            continue
        intervals[metric] = paired_bootstrap(
            [tuned[source][i] for i in rows],
            [base[source][i] for i in rows],
            [tuned["tokens"][i] if weighted else 1.0 for i in rows],
            functools.partial(_mean_improvement, metric, transform),
            confidence=confidence,
            seed=seed,
        )
    if classifier and "accuracy" in missing:  # too few examples: the same reason
        missing["macro_f1"] = missing["accuracy"].replace("accuracy", "macro_f1")
    elif classifier:
        intervals["macro_f1"] = paired_bootstrap_of(
            len(tuned["actual"]),
            functools.partial(_macro_f1_improvement, tuned["predicted"], base["predicted"], tuned["actual"]),
            confidence=confidence,
            seed=seed,
        )
    return intervals, missing


def _macro_f1_improvement(tuned: list, base: list, actual: list, picks: list[int]) -> float:
    drawn = [actual[i] for i in picks]
    return scoring.macro_f1([tuned[i] for i in picks], drawn) - scoring.macro_f1(
        [base[i] for i in picks], drawn
    )


def _mean_improvement(
    metric: str, transform: Callable[[float], float] | None, tuned_mean: float, base_mean: float
) -> float:
    if transform is not None:
        tuned_mean, base_mean = transform(tuned_mean), transform(base_mean)
    return scoring.improvement(metric, tuned_mean, base_mean)


def lm_eval_intervals(
    tuned: LmEvalScores, base: LmEvalScores, level: float
) -> tuple[dict[str, Interval], dict[str, str]]:
    """lm-eval reports per-task aggregates, not per-example scores: a normal interval from its standard errors
    (confidence.normal_interval). Returns (intervals, why not) by metric."""
    intervals, missing = {}, {}
    for metric, value in tuned.values.items():
        if metric not in base.values:
            continue
        errors = (tuned.stderrs.get(metric), base.stderrs.get(metric))
        if None in errors:
            missing[metric] = (
                f"lm-eval reported no standard error for {metric}, so the eval set's noise is unknown: gate on "
                "eval_loss or a generation metric (eval_gate_metric), or on a task metric lm-eval gives a "
                "standard error for"
            )
            continue
        intervals[metric] = normal_interval(
            scoring.improvement(metric, value, base.values[metric]),
            *errors,
            confidence=level,
            examples=tuned.examples.get(metric, 0),
        )
    return intervals, missing
