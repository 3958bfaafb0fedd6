"""`python -m benchmarks.fdr --quick` runs, writes its outputs, and shows the point of
``fdr = q``: far fewer null columns kept than the vote, at the same power on strong signal."""

import json


def test_quick_run_writes_results_and_the_vote_keeps_more_noise(tmp_path):
    from benchmarks import fdr  # imported here: collection stays fast

    assert fdr.main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "fdr.json").read_text())
    summary = doc["summary"]
    bh, by = summary["score test, fdr = 0.1 (BH)"], summary["score test, fdr = 0.1 (BY)"]
    vote = summary["vote, fd = 0.5 (lasso)"]
    assert len(doc["per_seed"]) == len(doc["seeds"]) == 5
    assert by["kept"] <= bh["kept"] and by["fdr"] <= bh["fdr"]
    assert vote["fdr"] > bh["fdr"] + 0.2 and bh["power"] >= 0.9
    assert "| score test, fdr = 0.1 (BH) |" in (tmp_path / "fdr.md").read_text()
