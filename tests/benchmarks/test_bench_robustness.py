"""`python -m benchmarks.robustness --quick` runs and writes its outputs in the documented format."""

import json


def test_quick_run_writes_results(tmp_path):
    from benchmarks import robustness  # imported here: collection stays fast

    robustness.main(["--quick", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "robustness.json").read_text())
    rows = doc["rows"]
    assert {(r["hostile"], r["robust"]) for r in rows} == {(h, b) for h in (0, 1, 2) for b in (False, True)}
    assert all(0 <= r["demo"]["f1"] <= 1 and r["airquality"]["observed_rmse"] > 0 for r in rows)
    md = (tmp_path / "robustness.md").read_text()
    assert "python -m benchmarks.robustness --quick" in md
    assert "Cost of `robust=True` with no hostile site" in md
    # the poisoned plain run reports the hostile sites' perfect confusion matrices; robust mode does not
    plain = next(r for r in rows if r["hostile"] == 2 and not r["robust"])
    robust = next(r for r in rows if r["hostile"] == 2 and r["robust"])
    assert plain["demo"]["reported_f1"] > robust["demo"]["reported_f1"]
