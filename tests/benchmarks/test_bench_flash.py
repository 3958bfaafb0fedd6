"""`python -m benchmarks.flash --quick` runs and writes its outputs in the documented format."""

import json


def test_quick_run_writes_results(tmp_path):
    from benchmarks import flash  # imported here: collection stays fast

    flash.main(["--quick", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "flash.json").read_text())
    assert rows
    md = (tmp_path / "flash.md").read_text()
    assert "python -m benchmarks.flash --quick" in md
    keys = {"model", "dataset", "selector", "f1_all", "f1_fe", "freedom_degree", "param_reduction"}
    assert all(set(r) == keys for r in rows)
    assert {r["model"] for r in rows} == {"gnb", "sgd", "mlp"}
    assert {r["selector"] for r in rows} == {"lasso", "markov_blanket", "sequential_attention"}
    assert all(0 <= r["param_reduction"] <= 1 and 0 <= r["f1_fe"] <= 1 for r in rows)
    assert (tmp_path / "flash.png").stat().st_size > 1000
