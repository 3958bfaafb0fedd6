"""The report's feature-importance section (GBDT gain, pooled and per site), from result dicts."""

from __future__ import annotations

import re

import pytest

from fedtab.report.html import SECTIONS, render_report
from fedtab.report.importance import gain_shares, importance_figure, importance_section

IMP = {"kind": "total_gain", "pooled": {"age": 30.0, "<script>x</script>": 10.0, "bmi": 60.0},
       "pooled_mean": {"age": 15.0, "<script>x</script>": 10.0, "bmi": 20.0},
       "per_site": {"north": {"age": 20.0, "<script>x</script>": -2.0, "bmi": 22.0},
                    "south": {"age": 8.0, "<script>x</script>": 0.0, "bmi": 40.0}},
       "suppressed": {"north": 0, "south": 3}, "per_site_skipped": None, "not_released": ["east"]}


def _section(html: str) -> str:
    return re.search(r'<section id="importance">(.*?)</section>', html, re.S).group(1)


def test_the_section_shows_a_bar_plot_and_every_features_gains_largest_first():
    html = _section(render_report({"training": {"model": "gbdt", "importance": IMP}}))
    assert SECTIONS["importance"].startswith("Feature importance by gain")
    assert '<img src="data:image/png;base64,' in html
    rows = re.findall(r"<tr><td>(.*?)</td>", html)
    assert rows == ["bmi", "age", "&lt;script&gt;x&lt;/script&gt;"]  # by pooled total gain; names escaped
    assert "<script>" not in html
    assert "Site north" in html and "Site south" in html and "60.0 %" in html
    assert "south: 3" in html and "east" in html  # suppressed splits and sites that released nothing


def test_a_secure_run_says_why_there_are_no_per_site_gains():
    imp = {**IMP, "per_site": {}, "suppressed": {}, "not_released": [],
           "per_site_skipped": "secure aggregation hides per-site statistics from the server"}
    html = importance_section({"training": {"importance": imp}})
    assert "No per-site gains: secure aggregation" in html and "Site " not in html


@pytest.mark.parametrize("result", [{}, {"training": {"model": "logistic"}}, {"training": {"importance": {}}}])
def test_other_models_get_one_line(result):
    html = importance_section(result)
    assert html.startswith('<p class="absent">') and "<img" not in html


def test_shares_of_the_total_gain():
    assert gain_shares({"a": 3.0, "b": 1.0}, ["a", "b", "c"]) == [0.75, 0.25, 0.0]
    assert gain_shares({"a": -1.0}, ["a"]) == [0.0]  # no positive total: no shares
    fig = importance_figure(IMP, top=2)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["age", "bmi"]  # the top 2, largest on top
    assert len(fig.axes[0].patches) == 2 * 3  # pooled + two sites per feature
