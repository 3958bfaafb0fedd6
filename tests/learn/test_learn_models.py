"""SGD and MLP by FedAvg, multiclass, communication accounting."""

import subprocess
import sys

import numpy as np
import pytest

from fedtab.federation import run_training
from fedtab.learn import MODELS, SGDClassifierModel, communication_report, make_model, param_reduction, round_cost, traffic_summary
from tests.builders import classification_parts, federation


def _fed(classes=3, seed=0, n=900, d=12):
    _, parts = classification_parts(n, d, 6, 2, seed=seed, n_classes=classes, class_sep=1.5)
    return federation(parts, seed=range(3))


def test_models_are_registered():
    assert {"logistic", "sgd", "gnb", "mlp"} <= set(MODELS)
    assert make_model({"name": "mlp", "params": {"hidden": [8]}}).hidden == [8]


@pytest.mark.parametrize("model,floor", [("sgd", 0.6), ({"name": "mlp", "params": {"hidden": [16]}}, 0.6), ("gnb", 0.6)])
def test_multiclass_training_beats_chance_by_far(model, floor):
    out = run_training(_fed(), model=model, rounds=5, local_epochs=2, eval_every=1)
    assert len(out.classes) == 3
    assert out.pooled["weighted_f1"] > floor  # chance is ~0.33
    assert set(out.per_site) == {"s0", "s1", "s2"}
    assert {"weighted_f1", "macro_f1", "accuracy"} <= set(out.history[-1])


def test_sgd_local_update_reduces_loss_and_l1_zeroes_coefficients():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 20))
    y = (X[:, 0] - X[:, 1] > 0).astype(int)
    m = SGDClassifierModel(lr=0.1)
    p = m.local_update(m.init(20, 2), X, y, epochs=5)
    assert (m.predict(p, X) == y).mean() > 0.9
    sparse = SGDClassifierModel(lr=0.1, l1=0.05).local_update(m.init(20, 2), X, y, epochs=5)
    assert (p["coef"] == 0).sum() == 0
    assert (sparse["coef"] == 0).sum() >= 5 and np.abs(sparse["coef"][0, :2]).min() > 0.3


def test_traffic_per_round_and_site_and_reduction():
    fed = _fed()
    out = run_training(fed, model="sgd", rounds=3, local_epochs=1)
    assert len(out.traffic) == 3 * 3
    assert {t["round"] for t in out.traffic} == {1, 2, 3}
    n = out.n_params
    assert all(t["params_down"] == n and t["params_up"] == n for t in out.traffic)
    summary = traffic_summary(out.traffic)
    assert summary["bytes_down"] == out.bytes_down and summary["bytes_up"] == out.bytes_up
    cost = round_cost("sgd", 12, 3)
    assert cost["params_up"] == n and cost["bytes_up"] == 8 * n
    # measured bytes = payload + a small JSON header
    assert 0 < out.traffic[0]["bytes_up"] - cost["bytes_up"] < 1000
    assert param_reduction("sgd", 100, 25, 2) == pytest.approx(1 - 26 / 101)
    assert param_reduction({"name": "mlp", "params": {"hidden": [10]}}, 100, 0, 2) == pytest.approx(1 - 32 / 1032)
    rep = communication_report("gnb", 100, 10, 2, rounds=10, n_sites=3)
    assert rep["rounds"] == 1 and rep["all"]["per_round_per_site"]["params_down"] == 0
    assert rep["byte_reduction"] == pytest.approx(1 - 42 / 402)


def test_mlp_fedavg_is_sample_weighted_and_float32():
    m = make_model({"name": "mlp", "params": {"hidden": [4]}})
    a, b = m.init(3, 2, seed=0), m.init(3, 2, seed=1)
    agg = m.aggregate([(a, 1), (b, 3)])
    exact = (a["0.weight"].astype(np.float64) + 3 * b["0.weight"].astype(np.float64)) / 4
    # averaged in float64, then cast: within half a float32 ulp of the exact mean
    np.testing.assert_allclose(agg["0.weight"], exact, rtol=np.finfo(np.float32).eps, atol=0)
    assert agg["0.weight"].dtype == np.float32


def test_import_fedtab_does_not_import_torch():
    code = ("import sys, fedtab, fedtab.learn, fedtab.election, fedtab.federation\n"
            "from fedtab.learn import MLPModel\nMLPModel().n_params(5, 2)\nassert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
