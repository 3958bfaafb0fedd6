"""A report that tells the truth (issue 24, item 4): the verdict, AUROC intervals, settings,
coefficients, deployment, the disclosure statement of this run, per-command pages, scrolling
tables and figures as PNG files — checked by parsing report.html.

Result dicts are built directly (milliseconds); one tiny local job (two FedAvg rounds on the
Heart example sites, no imputation) is shared by the module for the end-to-end checks.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from fedtab.report import SECTIONS, render_report, write_report
from fedtab.report.disclosure import WHAT
from fedtab.report.html import TEMPLATES
from fedtab.report.intervals import FEW_ROWS, Z95, auroc_interval, hanley_mcneil_se
from fedtab.report.model import model_summary

MINUS = "\u2212"
HOSTILE = '<script>alert("x")</script>'


class Page(HTMLParser):
    """Text per section id, the classes of <li>/<tr> elements with their text, tables and their parents."""

    def __init__(self, html: str):
        super().__init__()
        self.text: dict[str, str] = {}
        self.tags: list[str] = []
        self.rows: list[tuple[str, str, str]] = []  # (section, class, text) of each <tr> and <li>
        self.table_parents: list[str] = []
        self.header = ""
        self._section = None
        self._stack: list[tuple[str, dict]] = []
        self._row: list | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "table":
            self.table_parents.append(" ".join(f"{t}.{d.get('class', '')}" for t, d in self._stack[-1:]))
        if tag == "section":
            self._section = a.get("id")
            self.text[self._section] = ""
        if tag in ("tr", "li"):
            self._row = [self._section, a.get("class") or "", ""]
        self._stack.append((tag, a))

    def handle_endtag(self, tag):
        while self._stack and self._stack.pop()[0] != tag:
            pass
        if tag in ("tr", "li") and self._row is not None:
            self.rows.append(tuple(self._row))
            self._row = None

    def handle_data(self, data):
        if self._section is None:
            self.header += data
            return
        self.text[self._section] += data
        if self._row is not None:
            self._row[2] += data + " "  # cells apart

    def section_rows(self, section: str) -> list[tuple[str, str]]:
        return [(c, t) for s, c, t in self.rows if s == section]


def _scores(auroc: float, cm: list[list[int]], **extra) -> dict:
    """An evaluation's scores as a job writes them: an exact AUROC (bounds [a, a]) unless ``extra`` says."""
    n = int(sum(map(sum, cm)))
    return {"auroc": auroc, "auroc_bounds": [auroc, auroc], "auroc_error_bound": 0.0, "confusion": cm, "n": n,
            "accuracy": (cm[0][0] + cm[1][1]) / n, **extra}


def four_sites() -> dict:
    """A result where federating loses at 3 of 4 sites; site 'tiny' has 3 test negatives."""
    fed = {"north": 0.70, "south": 0.72, "east": 0.80, "tiny": 0.60}
    loc = {"north": 0.80, "south": 0.75, "east": 0.70, "tiny": 0.90}
    cm = {"north": [[40, 10], [10, 40]], "south": [[30, 10], [10, 30]], "east": [[45, 5], [10, 40]],
          "tiny": [[2, 1], [3, 20]]}
    per = lambda vals: {s: _scores(v, cm[s]) for s, v in vals.items()}  # noqa: E731
    pooled_cm = np.sum([cm[s] for s in cm], axis=0).tolist()
    return {
        "job": {"target": "y", "training": {"model": "logistic", "rounds": 7, "local_epochs": 3}, "impute": None,
                "run": {"seed": 3, "test_size": 0.2},
                "sites": [{"name": s, "path": f"/data/{s}.csv", "min_rows": 5} for s in fed]},
        "engine": "flower",
        "deployment": {"superlink": "10.0.0.5:9093", "run_id": 4711, "identity": "server-key-ab12"},
        "schema": {"classes": ["0", "1"], "ranges": {f"c{i}": [0.0, 1.0] for i in range(12)}, "categories": {}},
        "training": {"model": "logistic", "rounds": 7, "local_epochs": 3,
                     "metrics": {"pooled": _scores(0.71, pooled_cm), "per_site": per(fed)}},
        "baselines": {"local_only": {"pooled": _scores(0.76, pooled_cm), "per_site": per(loc)},
                      "majority": {"class": "0", "pooled": _scores(0.5, pooled_cm),
                                   "per_site": {s: _scores(0.5, cm[s]) for s in cm}}},
        "model": {"name": "logistic", "params": {"l2": 0.001}, "features": ["age", HOSTILE, "bp"], "classes": ["0", "1"],
                  "coef": [[0.5, -1.2, 0.1]], "intercept": [-0.3], "mean": [50.0, 1.0, 120.0], "std": [10.0, 2.0, 15.0]},
        "participation": {"steps": [], "dropped": {},
                          "exchanges": [{"step": "job_profile", "sites": list(fed)}, {"step": "fit", "sites": list(fed)},
                                        {"step": "fit", "sites": list(fed)}, {"step": "evaluate", "sites": list(fed)}]},
        "privacy": {"secure_aggregation": False, "dp": None},
    }


