"""Self-contained HTML for KFP's HTML artifact viewer: inline CSS and SVG, no scripts, no external resources."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1f2328;max-width:1100px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px} .sub{color:#57606a;margin-bottom:16px}
table{border-collapse:collapse;font-size:13px;margin:4px 0 12px} td,th{border:1px solid #d0d7de;padding:4px 8px;
text-align:left;vertical-align:top} th{background:#f6f8fa} .num{text-align:right;font-variant-numeric:tabular-nums}
.charts{display:flex;flex-wrap:wrap;gap:16px} .good{color:#1a7f37} .bad{color:#cf222e} code{font-size:12px}
pre{white-space:pre-wrap;margin:0;font-size:12px}
"""
_COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700")


def escape(value: object) -> str:
    return html.escape(str(value))


def page(title: str, subtitle: str, sections: Iterable[str]) -> str:
    body = "\n".join(sections)
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>"
        f'<div class="sub">{escape(subtitle)}</div>{body}</body></html>\n'
    )


def section(heading: str, content: str) -> str:
    return f"<h2>{escape(heading)}</h2>{content}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], raw_cells: bool = False) -> str:
    """A table; numbers are right-aligned. `raw_cells` passes cells through as HTML (caller escapes)."""

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f'<td class="num">{value:.6g}</td>'
        if isinstance(value, int) and not isinstance(value, bool):
            return f'<td class="num">{value}</td>'
        return f"<td>{value if raw_cells else escape(value)}</td>"

    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _axis(value: float) -> str:
    """Axis labels: whole numbers for large values (tokens/s), 4 significant digits otherwise."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _span(low: float, high: float, margin: float) -> tuple[float, float]:
    """The axis range: the data's, or around a single value (which would otherwise sit on the axis itself)."""
    return (low, high) if high > low else (low - margin, high + margin)


def line_chart(
    title: str,
    series: dict[str, Sequence[tuple[float, float]]],
    x_label: str,
    width: int = 520,
    height: int = 260,
) -> str:
    """An SVG line chart of one or more (x, y) series, with min/max axis labels."""
    points = [(x, y) for values in series.values() for x, y in values if math.isfinite(y)]
    if not points:
        return f"<p>{escape(title)}: no data</p>"
    left, right, top, bottom = 56, 12, 24, 34
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = _span(min(xs), max(xs), 1.0)
    y0, y1 = _span(min(ys), max(ys), abs(ys[0]) * 0.1 or 1.0)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(title)}"><rect width="100%" height="100%" fill="#fff" stroke="#d0d7de"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="600">{escape(title)}</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#8c959f"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#8c959f"/>',
        f'<text x="{left - 4}" y="{top + 4}" font-size="11" text-anchor="end">{_axis(y1)}</text>',
        f'<text x="{left - 4}" y="{height - bottom}" font-size="11" text-anchor="end">{_axis(y0)}</text>',
        f'<text x="{left}" y="{height - bottom + 14}" font-size="11">{x0:g}</text>',
        f'<text x="{width - right}" y="{height - bottom + 14}" font-size="11" text-anchor="end">{x1:g}</text>',
        f'<text x="{(left + width - right) / 2}" y="{height - 4}" font-size="11" text-anchor="middle">'
        f"{escape(x_label)}</text>",
    ]
    for index, (name, values) in enumerate(series.items()):
        color = _COLORS[index % len(_COLORS)]
        finite = [(x, y) for x, y in values if math.isfinite(y)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in finite)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{coords}"/>')
        if len(finite) == 1:  # a line through one point draws nothing
            parts.append(
                f'<circle cx="{sx(finite[0][0]):.1f}" cy="{sy(finite[0][1]):.1f}" r="3.5" fill="{color}"/>'
            )
        if len(series) > 1:
            parts.append(
                f'<text x="{width - right - 4}" y="{top + 14 * (index + 1)}" font-size="11" text-anchor="end" '
                f'fill="{color}">{escape(name)}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)
