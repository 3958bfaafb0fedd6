"""`python -m benchmarks.small_sites --quick` runs the selection against local-only and centralised."""

import json


def test_quick_run_writes_results(tmp_path):
    from benchmarks import small_sites  # imported here: collection stays fast

    small_sites.main(["--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "small_sites.json").read_text())
    assert len(rows) == 1 and rows[0]["case"] == "heart"
    r = rows[0]
    for key in ("tuned", "tuned_global", "no_election", "local_only", "centralised"):
        assert 0.5 < r[key] <= 1, key
    assert r["exchanges_imputation"] == 0 and r["exchanges_selection"] == 3 + 3  # --quick: 3 rounds
    assert set(r["contributions"]) == {"h1", "h2", "h3", "h4"}
    md = (tmp_path / "small_sites.md").read_text()
    assert "python -m benchmarks.small_sites --quick" in md and "| mean |" in md