# ----------------------------------------------------------------------------- intervals
def test_hanley_mcneil_matches_the_papers_example_and_delong_on_binormal_scores():
    # Hanley & McNeil (1982), table: A = 0.893 over 51 abnormal and 58 normal cases has SE 0.032
    assert hanley_mcneil_se(0.893, 51, 58) == pytest.approx(0.0326, abs=5e-4)
    rng = np.random.default_rng(0)
    pos, neg = rng.normal(1.0, 1.0, 150), rng.normal(0.0, 1.0, 200)
    v10 = np.array([(neg < p).mean() + 0.5 * (neg == p).mean() for p in pos])  # DeLong placements
    v01 = np.array([(pos > q).mean() + 0.5 * (pos == q).mean() for q in neg])
    auc = v10.mean()
    delong = math.sqrt(v10.var(ddof=1) / pos.size + v01.var(ddof=1) / neg.size)
    assert hanley_mcneil_se(auc, pos.size, neg.size) == pytest.approx(delong, rel=0.15)


def test_auroc_interval_reads_the_class_counts_and_flags_few_rows():
    ci = auroc_interval({"auroc": 0.8, "confusion": [[30, 10], [5, 45]]})
    se = hanley_mcneil_se(0.8, 50, 40)
    assert (ci["positives"], ci["negatives"], ci["few"]) == (50, 40, False)
    assert ci["low"] == pytest.approx(0.8 - Z95 * se) and ci["high"] == pytest.approx(0.8 + Z95 * se)
    binned = auroc_interval({"auroc": 0.8, "confusion": [[30, 10], [5, 45]], "auroc_error_bound": 0.02})
    assert binned["low"] == pytest.approx(ci["low"] - 0.02) and binned["high"] == pytest.approx(ci["high"] + 0.02)
    few = auroc_interval({"auroc": 0.9, "confusion": [[1, 0], [3, 30]]})  # one test negative
    assert few["few"] and few["negatives"] == 1 < FEW_ROWS
    assert auroc_interval({"auroc": 0.9999999999999997, "confusion": [[4, 0], [0, 5]]})["low"] is None  # at its bound
    assert auroc_interval({"auroc": 0.7}) is None and auroc_interval({"auroc": None, "confusion": [[1, 0], [0, 1]]}) is None
    assert auroc_interval({"auroc": 0.5, "confusion": [[3, 0, 0], [0, 3, 0], [0, 0, 3]]}) is None  # not binary
    with pytest.raises(ValueError):
        hanley_mcneil_se(0.5, 0, 10)


