"""The report's SVG charts (html_report.py)."""

from kfp_finetune.components._shared import html_report


def test_a_one_point_chart_draws_its_point_in_the_middle():
    """A run of one logged step: a polyline through one point draws nothing, so the point is a marker."""
    one = html_report.line_chart("loss", {"loss": [(1, 2.5)]}, "step")
    assert one.count("<circle") == 1
    assert ">0<" in one and ">2<" in one  # the step axis runs 0..2 around step 1
    assert ">2.25<" in one and ">2.75<" in one  # the value axis 10 % either side of 2.5
    assert "<circle" not in html_report.line_chart("loss", {"loss": [(1, 2.5), (2, 2.0)]}, "step")
