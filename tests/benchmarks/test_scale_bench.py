"""``python -m benchmarks.scale --quick`` writes the issue-15 result files with the agreed keys."""

from __future__ import annotations

import json

from fedtab.election.agreement import DEFAULT_FREEDOM_DEGREES

ELECTION_KEYS = {"sites", "features", "server_seconds", "site_seconds", "peak_server_mb", "bytes_per_site"}
NONIID_KEYS = {"partition", "alpha", "signal_recall", "noise_kept", "jaccard_pooled", "f1", "f1_central", "f1_local"}
IMPUTE_KEYS = {"columns", "sites", "seconds", "rmse"}


def test_quick_run_writes_json_md_png(tmp_path):
    from benchmarks import scale  # imported here: collection stays fast

    assert scale.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "scale.json").read_text())
    assert {"election", "noniid", "imputation"} <= set(result)
    cfg = scale.QUICK
    assert len(result["election"]) == 2 * len(cfg["grid_sites"]) * len(cfg["grid_features"])
    for row in result["election"]:
        assert ELECTION_KEYS <= set(row) and row["step"] in ("election", "fedavg_round")
        assert row["site_seconds"] > 0 and row["peak_server_mb"] > 0 and row["bytes_per_site"] > 0
    # bytes per site: a FedAvg round moves the model both ways, the election the names and scores
    first = [r for r in result["election"] if r["sites"] == cfg["grid_sites"][0]]
    assert first[0]["bytes_per_site"] > first[1]["bytes_per_site"] > 8 * first[1]["kept"]
    assert [(r["partition"], r["alpha"], r["method"]) for r in result["noniid"]] == [
        (p, a, c) for p, a in [("label_skew", None), ("label_skew", 1.0), ("label_skew", 0.1), ("quantity_skew", None),
                               ("covariate_shift", None)] for c in scale.METHODS]
    for row in result["noniid"]:
        assert NONIID_KEYS <= set(row)
        for key in ("signal_recall", "noise_kept", "jaccard_pooled", "f1", "f1_central", "f1_local"):
            assert 0.0 <= row[key] <= 1.0, (key, row)
        if row["method"] in scale.CONSENSUS:
            assert len(row["jaccard_by_fd"]) == len(DEFAULT_FREEDOM_DEGREES)
    iid = result["noniid"][0]
    assert iid["f1"] > 0.6 and iid["f1_central"] > 0.6 and iid["one_class_sites"] == 0
    # Dirichlet(0.1) label skew leaves sites that saw one class; they abstain instead of voting noise
    assert result["noniid"][2 * len(scale.METHODS)]["one_class_sites"] >= 1
    # the pooled score test runs on exact pooled sums: it equals the same procedure on the stacked rows
    score = [r for r in result["noniid"] if r["method"] == "score_test"]
    assert len(score) == 5 and all(r["jaccard_pooled"] == 1.0 and r["exchanges"] > 2 for r in score)
    for row in result["imputation"]:
        assert IMPUTE_KEYS <= set(row) and row["seconds"] > 0 and 0 < row["rmse"] < 2
    md = (tmp_path / "scale.md").read_text()
    assert "Where the election's bytes go at 10 sites × 100 features" in md and "`set_mask`" in md
    assert "## Goals" in md and "Jaccard" in md and "| label_skew | 0.1 | stouffer |" in md and "| label_skew | 0.1 | score_test |" in md
    assert (tmp_path / "scale.png").stat().st_size > 10_000
    # the pooled ANOVA from per-class sums is the pooled selector's own test: full agreement
    anova = [r["pooled_anova"] for r in result["noniid"] if "pooled_anova" in r]
    assert len(anova) == 5 and all(a["jaccard_pooled"] == 1.0 for a in anova)
    # --sections reruns one study and keeps the others from the existing file
    assert scale.main(["--quick", "--sections", "imputation", "--out", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "scale.json").read_text())
    assert again["election"] == result["election"] and again["noniid"] == result["noniid"]
    assert len(again["imputation"]) == len(result["imputation"])


def test_partitions_give_every_site_rows_and_keep_every_row_once():
    import numpy as np

    from benchmarks import scale

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 500)
    for alpha in (float("inf"), 1.0, 0.1):
        parts = scale.label_skew(y, 30, alpha, np.random.default_rng(1))
        assert min(len(p) for p in parts) >= scale.MIN_ROWS
        assert sorted(np.concatenate(parts).tolist()) == list(range(1000))
    sizes = scale.lognormal_sizes(30, 1000, rng, sigma=1.5)
    assert sizes.sum() == 1000 and sizes.min() >= scale.MIN_ROWS and sizes.max() > 5 * sizes.min()
    parts = scale.covariate_shift(rng.normal(size=(1000, 5)), 10, rng)
    assert sorted(np.concatenate(parts).tolist()) == list(range(1000))


def test_the_election_row_breaks_its_bytes_down_by_kind_and_direction():
    from benchmarks import scale

    election, _ = scale.grid_point(3, 300, 2)
    by_kind = election["bytes_by_kind"]
    assert set(by_kind) == {"ballot", "set_mask"}
    total = sum(v["down"] + v["up"] for v in by_kind.values())
    assert abs(total - election["bytes_per_site"]) < 1e-6 * total
    # the ballot reply carries 300 float64 scores, packed losslessly but still most of its 2.4 kB
    assert by_kind["ballot"]["up"] > by_kind["ballot"]["down"] and by_kind["ballot"]["up"] > 2_000