# ----------------------------------------------------------------------------- verdict and negatives
def test_the_verdict_says_where_federating_lost_and_marks_it_three_ways():
    page = Page(render_report(four_sites()))
    assert list(page.text)[0] == "verdict"  # at the top
    text = " ".join(page.text["verdict"].split())
    assert "The federated model is worse than training alone at 3 of 4 sites" in text
    worse = [t for c, t in page.section_rows("verdict") if c == "worse"]
    assert len(worse) == 1 and "▼ worse" in worse[0]  # every site's AUROC is above the majority class's 0.5
    for site, d in (("north", "0.100"), ("south", "0.030"), ("tiny", "0.300")):
        assert f"{site} (AUROC" in worse[0] and f"{MINUS}{d}" in worse[0]
    better = [t for c, t in page.section_rows("verdict") if c == "better"]
    assert any("east" in t and "+0.100" in t and "▲ better" in t for t in better)
    # differences inside overlapping intervals are called possible chance (at 80-100 test rows, 0.1 apart still is)
    chance = [" ".join(t.split()) for c, t in page.section_rows("verdict") if "⚠ chance?" in t]
    assert len(chance) == 1 and "At 4 of the 4 sites where the two differ (north, south, east, tiny)" in chance[0]
    big = four_sites()
    for m in (big["training"]["metrics"], big["baselines"]["local_only"]):
        m["per_site"]["north"]["confusion"] = [[4000, 1000], [1000, 4000]]  # 0.1 apart on 10,000 rows: no overlap
    chance = [" ".join(t.split()) for c, t in Page(render_report(big)).section_rows("verdict") if "⚠ chance?" in t]
    assert "At 3 of the 4 sites where the two differ (south, east, tiny)" in chance[0]
    # the majority class, with the pooled interval
    assert "majority class" in text and "95 % CI" in text
    # the site with 3 test negatives is named with its counts
    assert any(c == "warn" and "tiny (3 negatives, 23 positives)" in " ".join(t.split())
               for c, t in page.section_rows("verdict"))
    # the baselines table: worse rows carry the class, a minus sign and the words
    rows = {t.split()[0]: (c, t) for c, t in page.section_rows("baselines") if c}
    assert rows["north"][0] == "worse" and f"{MINUS}0.100 ▼ worse" in rows["north"][1]
    assert rows["east"][0] == "better" and "+0.100 ▲ better" in rows["east"][1]


def test_a_site_below_the_majority_class_is_named():
    r = four_sites()
    r["training"]["metrics"]["per_site"]["tiny"]["auroc"] = 0.42
    worse = [" ".join(t.split()) for c, t in Page(render_report(r)).section_rows("verdict") if c == "worse"]
    assert any(f"majority class at 1 of 4 sites: tiny (AUROC 0.420 vs 0.500, {MINUS}0.080)" in t for t in worse)


def test_a_verdict_without_baselines_or_model_says_so():
    r = four_sites()
    del r["baselines"]
    text = " ".join(Page(render_report(r)).text["verdict"].split())
    assert "computed no baselines" in text and "worse than training alone" not in text
    ci = auroc_interval(r["training"]["metrics"]["pooled"])
    assert f"AUROC is 0.710 (95 % CI {ci['low']:.3f}–{ci['high']:.3f}); 0.500 is chance." in text
    assert "No model was trained" in Page(render_report({})).text["verdict"]
    r = four_sites()
    r["training"]["metrics"]["per_site"] = {}  # secure aggregation: pooled scores only
    assert "only pooled scores" in Page(render_report(r)).text["verdict"]


def test_metrics_show_an_interval_per_site_and_pooled_and_flag_few_rows():
    r = four_sites()
    page = Page(render_report(r))
    rows = [t for _, t in page.section_rows("metrics")]
    pooled = auroc_interval(r["training"]["metrics"]["pooled"])
    fed_all = next(t for t in rows if t.startswith("Federated") and "all sites" in t)
    assert f"{pooled['low']:.2f}–{pooled['high']:.2f}" in fed_all
    north = auroc_interval(r["training"]["metrics"]["per_site"]["north"])
    assert any("north" in t and f"{north['low']:.2f}–{north['high']:.2f}" in t for t in rows)
    tiny = [t for t in rows if "tiny" in t and t.startswith(("Federated", "Local"))]
    assert tiny and all("⚠ few" in t for t in tiny)
    assert not any("⚠ few" in t for t in rows if "north" in t)
    assert "tiny: 3 negative, 23 positive" in page.text["metrics"]


