"""benchmarks.gbdt --pooled-only --quick: fedtab's pooled GBDT and XGBoost on Adult agree."""

import pytest

pytestmark = pytest.mark.requires("xgboost")

from benchmarks.gbdt import main  # noqa: E402


def test_quick_pooled_rows_agree_with_xgboost(tmp_path):
    out = main(["--pooled-only", "--quick", "--out", str(tmp_path / "gbdt.json")])
    ours, ref = out["rows"]
    assert ours["row"] == "fedtab_pooled" and ref["row"] == "xgboost"
    assert ours["auroc"] > 0.88 and ref["auroc"] > 0.88
    assert abs(ours["auroc"] - ref["auroc"]) < 0.01 and out["ratio"]["log_loss_ratio"] < 1.02
    assert ours["level_exchanges_per_tree"] <= 4  # --quick: depth 4, one exchange per level
    assert (tmp_path / "gbdt.json").is_file()


@pytest.mark.slow
def test_quick_federated_rows_run_and_secure_grows_the_same_trees(tmp_path):
    out = main(["--quick", "--cases", "homogeneous", "--lr-rounds", "2", "--lr-epochs", "2",
                "--out", str(tmp_path / "gbdt.json"), "--markdown", str(tmp_path / "gbdt.md")])
    rows = {r["row"]: r for r in out["rows"]}
    assert {"fed_gbdt", "fed_gbdt_secure", "xgb_pooled", "fed_logistic", "local_xgb:site0"} <= set(rows)
    assert rows["fed_gbdt_secure"]["same_trees_as_plain"] is True
    assert abs(rows["fed_gbdt"]["auroc"] - rows["xgb_pooled"]["auroc"]) < 0.01
    assert rows["fed_gbdt"]["exchanges_per_tree"] <= 4 + 0.1  # --quick: depth 4
    assert "not run" in (tmp_path / "gbdt.md").read_text()


def test_compute_only_prints_the_cpu_ratio_to_xgboost(capsys):
    out = main(["--quick", "--cases", "homogeneous", "--compute-only"])
    rows = {r["row"]: r for r in out["rows"]}
    assert set(rows) == {"fed_gbdt", "xgb_pooled"}
    assert rows["fed_gbdt"]["cpu_seconds"] > 0 and rows["xgb_pooled"]["cpu_seconds"] > 0
    ratio = rows["fed_gbdt"]["cpu_seconds"] / rows["xgb_pooled"]["cpu_seconds"]
    assert out["checks"]["homogeneous"]["cpu_vs_xgb"] == ratio
    assert f"{ratio:.2f}x" in capsys.readouterr().out
