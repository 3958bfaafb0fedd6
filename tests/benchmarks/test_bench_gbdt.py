"""benchmarks.gbdt --pooled-only --quick: fedtab's pooled GBDT and XGBoost on Adult agree."""

import pytest

pytest.importorskip("xgboost")

from benchmarks.gbdt import main  # noqa: E402


def test_quick_pooled_rows_agree_with_xgboost(tmp_path):
    out = main(["--pooled-only", "--quick", "--out", str(tmp_path / "gbdt.json")])
    ours, ref = out["rows"]
    assert ours["row"] == "fedtab_pooled" and ref["row"] == "xgboost"
    assert ours["auroc"] > 0.88 and ref["auroc"] > 0.88
    assert abs(ours["auroc"] - ref["auroc"]) < 0.01 and out["ratio"]["log_loss_ratio"] < 1.02
    assert ours["level_exchanges_per_tree"] <= 4  # --quick: depth 4, one exchange per level
    assert (tmp_path / "gbdt.json").is_file()
