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
    fed = LocalFederation([Site(n, p, "target", selector="anova") for n, p in zip(["north", "south", "<b>east</b>"], parts)])
    el_out = run_election(fed, 0.5)
    el = el_out.result
    tr = run_training(fed, rounds=3)
    base = run_baselines(fed, tr)
    ballots = {b.site: set(np.asarray(b.feature_names)[b.mask]) for b in el_out.ballots}
    features = [{"name": r["feature"], "selected": bool(r["kept"]), "votes": float(r["vote"]), "rank": int(r["rank"]),
                 "reason": r["reason"], "chosen_by": [s for s, chosen in ballots.items() if r["feature"] in chosen]}
                for r in el.explain().to_dict("records")]
    return {  # the job's result.json layout (docs/job.md)
        "fedtab_version": "0.test", "created": "2026-11-30T10:00:00Z", "engine": "local",
        "job": {"title": "Test job"},
        "sites": [{"name": n, "columns": fed.site(n).feature_names, "rows": len(fed.site(n).table),
                   "rows_train": len(fed.site(n).rows("train")), "rows_test": len(fed.site(n).rows("test")),
                   "rows_without_label": 0} for n in fed.sites],
        "schema": {"columns": list(table.columns[:-1]), "classes": tr.classes},
        "imputation": {"validation_rmse_z": {"overall": 0.8, "per_column": {HOSTILE: 0.7, "f0": 0.9}},
                       "mean_fill_rmse_z": {"per_column": {HOSTILE: 1.0, "f0": 0.85}}, "best_round": 4},
        "election": {"features": features, "freedom_degree": 0.5, "stats": el.stats, "selected": el.selected_names},
        "tuning": {"method": "grid", "freedom_degree": 0.5, "kept": 6, "score": 0.8,
                   "curve": [{"freedom_degree": 0.0, "score": 0.7, "kept": 4, "stage": "grid"},
                             {"freedom_degree": 0.5, "score": 0.8, "kept": 6, "stage": "grid"}]},
        "training": {"model": tr.model, "features": tr.features, "rounds": 3},
        "evaluation": tr.metrics,
        "baselines": base,
        "steps": [{"name": "election", "seconds": 0.5, "bytes_down": 100, "bytes_up": 2000},
                  {"name": "training", "seconds": 1.5, "bytes_down": 5000, "bytes_up": 5000}],
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
    assert f"{result['evaluation']['pooled']['auroc']:.3f}" in metrics
    assert "consensus" in page.text["election"] or "vote at rank" in page.text["election"]
    assert "+30 %" in page.text["imputation"] and "\u22126 %" in page.text["imputation"]
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
    # the Python objects' names: sites as a mapping, ElectionResult.explain rows, imputation validation
    legacy = {"sites": {"a": {"columns": ["x"], "n_train": 8}},
              "election": {"features": [{"feature": "x", "kept": True, "vote": 0.4, "rank": 0, "reason": "consensus",
                                         "held_by": 1, "selected_by": 1}]},
              "imputation": {"validation": {"per_column": {"x": 0.5}, "per_column_mean_fill": {"x": 1.0}}}}
    page = _parse(write_report(legacy, tmp_path / "legacy.html"))
    assert "consensus" in page.text["election"] and "+50 %" in page.text["imputation"] and "8" in page.text["sites"]
