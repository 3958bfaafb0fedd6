"""Every site of a run without an AUROC is named with why (issue 30 item 3): a site whose rare class
is too few rows for its test share (a test part of one class), a site without a test part, a
one-class site and a dropped site; the verdict counts against every site of the run ("AUROC at 2 of
4 sites"), in result.json (``sites.<s>.no_auroc``) and report.html. The reasons rest only on what
the evaluation released (each site's confusion matrix, whose row sums are its test part's class
counts): a run whose per-site scores the server never sees (secure sums) names no site."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedtab.job.run import run_job
from fedtab.report.data import run_sites, unscored_sites
from fedtab.report.run_sections import sites as sites_section
from fedtab.report.verdict import verdict


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", fragment)))


def _table(rng: np.random.Generator, n: int, positives: int) -> pd.DataFrame:
    y = np.zeros(n, int)
    y[rng.choice(n, positives, replace=False)] = 1
    f = pd.DataFrame(rng.normal(size=(n, 3)) + y[:, None] * np.array([1.0, -0.5, 0.0]), columns=["a", "b", "c"])
    f["y"] = y
    return f


@pytest.fixture(scope="module")
def four_sites(tmp_path_factory) -> tuple[dict, Path]:
    """s0, s1 scored; va: 14 positives of 150 (a test share of them is below min_rows=10, so its
    test part holds negatives only); swiss: 30 rows, too few for any test part."""
    d = tmp_path_factory.mktemp("unscored")
    rng = np.random.default_rng(0)
    tables = {"s0": _table(rng, 160, 70), "s1": _table(rng, 140, 60), "va": _table(rng, 150, 14),
              "swiss": _table(rng, 30, 15)}
    sites = {}
    for name, t in tables.items():
        t.to_csv(d / f"{name}.csv", index=False)
        sites[name] = {"path": str(d / f"{name}.csv"), "allow_server_row_sets": True}
    job = {"target": "y", "sites": sites, "training": {"model": "logistic", "rounds": 3}, "run": {"out": str(d / "out")}}
    res = run_job(job, engine="local", out=d / "out")
    return res, d / "out"


def test_the_job_records_why_each_unscored_site_has_no_auroc(four_sites):
    res, out = four_sites
    per_site = res["training"]["metrics"]["per_site"]
    assert per_site["va"]["auroc"] is None and per_site["swiss"]["auroc"] is None
    assert sum(per_site["va"]["confusion"][1]) == 0 < sum(per_site["va"]["confusion"][0])  # the released counts
    assert res["sites"]["va"]["n_test"] > 0 and "no_test" not in res["sites"]["va"]
    written = json.loads((out / "result.json").read_text())
    for doc in (res, written):
        va, swiss = doc["sites"]["va"]["no_auroc"], doc["sites"]["swiss"]["no_auroc"]
        assert va.startswith("has no positive (class “1”)") and f"among its {res['sites']['va']['n_test']} test rows" in va
        assert swiss.startswith("has no test part: its 30 rows are too few")
        assert "no_auroc" not in doc["sites"]["s0"] and "no_auroc" not in doc["sites"]["s1"]


def test_the_verdict_counts_every_site_of_the_run_and_names_both(four_sites):
    res, out = four_sites
    page = (out / "report.html").read_text()
    start = page.index('class="headline"')
    said = _text(page[start:page.index("</ul>", start)])
    assert "(2 of 4)" in said and "of 2)" not in said and " of 2 sites" not in said
    assert "AUROC at 2 of 4 sites: va has no positive (class “1”) among its" in said
    assert "swiss has no test part: its 30 rows are too few" in said
    sites_html = sites_section(res)
    assert "No AUROC (why)" in sites_html and _text(sites_html).count("too few") == 2
    assert page.count('class="not-scored"') == 2  # the two rows of the sites table


def _result(**over) -> dict:
    """A plain binary run of three sites: a has an AUROC, b's test part holds class "0" only, c is one-class."""
    cm_a, cm_b, cm_c = [[8, 2], [3, 7]], [[12, 0], [0, 0]], [[15, 0], [0, 0]]
    res = {
        "sites": {"a": {"n_rows": 100, "n_train": 80, "n_test": 20, "columns": ["x"]},
                  "b": {"n_rows": 60, "n_train": 48, "n_test": 12, "columns": ["x"]},
                  "c": {"n_rows": 75, "n_train": 60, "n_test": 15, "columns": ["x"], "one_class": True}},
        "training": {"model": "logistic", "classes": ["0", "1"], "metrics": {
            "pooled": {"auroc": 0.8, "auroc_bounds": [0.78, 0.82], "n": 47},
            "per_site": {"a": {"auroc": 0.8, "confusion": cm_a, "n": 20}, "b": {"auroc": None, "confusion": cm_b, "n": 12},
                         "c": {"auroc": None, "confusion": cm_c, "n": 15}}}},
        "participation": {"steps": [{"step": "training", "sites": ["a", "b", "c"], "dropped": {"d": "timed out"}}],
                          "dropped": {"d": "timed out"}},
    }
    res.update(over)
    return res


