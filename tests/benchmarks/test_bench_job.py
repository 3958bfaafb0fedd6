"""`python -m benchmarks.job --quick` runs the job, its baselines and the centralised reference."""

import json
from html.parser import HTMLParser

import pytest


def test_quick_run_writes_results_and_report(tmp_path):
    from benchmarks import job  # imported here: collection stays fast

    job.main(["--quick", "--out", str(tmp_path), "--work", str(tmp_path / "work")])
    out = json.loads((tmp_path / "job.json").read_text())
    assert out["command"] == "python -m benchmarks.job --quick" and len(out["runs"]) == 1
    r = out["runs"][0]
    assert r["dataset"] == "heart" and set(r["sites"]) == {"cleveland", "hungarian", "va"}
    steps = {s.get("step", s.get("name")): s for s in r["steps"]}
    assert {"schema", "election", "training", "baselines"} <= set(steps) and "imputation" not in steps
    assert all(s["seconds"] > 0 and s["bytes_up"] > 0 for s in steps.values())
    for key in ("federated", "local_only", "centralised"):
        assert 0.5 < r[key]["auroc"] <= 1, key
    assert r["majority"]["auroc"] == 0.5
    assert set(r["local_only_per_site"]) == set(r["federated_per_site"]) == set(r["sites"])
    md = (tmp_path / "job.md").read_text()
    assert "python -m benchmarks.job --quick" in md and "| centralised scikit-learn" in md
    ids = []
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: ids.append(dict(attrs).get("id")) if tag == "section" else None
    parser.feed((tmp_path / "work" / "seed0" / "job-run" / "report.html").read_text())
    assert {"metrics", "baselines", "steps"} <= set(ids)


@pytest.mark.slow
def test_small_sites_through_the_job_quick(tmp_path):
    """``--small-sites --quick``: the tuned and the no-election jobs on heart, scored from their model files."""
    from benchmarks import job

    rows = job.main(["--small-sites", "--quick", "--out", str(tmp_path), "--work", str(tmp_path / "work")])
    (row,) = rows
    assert row["case"] == "heart" and set(row["exchanges_tuned"]) == {"schema", "imputation", "selection"}
    assert row["exchanges_tuned"]["selection"] == 3 + 3  # --quick: 3 rounds
    assert {"training", "baselines"} <= set(row["exchanges_no_election"])
    for key in ("tuned", "tuned_global", "no_election", "local_only", "centralised"):
        assert 0.5 < row[key] <= 1.0, key
    md = (tmp_path / "small_sites_job.md").read_text()
    assert "python -m benchmarks.job --small-sites --quick" in md and "tuned − no_election" in md
