"""Text scores for generations and the quality gate. Plain Python: no torch, unit-testable on its own."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from kfp_finetune.components._shared.contract import lower_is_better
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.evaluate.confidence import Interval

# The metric names: _shared/eval_settings.py; which are better lower (losses, perplexities, lm-eval's
# bits_per_byte): contract.lower_is_better.


def normalize(text: str) -> str:
    """Whitespace-insensitive form used for matching: surrounding space dropped, inner runs collapsed."""
    return " ".join(text.split())


def words(text: str) -> list[str]:
    """Lower-cased word tokens (punctuation split off), the unit of F1 and ROUGE-L."""
    return re.findall(r"\w+|[^\w\s]", text.lower())


def exact_match(prediction: str, reference: str) -> float:
    return float(normalize(prediction) == normalize(reference))


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD-style bag-of-words F1 between prediction and reference (1.0 when both are empty)."""
    predicted, expected = words(prediction), words(reference)
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure: longest common word subsequence, so word order counts (unlike token F1)."""
    predicted, expected = words(prediction), words(reference)
    if not predicted or not expected:
        return float(predicted == expected)
    previous = [0] * (len(expected) + 1)
    for word in predicted:
        current = [0]
        for j, other in enumerate(expected):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(predicted), lcs / len(expected)
    return 2 * precision * recall / (precision + recall)


def score_generation(prediction: str, reference: str) -> dict[str, float]:
    return {
        "exact_match": exact_match(prediction, reference),
        "token_f1": token_f1(prediction, reference),
        "rouge_l": rouge_l(prediction, reference),
    }


def macro_f1(predicted: list[int], actual: list[int]) -> float:
    """The mean over classes of each class's F1 (2·TP / (2·TP + FP + FN)), every class that is predicted or true
    counted once whatever its size (scikit-learn's f1_score(average="macro") over the classes present)."""
    hits, wrong = (
        Counter(),
        Counter(),
    )  # per class: 2·TP, and FP + FN (one pass: the bootstrap calls this often)
    for p, a in zip(predicted, actual, strict=True):
        if p == a:
            hits[p] += 2
        else:
            wrong[p] += 1
            wrong[a] += 1
    classes = hits.keys() | wrong.keys()
    if not classes:
        return float("nan")
    return sum(hits[c] / (hits[c] + wrong[c]) for c in classes) / len(classes)


def improvement(metric: str, tuned: float, base: float) -> float:
    """How much better tuned is than base, in the metric's units (positive = better, whatever the direction)."""
    return base - tuned if lower_is_better(metric) else tuned - base


@dataclass
class GateResult:
    passed: bool
    metric: str
    improvement: float | None  # None without a base model
    interval: Interval | None = None  # the improvement's confidence interval; None without one
    reasons: list[str] = field(default_factory=list)  # "PASS: …" / "FAIL: …" / "SKIP: …", one per check

    @property
    def summary(self) -> str:
        """The verdict in one line: why it failed (every failed check), or what it passed on."""
        failed = [r.removeprefix("FAIL: ") for r in self.reasons if r.startswith("FAIL: ")]
        if failed:
            return "failed: " + "; ".join(failed)
        return "passed: " + "; ".join(r.split(": ", 1)[1] for r in self.reasons)


def quality_gate(
    tuned: dict[str, float],
    base: dict[str, float] | None,
    gate_metric: str,
    min_improvement: float,
    thresholds: dict[str, float],
    interval: Interval | None = None,
    no_interval_reason: str = "",
) -> GateResult:
    """Pass when tuned beats base on `gate_metric` by more than the eval set's noise and by at least
    `min_improvement`, and meets every threshold (a minimum, or a maximum for loss-like metrics).

    More than the noise: the improvement is above 0 and so is the lower bound of its confidence `interval`
    (confidence.py); without an interval (`no_interval_reason` says why) the gate fails. Without a base only
    thresholds apply. A NaN or infinite value of a gated metric (a diverged model's eval_loss) never passes, with
    or without a base."""
    available = ", ".join(sorted(tuned))
    if gate_metric not in tuned:
        raise ConfigError(
            f"eval_gate_metric {gate_metric!r} is not a computed metric; choose one of: {available}"
        )
    unknown = [name for name in thresholds if name not in tuned]
    if unknown:
        raise ConfigError(f"thresholds name unknown metric(s) {', '.join(unknown)}; known: {available}")
    result = GateResult(passed=True, metric=gate_metric, improvement=None, interval=interval)

    def check(ok: bool, text: str) -> None:
        result.passed &= ok
        result.reasons.append(f"{'PASS' if ok else 'FAIL'}: {text}")

    for name in dict.fromkeys([gate_metric, *sorted(thresholds)]):
        if not math.isfinite(tuned[name]):  # NaN compares False both ways: refuse it explicitly
            check(
                False,
                f"{name} of the tuned model is {tuned[name]}, not a finite number (its training or evaluation "
                "diverged): the gate never passes on it",
            )
    if base is not None and gate_metric in base and not math.isfinite(base[gate_metric]):
        check(
            False,
            f"{gate_metric} of the base model is {base[gate_metric]}: the improvement cannot be measured",
        )
    if base is not None and gate_metric in base:
        result.improvement = improvement(gate_metric, tuned[gate_metric], base[gate_metric])
        check(*evidence(result, tuned[gate_metric], base[gate_metric], no_interval_reason))
        if min_improvement > 0:
            check(
                result.improvement >= min_improvement,
                f"improvement {result.improvement:+.4g}, required >= {min_improvement:g} (eval_min_improvement)",
            )
    else:
        result.reasons.append(
            f"SKIP: no base model metrics, so the improvement in {gate_metric} is not checked"
        )
    for name, bound in sorted(thresholds.items()):
        value = tuned[name]
        relation = "<=" if lower_is_better(name) else ">="
        check(
            value <= bound if lower_is_better(name) else value >= bound,
            f"{name} tuned {value:.4g}, required {relation} {float(bound):g}",
        )
    return result


def evidence(result: GateResult, tuned: float, base: float, no_interval_reason: str) -> tuple[bool, str]:
    """Whether the improvement is above 0 and so is its interval's lower bound (more than the eval set's
    noise), and the line that says so."""
    gain, interval = result.improvement, result.interval
    direction = "lower" if lower_is_better(result.metric) else "higher"
    values = f"tuned {tuned:.4g} vs base {base:.4g}, {direction} is better"
    spread = f"; {interval.text()} ({interval.examples} examples)" if interval else ""
    if not math.isfinite(gain):
        return False, f"{result.metric} improvement is {gain} ({values}): not a finite number"
    if gain <= 0:
        return False, f"{result.metric} did not improve: {gain:+.4g} ({values}){spread}"
    if interval is None:
        return False, f"{result.metric} improved by {gain:.4g} ({values}), but {no_interval_reason}"
    if interval.low <= 0:
        where = "includes 0" if interval.high >= 0 else "is below 0"
        return False, (
            f"{result.metric} improved by {gain:.4g} ({values}), {interval.text()} {where} — within the eval "
            f"set's noise ({interval.examples} examples)"
        )
    return True, (
        f"{result.metric} improved by {gain:.4g} ({values}), {interval.text()} above 0 — more than the eval "
        f"set's noise ({interval.examples} examples)"
    )
