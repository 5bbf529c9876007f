"""The evaluation report: verdict, base vs tuned table with deltas, training loss curve, sample generations."""

from __future__ import annotations

import json

from kfp_finetune.components._shared import html_report
from kfp_finetune.components._shared.html_report import escape
from kfp_finetune.components._shared.metrics_file import StepMetrics
from kfp_finetune.components.evaluate import scoring
from kfp_finetune.components.evaluate.confidence import Interval

INTERVAL_NOTE = (
    "Improvement: how much better tuned is than base (positive = better, whichever direction the metric goes). "
    "Its confidence interval comes from a paired bootstrap over the eval examples (lm-eval metrics: a normal "
    "approximation from lm-eval's standard errors); an interval above 0 means the gain is more than the eval "
    "set's noise, which the quality gate requires of the gate metric."
)


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def comparison_rows(
    tuned: dict[str, float], base: dict[str, float] | None, intervals: dict[str, Interval]
) -> list[list[str]]:
    """Rows of metric | base | tuned | delta | the improvement's interval; the delta is green when tuned is
    better, red when worse; the interval is green when it lies above 0 (more than the eval set's noise)."""
    rows = []
    for name, value in tuned.items():
        base_value = (base or {}).get(name)
        delta = "—"
        if base_value is not None:
            gain = scoring.improvement(name, value, base_value)
            css = "good" if gain > 0 else "bad" if gain < 0 else ""
            delta = f'<span class="{css}">{value - base_value:+.4g}</span>'
        direction = "lower is better" if scoring.lower_is_better(name) else "higher is better"
        interval = intervals.get(name)
        spread = "—"
        if interval is not None:
            css = "good" if interval.low > 0 else ""
            spread = f'<span class="{css}">[{interval.low:+.4g}, {interval.high:+.4g}]</span>'
        rows.append(
            [
                f"{escape(name)} <small>({direction})</small>",
                _number(base_value),
                _number(value),
                delta,
                spread,
            ]
        )
    return rows


def shown(text: str, limit: int = 300) -> str:
    """Text for a table cell: line breaks and tabs made visible (an untrained model often emits only those),
    cut at `limit` characters."""
    visible = json.dumps(text, ensure_ascii=False)[1:-1]
    return escape(visible if len(visible) <= limit else visible[:limit] + " …")


def _sample_rows(samples: list[dict], with_base: bool) -> list[list[str]]:
    def output(record: dict, label: str) -> str:
        text = record.get(label)
        if text is None:
            return "—"
        mark = " ✓" if record.get(f"{label}_exact_match") else ""
        return f"<pre>{shown(text)}</pre>{mark}"

    rows = []
    for record in samples:
        row = [
            str(record["row"]),
            f"<pre>{shown(record['prompt'])}</pre>",
            f"<pre>{shown(record['reference'])}</pre>",
        ]
        if with_base:
            row.append(output(record, "base"))
        row.append(output(record, "tuned"))
        rows.append(row)
    return rows


def render_report(
    tuned: dict[str, float],
    base: dict[str, float] | None,
    gate: scoring.GateResult,
    intervals: dict[str, Interval],
    samples: list[dict],
    steps: list[StepMetrics],
    context: dict,
) -> str:
    verdict = "PASSED" if gate.passed else "FAILED"
    level = next(iter(intervals.values())).percent if intervals else ""
    checks = ""
    if len(gate.reasons) > 1:  # each check on its own line: the summary names only the failed ones
        checks = "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in gate.reasons) + "</ul>"
    sections = [
        html_report.section(
            "Quality gate",
            f'<p class="{"good" if gate.passed else "bad"}"><b>{verdict}</b> '
            f"(gate metric {escape(gate.metric)})</p><p>{escape(gate.summary)}</p>" + checks,
        ),
        html_report.section(
            "Base vs tuned",
            html_report.table(
                [
                    "metric",
                    "base",
                    "tuned",
                    "delta (tuned − base)",
                    f"improvement, {level} CI" if level else "improvement CI",
                ],
                comparison_rows(tuned, base, intervals),
                raw_cells=True,
            )
            + f"<p><small>{escape(INTERVAL_NOTE)}</small></p>",
        ),
    ]
    losses = [(s.step, s.loss) for s in steps if s.loss is not None]
    if losses:
        sections.append(
            html_report.section(
                "Training loss", html_report.line_chart("training loss", {"loss": losses}, "step")
            )
        )
    if samples:
        header = ["row", "prompt", "reference", *(["base"] if base is not None else []), "tuned"]
        sections.append(
            html_report.section(
                f"Samples (first {len(samples)}; ✓ = exact match)",
                html_report.table(header, _sample_rows(samples, base is not None), raw_cells=True),
            )
        )
    sections.append(
        html_report.section("Run", html_report.table(["setting", "value"], list(context.items())))
    )
    subtitle = f"{context.get('tuned_model', '')} on {context.get('eval_data', '')} — {verdict}"
    return html_report.page("Evaluation: tuned vs base", subtitle, sections)
