"""Per-site personalisation of a logistic model (fedtab.learn.personalise): pure numpy."""

import numpy as np
import pytest

from fedtab.learn.models import LogisticRegressionModel
from fedtab.learn.personalise import (check_mode, log_loss_sum, mode_order, personalise, personalised_predict,
                                      personalised_proba)


def _data(shift=1.5, scale=2.0, n=400, seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(n, 3))
    z = scale * (Z @ np.array([1.0, -0.5, 0.0])) + shift
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(int)
    return Z, y, {"coef": np.array([[1.0, -0.5, 0.0]]), "intercept": np.zeros(1)}


def test_intercept_and_calibration_recover_the_site_shift_and_scale():
    Z, y, params = _data()
    shift = personalise("intercept", params, Z, y)["shift"][0]
    cal = personalise("calibration", params, Z, y)
    # the true shift 1.5 and scale 2 (an intercept alone absorbs less of the shift when the scale is off)
    assert 0.8 < shift < 2.2 and 1.2 < cal["scale"][0] < 2.6 and 1.0 < cal["shift"][0] < 2.2
    base = log_loss_sum(y, personalised_proba("none", params, None, Z))
    assert log_loss_sum(y, personalised_proba("calibration", params, cal, Z)) < base


def test_finetune_stays_near_the_federated_model_and_local_ignores_it():
    Z, y, params = _data()
    tight = personalise("finetune:1000", params, Z, y, epochs=50)
    np.testing.assert_allclose(tight["coef"], params["coef"], atol=0.02)
    loose = personalise("finetune:0.001", params, Z, y, epochs=50)
    local = personalise("local", params, Z, y, epochs=50)
    ref = LogisticRegressionModel().local_update({"coef": np.zeros((1, 3)), "intercept": np.zeros(1)}, Z, y, epochs=50)
    np.testing.assert_allclose(local["coef"], ref["coef"])
    assert np.abs(loose["coef"] - local["coef"]).max() < 0.2


def test_modes_and_prediction_contract():
    assert check_mode("finetune:0.1") == "finetune:0.1"
    for bad in ("finetune", "finetune:-1", "finetune:x", "bogus", 3):
        with pytest.raises(ValueError):
            check_mode(bad)
    assert mode_order("none") < mode_order("intercept") < mode_order("calibration") < mode_order("finetune:1") \
        < mode_order("finetune:0.1") < mode_order("local")
    model = {"features": ["a", "b"], "classes": ["0", "1"], "mean": [1.0, 0.0], "std": [2.0, 1.0],
             "params": {"coef": [[1.0, 0.0]], "intercept": [0.0]},
             "personalisation": {"mode": "intercept", "sites": {"x": {"shift": [3.0]}}}}
    X = np.array([[1.0, np.nan], [3.0, 5.0]])
    p = personalised_predict(model, X)
    np.testing.assert_allclose(p[:, 1], 1 / (1 + np.exp(-np.array([0.0, 1.0]))))
    np.testing.assert_allclose(personalised_predict(model, X, "x")[:, 1], 1 / (1 + np.exp(-np.array([3.0, 4.0]))))
    with pytest.raises(ValueError, match="no personalisation"):
        personalised_predict(model, X, "y")
    with pytest.raises(ValueError, match="over the model's features"):
        personalised_predict(model, X[:, :1], "x")
