"""The pooled-selector comparison in the result and in report.html (issue 15, item 3)."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest
from typer.testing import CliRunner

from fedtab.cli import app
from fedtab.election import FederatedFeatureElection
from fedtab.election.agreement import DEFAULT_FREEDOM_DEGREES
from fedtab.report import write_report
from tests.builders import classification_parts


class AgreementTable(HTMLParser):
    """Rows (cell texts, row class) of the table after ``<h3 id="pooled-agreement">``, and the
    section that heading sits in."""

    def __init__(self):
        super().__init__()
        self.rows, self.section, self.heading_in = [], None, None
        self._after = self._in_body = False
        self._row = self._cell = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.section = attrs.get("id")
        if tag == "h3" and attrs.get("id") == "pooled-agreement":
            self._after, self.heading_in = True, self.section
        if self._after and tag == "tbody":
            self._in_body = True
        if self._in_body and tag == "tr":
            self._row = ([], attrs.get("class", ""))
        if self._row is not None and tag == "td":
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row[0].append(self._cell)
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        if tag == "tbody" and self._in_body:
            self._in_body = self._after = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def _agreement(path):
    page = AgreementTable()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def tables():
    return classification_parts(600, 16, 4, 0, [0.4, 0.35, 0.25], seed=2, split_seed=0, class_sep=1.2)[1]


def test_simulation_report_lists_the_jaccard_per_freedom_degree(tables, tmp_path):
    fe = FederatedFeatureElection({"name": "anova", "params": {"k": 5}}, freedom_degree=0.3,
                                  pooled_comparison=True).fit(tables, "target")
    data = fe.report_data()
    curve = data["election"]["pooled_agreement"]
    assert [c["freedom_degree"] for c in curve] == sorted({*DEFAULT_FREEDOM_DEGREES, 0.3})
    json.dumps(data)  # the result is plain JSON
    page = _agreement(fe.write_report(tmp_path / "report.html"))
    assert page.heading_in == "election"
    fds = [float(cells[0]) for cells, _ in page.rows]
    assert fds == [c["freedom_degree"] for c in curve]
    np.testing.assert_allclose([float(cells[1]) for cells, _ in page.rows], fe.pooled_agreement_["jaccard"], atol=5e-4)
    assert [int(cells[2]) for cells, _ in page.rows] == list(fe.pooled_agreement_["kept"])
    assert {int(cells[3]) for cells, _ in page.rows} == {int(fe.pooled_support_.sum())}
    # the election's own freedom degree is the highlighted row, and its kept count is the mask's
    (used,) = [cells for cells, cls in page.rows if cls == "kept"]
    assert float(used[0]) == 0.3 and int(used[2]) == int(fe.support_.sum())


def test_no_pooled_section_without_the_comparison_and_hostile_values_are_text(tables, tmp_path):
    fe = FederatedFeatureElection("anova").fit(tables, "target")
    assert "pooled_agreement" not in fe.report_data()["election"]
    assert _agreement(fe.write_report(tmp_path / "plain.html")).rows == []
    evil = '<img src=x onerror="alert(1)">'
    path = write_report({"election": {"freedom_degree": 0.5, "selected": ["a"],
                                      "pooled_agreement": [{"freedom_degree": evil, "jaccard": 0.5, "kept": 1,
                                                            "pooled_kept": 2}, "junk"]}}, tmp_path / "evil.html")
    text = path.read_text(encoding="utf-8")
    assert evil not in text and "&lt;img" in text
    assert len(_agreement(path).rows) == 1


def test_fedtab_elect_pooled_comparison_in_result_and_report(tables, tmp_path):
    files = []
    for i, part in enumerate(tables):
        files.append(tmp_path / f"site{i}.csv")
        part.to_csv(files[-1], index=False)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["elect", *map(str, files), "--target", "target", "-s", "anova", "--no-train",
                                   "--consensus", "stouffer", "--pooled-comparison", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "result.json").read_text())
    assert doc["election"]["consensus"] == "stouffer"
    curve = doc["election"]["pooled_agreement"]
    assert [c["freedom_degree"] for c in curve] == list(DEFAULT_FREEDOM_DEGREES)
    at = {c["freedom_degree"]: c for c in curve}
    assert at[0.5]["kept"] == doc["stats"]["kept"] and 0 <= at[0.5]["jaccard"] <= 1
    assert len(_agreement(out / "report.html").rows) == len(curve)
    bad = CliRunner().invoke(app, ["elect", *map(str, files), "--target", "target", "-s", "anova", "-s", "lasso",
                                   "-s", "anova", "--pooled-comparison", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "one --selector shared by every site" in bad.output
