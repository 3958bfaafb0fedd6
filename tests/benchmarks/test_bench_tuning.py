"""`python -m benchmarks.tuning --quick` runs and writes its outputs in the documented format."""

import json


def test_quick_run_writes_results(tmp_path):
    from benchmarks import tuning  # imported here: collection stays fast

    tuning.main(["--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "tuning.json").read_text())
    assert rows
    md = (tmp_path / "tuning.md").read_text()
    assert "python -m benchmarks.tuning --quick" in md
    assert {r["method"] for r in rows} == {"hill-climb", "grid", "grid (tolerance 0)"}
    assert all(r["curve"] and 0 <= r["test_f1"] <= 1 for r in rows)
    assert (tmp_path / "tuning.png").stat().st_size > 1000