def test_a_bounded_pooled_auroc_shows_its_bounds_and_an_unbounded_one_is_not_headlined():
    r = four_sites()
    pooled = r["training"]["metrics"]["pooled"]
    pooled.update(auroc=0.75, auroc_bounds=[0.70, 0.80], auroc_error_bound=0.05, weighted_f1=0.77)
    page = Page(render_report(r))
    text = " ".join(page.text["verdict"].split())
    ci = auroc_interval(pooled)
    assert ci["bounds"] == (0.70, 0.80)  # the 95 % interval runs from the bounds outwards
    assert ci["low"] == pytest.approx(0.70 - Z95 * ci["se"]) and ci["high"] == pytest.approx(0.80 + Z95 * ci["se"])
    assert (f"its AUROC is 0.750 (an estimate: the exact value lies between 0.700 and 0.800, as the sites' smoothed "
            "score histograms leave some pairs of rows unordered; secure aggregation gives it exactly; 95 % CI "
            f"{ci['low']:.3f}–{ci['high']:.3f}) against 0.500") in text
    fed_all = next(t for _, t in page.section_rows("metrics") if t.startswith("Federated") and "all sites" in t)
    assert "0.750 [0.700–0.800]" in " ".join(fed_all.split())
    assert "somewhere in [0.700, 0.800]" in " ".join(page.text["metrics"].split())
    assert "each site sends its own AUROC's pair count" in " ".join(page.text["metrics"].split())
    r["privacy"]["secure_aggregation"] = True  # the note says how a secure run pooled it instead
    note = " ".join(Page(render_report(r)).text["metrics"].split())
    assert "summed exactly under secure aggregation" in note and "pair count" not in note
    r["privacy"]["secure_aggregation"] = False
    # an estimate with no bound (a result of an older fedtab): the verdict states the exact pooled F1 instead
    del pooled["auroc_bounds"], pooled["auroc_error_bound"]
    page = Page(render_report(r))
    text = " ".join(page.text["verdict"].split())
    assert "its AUROC is" not in text and "its F1 (weighted) is 0.770" in text
    assert "⚠ estimate The pooled AUROC (0.750) was estimated from smoothed score histograms without a bound" in text
    assert "worse than training alone at 3 of 4 sites" in text  # the per-site AUROCs are exact: still compared
    assert "(no bound)" in " ".join(page.text["metrics"].split())


# ----------------------------------------------------------------------------- settings, model, deployment
def test_settings_coefficients_and_deployment_are_shown():
    page = Page(render_report(four_sites()))
    settings = {t.split()[0]: t.split()[1:] for _, t in page.section_rows("settings")}
    assert settings["training.rounds"] == ["7"] and settings["run.seed"] == ["3"]
    assert settings["impute"] == ["not", "run"] and settings["tiny"] == ["/data/tiny.csv", "5"]
    model = page.section_rows("model")
    assert [t.split()[0] for _, t in model[1:4]] == ["<script>alert(\"x\")</script>".split()[0], "age", "bp"]
    hostile = next(t for _, t in model if HOSTILE in t)
    assert f"{math.exp(-1.2):.3g}" in hostile and f"{math.exp(-1.2 / 2.0):.3g}" in hostile  # per SD, per unit
    assert "script" not in page.tags
    dep = " ".join(page.text["deployment"].split())
    assert "10.0.0.5:9093" in dep and "4711" in dep and "server-key-ab12" in dep


def test_model_summary_keeps_linear_coefficients_and_nothing_of_other_models():
    section = {"features": ["a", "b"], "classes": ["0", "1"], "mean": [0, 1], "std": [1, 2],
               "model": {"name": "logistic", "params": {"l2": 0.1}}, "params": {"coef": [[1.0, 2.0]], "intercept": [0.5]}}
    s = model_summary(section)
    assert s["coef"] == [[1.0, 2.0]] and s["intercept"] == [0.5] and s["std"] == [1.0, 2.0]
    mlp = model_summary({**section, "model": {"name": "mlp", "params": {}}, "params": {"w0": [[0.0] * 50] * 50}})
    assert "coef" not in mlp and "w0" not in json.dumps(mlp)
    assert model_summary(None) is None


# ----------------------------------------------------------------------------- disclosure
def test_the_disclosure_statement_is_built_from_what_this_run_sent():
    page = Page(render_report(four_sites()))
    assert "Only counts, sums and model parameters left the sites" not in page.header
    assert "coarse min/max values of 12 column(s)" in page.header
    assert "model parameters after each round" in page.header
    kinds = {t.split()[0]: t for _, t in page.section_rows("disclosure")[1:]}
    assert set(kinds) == {"job_profile", "fit", "evaluate"}
    assert kinds["fit"].split()[1:5] == ["2", "exchanges,", "4", "sites"]
    assert "5th smallest" in kinds["job_profile"] and "released for 12 column(s)" in kinds["job_profile"]
    # a run that never asked for a profile claims no ranges, even with ranges from a profile the job gave;
    # a run without a record says it cannot tell
    r = four_sites()
    r["participation"]["exchanges"] = [e for e in r["participation"]["exchanges"] if e["step"] != "job_profile"]
    assert "min/max" not in render_report(r)
    r.pop("participation")
    assert "cannot say what left the sites" in Page(render_report(r)).header