def test_each_reason_from_what_the_run_released():
    res = _result()
    assert run_sites(res) == ["a", "b", "c", "d"]
    why = unscored_sites(res)
    assert list(why) == ["b", "c", "d"]
    assert why["b"].startswith("has no positive (class “1”) among its 12 test rows")
    assert why["c"] == "holds one class only"
    assert why["d"] == "was dropped at the training step: timed out"
    said = _text(verdict(res))
    assert "AUROC at 1 of 4 sites: b has no positive" in said and "d was dropped at the training step" in said


def test_a_stored_reason_is_kept_and_a_negative_is_named():
    res = _result()
    res["training"]["metrics"]["per_site"]["b"]["confusion"] = [[0, 0], [5, 7]]
    assert unscored_sites(res)["b"].startswith("has no negative (class “0”) among its 12 test rows")
    res["sites"]["b"]["no_auroc"] = "has no AUROC for a reason the job wrote"
    assert unscored_sites(res)["b"] == "has no AUROC for a reason the job wrote"


def test_no_site_is_named_where_the_server_saw_no_per_site_score():
    secure = _result()
    secure["training"]["metrics"]["per_site"] = {}  # secure sums: pooled only
    assert unscored_sites(secure) == {}
    assert "not scored" not in verdict(secure) and "No AUROC (why)" not in sites_section(secure)
    dp = copy.deepcopy(_result())
    dp["training"]["metrics"]["pooled"] = {"auroc": None, "weighted_f1": 0.7, "n": 47}  # DP: no AUROC at all
    assert unscored_sites(dp) == {"d": "was dropped at the training step: timed out"}  # b, c have F1s of their rows
    assert "Scored at 3 of 4 sites: d was dropped" in _text(verdict(dp))


def test_a_multiclass_verdict_counts_a_site_without_test_rows(tmp_path):
    """No AUROC with three classes: the weighted F1 is compared, and a site without a test part is
    named (``no_score``) and counted instead of compared on an F1 of 0.000 over no rows."""
    rng = np.random.default_rng(5)
    sites = {}
    for name, n in (("s0", 300), ("s1", 270), ("s2", 260), ("tiny", 36)):
        X = rng.normal(size=(n, 3))
        cls = np.argmax(X @ np.array([[2, -1, 0], [0, 2, -1], [-1, 0, 2]]) + rng.normal(scale=0.3, size=(n, 3)), 1)
        if name == "tiny":
            cls = np.repeat([0, 1, 2], 12)
        f = pd.DataFrame(X, columns=["a", "b", "c"])
        f["kind"] = np.array(["x", "y", "z"])[cls]
        f.to_csv(tmp_path / f"{name}.csv", index=False)
        sites[name] = {"path": str(tmp_path / f"{name}.csv"), "allow_server_row_sets": True}
    res = run_job({"target": "kind", "sites": sites, "training": {"model": "logistic", "rounds": 2},
                   "run": {"out": str(tmp_path / "out")}}, engine="local", out=tmp_path / "out")
    assert res["training"]["task"] == "multiclass" and res["sites"]["tiny"]["n_test"] == 0
    assert res["sites"]["tiny"]["no_score"].startswith("has no test part: its 36 rows are too few")
    assert not any("no_score" in res["sites"][s] or "no_auroc" in res["sites"][s] for s in ("s0", "s1", "s2"))
    page = (tmp_path / "out" / "report.html").read_text()
    start = page.index('class="headline"')
    said = _text(page[start:page.index("</ul>", start)])
    assert "Scored at 3 of 4 sites: tiny has no test part" in said
    assert "tiny (" not in said  # not compared on an F1 over no rows
    assert "(3 of 4" in said or "of 4 sites" in said
    assert "No score (why)" in page
