"""report.html: stable sections, self-contained, escapes site data, renders absent sections."""

from html.parser import HTMLParser

import numpy as np
import pytest

from fedtab import LocalFederation, Site, run_election, run_training
from fedtab.data import classification_table, split_rows
from fedtab.federation import run_baselines
from fedtab.report import SECTIONS, write_report

HOSTILE = '<script>alert("x")</script>'


class Page(HTMLParser):
    """Sections (id -> h2 text), tags seen, every attribute value, text per section."""

    def __init__(self):
        super().__init__()
        self.sections, self.tags, self.attrs, self.text = {}, [], [], {}
        self._section = self._in_h2 = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag == "section":
            self._section = dict(attrs).get("id")
            self.sections[self._section] = ""
            self.text[self._section] = ""
        if tag == "h2":
            self._in_h2 = True

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._section is None:
            return
        if self._in_h2:
            self.sections[self._section] += data
        self.text[self._section] += data


def _parse(path):
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


@pytest.fixture(scope="module")
def result():
    """A real (small) run: election, training, baselines — with a hostile column and site name."""
    table = classification_table(500, 8, 4, 2, 0, seed=5, class_sep=1.0)
    table = table.rename(columns={"f1": HOSTILE})
    parts = split_rows(table, [0.5, 0.3, 0.2], stratify="target", seed=0)
    parts[2] = parts[2].drop(columns=["f2"])
    fed = LocalFederation([Site(n, p, "target") for n, p in zip(["north", "south", "<b>east</b>"], parts)])
    el = run_election(fed, 0.5).result
    tr = run_training(fed, rounds=3)
    base = run_baselines(fed, tr)
    return {
        "job": {"title": "Test job"},
        "sites": {n: {"columns": [c for c in fed.site(n).feature_names], "n_train": len(fed.site(n).rows("train")),
                      "n_test": len(fed.site(n).rows("test"))} for n in fed.sites},
        "imputation": {"validation": {"overall": 0.8, "per_column": {HOSTILE: 0.7, "f0": 0.9},
                                      "per_column_mean_fill": {HOSTILE: 1.0, "f0": 0.85}}},
        "election": {"features": el.explain().to_dict("records"), "freedom_degree": 0.5, "stats": el.stats},
        "tuning": {"summary": {"method": "grid", "freedom_degree": 0.5, "kept": 6, "score": 0.8,
                               "curve": [{"freedom_degree": 0.0, "score": 0.7, "kept": 4},
                                         {"freedom_degree": 0.5, "score": 0.8, "kept": 6}]}},
        "training": {"model": tr.model, "classes": tr.classes, "features": tr.features, "metrics": tr.metrics},
        "baselines": base,
        "steps": [{"step": "election", "seconds": 0.5, "bytes_down": 100, "bytes_up": 2000},
                  {"step": "training", "seconds": 1.5, "bytes_down": 5000, "bytes_up": 5000}],
    }


def test_report_has_every_section_and_is_self_contained(result, tmp_path):
    path = write_report(result, tmp_path / "out" / "report.html")
    page = _parse(path)
    assert page.sections == SECTIONS
    # no external request: no script, no stylesheet link, every src is an inline PNG, links stay in the page
    assert "script" not in page.tags and "link" not in page.tags
    srcs = [v for tag, k, v in page.attrs if k == "src"]
    assert len(srcs) == 2 and all(v.startswith("data:image/png;base64,") for v in srcs)
    assert all(v.startswith("#") for tag, k, v in page.attrs if k == "href")
    raw = path.read_text(encoding="utf-8")
    assert "http://" not in raw and "https://" not in raw and "url(" not in raw
    # contents: metrics with the baselines in the same table, per site
    metrics = page.text["metrics"]
    for needle in ("AUROC", "PR-AUC", "Brier", "Federated (logistic)", "Local-only", "Majority class", "north"):
        assert needle in metrics
    assert f"{result['training']['metrics']['pooled']['auroc']:.3f}" in metrics
    assert "consensus" in page.text["election"] or "vote at rank" in page.text["election"]
    assert "+30 %" in page.text["imputation"] and "-6 %" in page.text["imputation"]
    assert "total" in page.text["steps"] and "2.00" in page.text["steps"]


def test_hostile_names_are_text_not_markup(result, tmp_path):
    page = _parse(write_report(result, tmp_path / "report.html"))
    assert "script" not in page.tags and "b" not in page.tags  # neither the column nor the site became markup
    assert HOSTILE in page.text["sites"] and HOSTILE in page.text["election"]
    assert HOSTILE in page.text["imputation"]
    assert "<b>east</b>" in page.text["metrics"] and "<b>east</b>" in page.text["baselines"]


def test_absent_sections_render_gracefully(tmp_path):
    page = _parse(write_report({}, tmp_path / "empty.html"))
    assert page.sections == SECTIONS
    assert "not run" in page.text["imputation"] and "No model was trained" in page.text["metrics"]
    assert "img" not in page.tags
    partial = {"training": {"model": "gnb", "pooled": {"accuracy": 0.9, "n": 10}, "per_site": {}}, "imputation": None,
               "tuning": {"freedom_degree": 0.5}, "steps": {"election": 1.0}}
    page = _parse(write_report(partial, tmp_path / "partial.html"))
    assert "0.900" in page.text["metrics"] and "No baselines" in page.text["baselines"]
    assert "not tuned" in page.text["tuning"] and "election" in page.text["steps"]