def test_every_site_message_kind_is_described_and_a_hostile_kind_stays_text():
    from fedtab.federation.site.core import HANDLERS
    from fedtab.federation import register_all

    register_all()
    kinds = set(HANDLERS)  # the message kinds (table steps such as impute_fill are no message)
    assert kinds <= set(WHAT), f"describe in fedtab.report.disclosure.WHAT: {sorted(kinds - set(WHAT))}"
    r = four_sites()
    r["participation"]["exchanges"].append({"step": HOSTILE, "sites": ["north"]})
    page = Page(render_report(r))
    assert "script" not in page.tags and HOSTILE in page.text["disclosure"]
    assert "no release declaration found" in page.text["disclosure"]


# ----------------------------------------------------------------------------- pages, tables, figures
def test_impute_and_elect_pages_have_no_empty_job_sections():
    impute = {"sites": {"a": {"n_rows": 10, "columns": ["x"]}}, "settings": {"rounds": 3},
              "imputation": {"validation": {"per_column": {"x": 0.5}, "per_column_mean_fill": {"x": 1.0}}},
              "participation": {"exchanges": [{"step": "impute_stats", "sites": ["a"]}]}}
    impute["imputation"].update(best_round=2, training_curve=[{"round": r, "train_loss": 1 / r, "val_rmse": None}
                                                              for r in (1, 2, 3)])
    page = Page(render_report(impute, "impute"))
    assert list(page.text) == ["sites", "disclosure", "guarantees", "imputation", "settings"]
    assert page.tags.count("img") == 1  # the imputer's training curve
    impute["imputation"]["validation"]["per_column"] = {"x": None}  # every site's held-out cells suppressed
    assert "⚠ unmeasured" in Page(render_report(impute, "impute")).text["imputation"]
    assert "fedtab imputation report" in page.header and "rounds" in page.text["settings"]
    elect = {"election": {"freedom_degree": 0.5, "selected": ["x"]}, "sites": [{"name": "a", "columns": ["x"]}]}
    assert list(Page(render_report(elect, "elect")).text) == ["election", "sites"]
    assert list(Page(render_report({}, "run")).text) == list(SECTIONS)  # the job page keeps every section
    assert set(TEMPLATES) >= {"run", "impute", "elect"}
    with pytest.raises(ValueError, match="unknown report template"):
        render_report({}, "predict")


