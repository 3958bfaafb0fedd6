"""`python -m benchmarks.privacy --quick` runs and writes the issue's JSON schema and a goals table."""

import json
import math

import pytest

pytestmark = pytest.mark.requires("dp_accounting", "torch")

DP_KEYS = {"task", "dataset", "epsilon", "delta", "metric", "value"}
STEP_KEYS = {"step", "mode", "dataset", "epsilon", "seconds", "bytes", "exchanges", "metric", "value", "kinds", "note"}
SECURE_KEYS = {"task", "dataset", "seconds_plain", "seconds_secure", "bytes_plain", "bytes_secure", "max_rel_diff"}


@pytest.mark.slow
def test_quick_run_writes_results(tmp_path):
    from benchmarks import privacy  # imported here: collection stays fast

    privacy.main(["--quick", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "privacy.json").read_text())
    assert set(doc) == {"dp", "secure_aggregation", "steps"}
    assert all(set(r) == DP_KEYS for r in doc["dp"]) and all(set(r) == SECURE_KEYS for r in doc["secure_aggregation"])
    rows = {(r["task"], r["metric"], r["epsilon"]): r["value"] for r in doc["dp"]}
    for task, metric in (("election", "f1"), ("election", "signal_kept"), ("training", "f1"),
                         ("imputation", "rmse"), ("imputation", "rmse_prior_only")):
        assert {(task, metric, 8.0), (task, metric, None)} <= set(rows), (task, metric)
    assert all(math.isfinite(v) for v in rows.values())
    # DP imputation is calibrated per row: not the destroyed model (RMSE ~1e4) of whole-update noise
    assert rows[("imputation", "rmse", 8.0)] < 5 * rows[("imputation", "rmse", None)]
    for r in doc["secure_aggregation"]:
        assert r["max_rel_diff"] < 1e-6, r  # the secure sums reproduce the plain run
        assert r["bytes_secure"] > r["bytes_plain"] > 0 and r["seconds_plain"] > 0
    assert {r["task"] for r in doc["secure_aggregation"]} == {"election+training", "imputation"}
    # per step and mode: the guarantee (from the declarations of the kinds sent) and the measured cost
    steps = {(r["step"], r["mode"]): r for r in doc["steps"]}
    assert all(set(r) == STEP_KEYS for r in doc["steps"])
    assert set(steps) == {(s, m) for s in ("election", "training", "training_fedavg", "imputation", "selection")
                          for m in ("plain", "secure", "dp")} | {
        ("gbdt", m) for m in ("plain", "plain_opt_in", "plain_bounds", "secure", "dp", "dp_sketch")}
    refused = {("gbdt", "plain"), ("selection", "secure"), ("selection", "dp")}
    for key, r in steps.items():
        if key in refused:  # the default policy refuses plain tree nodes; selection runs plain only
            assert r["value"] is None and r["metric"] == "refused" and r["note"], r
            continue
        assert r["seconds"] > 0 and r["bytes"] > 0 and math.isfinite(r["value"]) and r["kinds"], r
    assert "allow_server_row_sets" in steps[("gbdt", "plain")]["note"]
    # GBDT's bin edges: the quantile sketch (plain, secure, DP sketch) or public bounds (no sketch)
    for m in ("plain_opt_in", "secure", "dp_sketch"):
        assert "gbdt_sketch" in steps[("gbdt", m)]["kinds"] and "gbdt_level" in steps[("gbdt", m)]["kinds"], m
    for m in ("plain_bounds", "dp"):
        assert "gbdt_sketch" not in steps[("gbdt", m)]["kinds"] and "gbdt_level" in steps[("gbdt", m)]["kinds"], m
    assert {"select_fit", "select_evaluate"} <= set(steps[("selection", "plain")]["kinds"])
    for s in ("election", "training", "training_fedavg"):
        assert steps[(s, "secure")]["exchanges"] > steps[(s, "plain")]["exchanges"] > 0  # masking costs exchanges
        assert steps[(s, "secure")]["bytes"] > steps[(s, "plain")]["bytes"]
        assert "secagg_keys" in steps[(s, "secure")]["kinds"] and "secagg_keys" not in steps[(s, "plain")]["kinds"]
    # the logistic default trains by Newton–Raphson; the FedAvg row pins solver = "fedavg"
    assert "newton" in steps[("training", "plain")]["kinds"] and "fit" not in steps[("training", "plain")]["kinds"]
    assert "fit" in steps[("training_fedavg", "plain")]["kinds"] and "ballot" in steps[("election", "plain")]["kinds"]
    md = (tmp_path / "privacy.md").read_text()
    assert "| step | mode | dataset | seconds | bytes | exchanges | utility | guarantee |" in md
    from fedtab.federation.protocol.kinds import KINDS
    from fedtab.report.guarantees import guarantee_of

    assert f"`fit`: {guarantee_of(KINDS['fit'])['secure']}" in md  # the guarantee is the declarations' text
    assert f"`newton`: {guarantee_of(KINDS['newton'])['secure']}" in md  # secure sums: Newton
    assert f"`fit`: {guarantee_of(KINDS['fit'])['dp']}" in md  # DP: logistic trains by FedAvg
    assert f"`ballot`: {guarantee_of(KINDS['ballot'])['dp']}" in md
    assert f"`gbdt_sketch`: {guarantee_of(KINDS['gbdt_sketch'])['dp']}" in md  # the DP sketch's guarantee
    assert f"`gbdt_level`: {guarantee_of(KINDS['gbdt_level'])['secure']}" in md
    assert "| gbdt | plain | seed_demo |" in md and "**refused**" in md
    assert "python -m benchmarks.privacy --quick" in md
    assert "| goal | measured | met |" in md and "secure aggregation ≤ 2× plain time" in md


def test_only_training_writes_the_dp_training_rows_by_fedavg(tmp_path):
    from benchmarks import privacy

    privacy.main(["--quick", "--only", "training", "--out", str(tmp_path)])
    doc = json.loads((tmp_path / "privacy_training.json").read_text())
    assert {(r["task"], r["epsilon"]) for r in doc["dp"]} == {("training", 8.0), ("training", None)}
    steps = {(r["step"], r["mode"]): r for r in doc["steps"]}
    assert set(steps) == {(s, m) for s in ("training", "training_fedavg") for m in ("plain", "secure", "dp")}
    # the default logistic model: Newton with plain and secure sums, FedAvg (kind fit) under DP
    assert "newton" in steps[("training", "plain")]["kinds"] and "newton" in steps[("training", "secure")]["kinds"]
    assert "fit" in steps[("training", "dp")]["kinds"] and "newton" not in steps[("training", "dp")]["kinds"]
    assert "solver fedavg" in (tmp_path / "privacy_training.md").read_text()
