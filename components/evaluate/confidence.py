"""How sure the improvement of tuned over base is: a confidence interval from paired per-example scores.

Base and tuned are scored on the same eval examples, so the examples are paired: a paired bootstrap resamples
examples (with replacement) and recomputes both models' summary metric on each resample, which keeps the
correlation between the two models' scores on one example (most of the noise cancels) and needs no assumption
about the scores' distribution. The interval is the percentile interval of `RESAMPLES` resampled improvements
(Efron & Tibshirani, "An Introduction to the Bootstrap", ch. 13: about 1,000-2,000 resamples for a percentile
interval). Seeded: the same scores and seed give the same interval.

Metrics without per-example scores (lm-eval tasks report only an aggregate and its standard error) get a normal
approximation instead. Plain Python: no torch, no numpy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

RESAMPLES = 2000
MIN_EXAMPLES = 2  # one example has no spread to measure: every resample would be that example


@dataclass(frozen=True)
class Interval:
    """A confidence interval on the improvement of tuned over base (positive = better, in the metric's units)."""

    low: float
    high: float
    confidence: float  # e.g. 0.95
    examples: int  # paired examples behind it
    method: str  # how it was computed, for the report

    @property
    def percent(self) -> str:
        return f"{self.confidence * 100:g}%"

    def text(self) -> str:
        return f"{self.percent} CI [{self.low:.4g}, {self.high:.4g}]"


def _require_level(confidence: float) -> None:
    """The settings checked eval_confidence already (eval_settings.py): another level here is a bug."""
    if not 0 < confidence < 1:
        raise ValueError(f"a confidence level lies between 0 and 1 (got {confidence!r})")


def paired_bootstrap(
    tuned: Sequence[float],
    base: Sequence[float],
    weights: Sequence[float],
    improvement: Callable[[float, float], float],
    *,
    confidence: float,
    seed: int,
    resamples: int = RESAMPLES,
) -> Interval:
    """Percentile interval of `improvement(tuned_mean, base_mean)` over resamples of the paired examples.

    `tuned[i]`, `base[i]`: the two models' scores on example i; `weights[i]`: how much example i counts in the
    summary metric (its response tokens for a token-weighted loss, 1 for a per-example mean). Each resample
    draws len(tuned) examples with replacement and takes both models' weighted means over the same draw.
    """
    if not len(tuned) == len(base) == len(weights):
        raise ValueError(f"paired scores differ in length: {len(tuned)}, {len(base)}, {len(weights)}")
    # Weighted sums of a resample as sums of precomputed products: the loop runs resamples × count times.
    tuned_products = [t * w for t, w in zip(tuned, weights, strict=True)]
    base_products = [b * w for b, w in zip(base, weights, strict=True)]

    def resampled(picks: list[int]) -> float:
        total = sum(map(weights.__getitem__, picks))
        return improvement(
            sum(map(tuned_products.__getitem__, picks)) / total,
            sum(map(base_products.__getitem__, picks)) / total,
        )

    return paired_bootstrap_of(len(tuned), resampled, confidence=confidence, seed=seed, resamples=resamples)


def paired_bootstrap_of(
    count: int,
    improvement: Callable[[list[int]], float],
    *,
    confidence: float,
    seed: int,
    resamples: int = RESAMPLES,
) -> Interval:
    """Percentile interval of `improvement(picks)` over resamples of `count` paired examples, for a summary metric
    that is not a mean of per-example scores (macro-F1): `picks` are the resample's example indices."""
    _require_level(confidence)
    if count < MIN_EXAMPLES:
        raise ValueError(f"a bootstrap needs at least {MIN_EXAMPLES} paired examples (got {count})")
    rng = random.Random(seed)
    everything = range(count)
    improvements = sorted(improvement(rng.choices(everything, k=count)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low = improvements[max(0, math.floor(tail * resamples))]
    high = improvements[min(resamples - 1, math.ceil((1 - tail) * resamples) - 1)]
    return Interval(low, high, confidence, count, f"paired bootstrap, {resamples} resamples")


def normal_interval(
    improvement: float, tuned_stderr: float, base_stderr: float, *, confidence: float, examples: int
) -> Interval:
    """improvement ± z·sqrt(se_tuned² + se_base²): treats the two models' errors as independent, which for
    scores on the same examples (positively correlated) gives a wider interval than the truth — conservative."""
    _require_level(confidence)
    z = NormalDist().inv_cdf((1 + confidence) / 2)
    half = z * math.hypot(tuned_stderr, base_stderr)
    return Interval(
        improvement - half,
        improvement + half,
        confidence,
        examples,
        "normal approximation from lm-eval's standard errors",
    )