def test_tables_scroll_and_figures_are_written_beside_the_report(tmp_path):
    path = write_report(four_sites(), tmp_path / "report.html")
    page = Page(path.read_text(encoding="utf-8"))
    assert page.table_parents and all(p == "div.scroll" for p in page.table_parents)
    assert ".scroll{overflow-x:auto" in path.read_text(encoding="utf-8")
    pngs = sorted(tmp_path.glob("report-*.png"))
    assert [p.name for p in pngs] == ["report-auroc-by-site.png"]
    assert pngs[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and page.tags.count("img") == len(pngs)
    (tmp_path / "report-tuning.png").write_bytes(b"stale")  # a figure an earlier report drew
    (tmp_path / "other.png").write_bytes(b"mine")
    write_report({}, tmp_path / "report.html")  # draws no figure
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["other.png"]


# ----------------------------------------------------------------------------- one real tiny job
@pytest.fixture(scope="module")
def job_run(tmp_path_factory) -> tuple[dict, Path]:
    """A tiny job on the local engine: 3 Heart sites, an election, 2 rounds of logistic FedAvg."""
    from fedtab.data.example_sites import HEART_SITES, write_heart_sites
    from fedtab.job.run import run_job

    d = tmp_path_factory.mktemp("report_job")
    write_heart_sites(d, rows=150)
    doc = {"target": "disease", "na_values": ["?"], "election": {"freedom_degree": 0.5},
           "sites": {n.split(".")[0]: {"path": str(d / n), "min_rows": 4} for n in HEART_SITES},
           "training": {"rounds": 2, "local_epochs": 2}, "run": {"out": str(d / "out")}}
    return run_job(doc, engine="local", out=d / "out"), d / "out"


def test_a_jobs_report_holds_the_verdict_intervals_settings_and_disclosure(job_run):
    result, out = job_run
    assert (out / "report-auroc-by-site.png").is_file()  # fedtab run writes the figures as PNG too
    assert result["model"]["features"] == result["training"]["features"] and len(result["model"]["coef"][0]) == len(
        result["model"]["features"])
    assert json.loads((out / "result.json").read_text())["model"] == result["model"]
    page = Page((out / "report.html").read_text(encoding="utf-8"))
    assert list(page.text) == list(SECTIONS)
    assert "than training alone" in page.text["verdict"]
    fed = result["training"]["metrics"]["pooled"]
    ci = auroc_interval(fed)
    assert f"{ci['low']:.2f}–{ci['high']:.2f}" in page.text["metrics"]
    assert "training.rounds" in page.text["settings"] and "local" in page.text["deployment"]
    run_id = json.loads((out / "result.json").read_text())["run_id"]
    assert run_id and f"fedtab run id {run_id}" in [" ".join(t.split()) for _, t in page.section_rows("deployment")]
    assert f"Federated run {run_id} by fedtab" in " ".join(page.header.split())
    n_ranges = len(result["schema"]["ranges"])
    assert f"coarse min/max values of {n_ranges} column(s)" in page.header
    sent = {e["step"] for e in result["participation"]["exchanges"]}
    shown = {t.split()[0] for _, t in page.section_rows("disclosure")[1:]}
    assert shown == sent
    assert "Odds ratio per SD" in page.text["model"]


def test_elect_writes_the_election_page(job_run, tmp_path):
    from typer.testing import CliRunner

    from fedtab.cli import app
    from fedtab.data.example_sites import HEART_SITES

    sites = job_run[1].parent
    res = CliRunner().invoke(app, ["elect", *(str(sites / n) for n in HEART_SITES), "--target", "disease",
                                   "--na-value", "?", "--min-rows", "4", "--out", str(tmp_path / "el")])
    assert res.exit_code == 0, res.output
    page = Page((tmp_path / "el" / "report.html").read_text(encoding="utf-8"))
    assert {"verdict", "election", "metrics", "model", "settings", "disclosure"} <= set(page.text)
    assert not {"baselines", "imputation", "tuning", "deployment"} & set(page.text)  # no empty sections
    assert "computed no baselines" in page.text["verdict"]
    assert "Odds ratio per SD" in page.text["model"]  # the coefficients of the model elect trained


@pytest.mark.slow
def test_headless_chromium_renders_the_report_at_400_px(job_run, tmp_path):
    """The documented look (docs/report.md): a headless Chromium screenshot of report.html."""
    chromium = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install -y chromium): the headless render is not checked")
    from PIL import Image

    shot = tmp_path / "narrow.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=400,3000", (job_run[1] / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    image = np.asarray(Image.open(shot).convert("L"))
    assert image.shape == (3000, 400) and (image < 128).mean() > 0.001  # drawn, with dark text on it


def test_the_disclosure_follows_the_runs_modes():
    r = four_sites()
    r["privacy"] = {"secure_aggregation": False, "dp": {"epsilon": 4.0, "delta": 1e-5, "epsilon_spent": 3.9}}
    page = Page(render_report(r))
    kinds = {t.split()[0]: " ".join(t.split()) for _, t in page.section_rows("disclosure")[1:]}
    assert "no score histogram" in kinds["evaluate"] and "noised by the site" in kinds["fit"]
    assert "score histograms" not in page.header and "differential privacy" in page.header
    r["privacy"] = {"secure_aggregation": True, "dp": None}
    kinds = {t.split()[0]: " ".join(t.split()) for _, t in Page(render_report(r)).section_rows("disclosure")[1:]}
    assert "masked" in kinds["fit"] and "masked" not in kinds["job_profile"]


def test_hostile_site_names_settings_and_identities_stay_text():
    r = four_sites()
    per = r["training"]["metrics"]["per_site"]
    per[HOSTILE] = per.pop("north")
    r["baselines"]["local_only"]["per_site"][HOSTILE] = r["baselines"]["local_only"]["per_site"].pop("north")
    r["job"]["run"]["note"] = HOSTILE
    r["deployment"]["identity"] = HOSTILE
    r["baselines"]["majority"]["class"] = HOSTILE
    page = Page(render_report(r))
    assert "script" not in page.tags
    for section in ("verdict", "metrics", "baselines", "settings", "deployment"):
        assert HOSTILE in page.text[section], section


def test_a_multiclass_model_shows_one_coefficient_table_per_class_and_no_odds_ratio():
    r = {"model": {"name": "logistic", "features": ["a", "b"], "classes": ["x", "y", "z"], "std": [1.0, 1.0],
                   "coef": [[0.1, 0.2], [0.3, -0.4], [0.0, 0.5]], "intercept": [0.0, 0.1, 0.2]}}
    page = Page(render_report(r))
    text = page.text["model"]
    assert all(f"Score of class “{c}”" in text for c in "xyz") and "Odds ratio" not in text
    r["model"]["coef"] = [[0.1]]  # does not match the two features: said, not drawn
    assert "do not match its features" in Page(render_report(r)).text["model"]


def test_a_rerun_into_the_same_folder_leaves_no_stale_figure(job_run):
    from fedtab.job.run import _write_run

    result, out = job_run
    (out / "report-tuning.png").write_bytes(b"an earlier run's tuning curve")
    _write_run(out, result, lambda d: (d / "model.fedtab").write_bytes((out / "model.fedtab").read_bytes()))
    assert sorted(p.name for p in out.glob("report-*.png")) == ["report-auroc-by-site.png"]


# ----------------------------------------------------------------------------- one-class sites (issue 24 item 1)
def _one_class_result(name: str = "tiny") -> dict:
    r = four_sites()
    r["sites"] = {s: {"n_rows": 100, "columns": ["age", "bp"], "one_class": False} for s in ("north", "south", "east")}
    r["sites"][name] = {"n_rows": 26, "columns": ["age"], "one_class": True,
                        "participation": {"election": "abstained: its rows hold one class", "training": True,
                                          "evaluation": True}}
    return r


def test_a_one_class_site_is_named_in_the_verdict_and_the_sites_section_with_what_it_took_part_in():
    page = Page(render_report(_one_class_result()))
    said = ("Site tiny holds one class only: it abstained from the feature election's vote (its rows hold one "
            "class); it took part in training; its test rows were scored, but it has no AUROC")
    verdict = [" ".join(t.split()) for c, t in page.section_rows("verdict") if "one-class" in c]
    assert len(verdict) == 1 and "⚠ one class" in verdict[0] and said in verdict[0]
    assert said in " ".join(page.text["sites"].split()) and "north holds" not in page.text["sites"]
    no_baselines = _one_class_result()
    del no_baselines["baselines"]
    assert said in " ".join(Page(render_report(no_baselines)).text["verdict"].split())
    left_out = _one_class_result()
    left_out["sites"]["tiny"]["participation"] = {"election": None, "training": False, "evaluation": False}
    text = " ".join(Page(render_report(left_out)).text["verdict"].split())
    assert "Site tiny holds one class only: it was left out of training; it was not evaluated and it has no AUROC." \
        in text and "election" not in text.split("Site tiny")[1]
    plain = _one_class_result()
    plain["sites"]["tiny"]["one_class"] = False
    assert "holds one class" not in render_report(plain)
    hostile = Page(render_report(_one_class_result(HOSTILE)))
    assert "script" not in hostile.tags and f"Site {HOSTILE} holds one class only" in hostile.text["sites"]


def test_the_model_section_says_why_logistic_trained_by_fedavg():
    from fedtab.report.model import model_section

    why = "trained by FedAvg (robust mode: a <lying> site's Newton step is hard to screen)"
    result = {"model": {"model": {"name": "logistic", "params": {"solver": "fedavg"}}, "features": ["a"]},
              "training": {"model": "logistic", "rounds": 3, "local_epochs": 2, "solver": "fedavg",
                           "solver_reason": why}}
    html = model_section(result)
    assert "3 FedAvg round(s) of 2 local epoch(s)" in html and "robust mode" in html and "&lt;lying&gt;" in html
    newton = {"model": {"model": {"name": "logistic", "params": {"solver": "newton"}}, "features": ["a"]},
              "training": {"model": "logistic", "rounds": 5, "solver": "newton", "solver_reason": None}}
    assert "5 Newton–Raphson iteration(s)" in model_section(newton) and "FedAvg" not in model_section(newton)
