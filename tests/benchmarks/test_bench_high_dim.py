"""`python -m benchmarks.high_dim --quick` runs and writes its outputs in the documented format."""

import json


def test_quick_run_writes_results(tmp_path):
    from benchmarks import high_dim  # imported here: collection stays fast

    high_dim.main(["--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "high_dim.json").read_text())
    assert rows
    md = (tmp_path / "high_dim.md").read_text()
    assert "python -m benchmarks.high_dim --quick" in md
    keys = {"dataset", "sites", "method", "metric", "mean", "std", "repeats"}
    assert all(set(r) == keys for r in rows)
    assert {r["method"] for r in rows} == {"local", "federated_l1_all", "feature_election", "centralised"}
