"""Logistic regression by federated Newton–Raphson: the pooled penalised maximum-likelihood fit
itself (scikit-learn's ``LogisticRegression`` on the pooled rows, ``C = 1/(l2·N)``), in few
exchanges, with plain or secure sums; a DP or robust run trains the logistic model by FedAvg and says so."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fedtab.federation import Message
from fedtab.federation.protocol import FederationError, set_options
from fedtab.federation.workflows.training import run_training
from fedtab.federation.workflows.training.steps import dp_plan, newton_request, newton_round
from fedtab.learn.models import LogisticRegressionModel
from fedtab.learn.newton import NEWTON_TOL, dp_logistic_sums, hessian_sensitivity, logistic_sums, newton_update
from fedtab.privacy.dp import DP_GD_STEPS_PER_EPOCH
from tests.builders import classification_parts, federation

L2 = 1e-3


def _fed(seed=0, **options):
    table, parts = classification_parts(600, 6, 4, 1, seed=seed)
    return federation(parts, **options), [c for c in table.columns if c != "target"]


def _pooled_fit(fed, l2=L2):
    """scikit-learn on every site's standardised training rows (as the sites hold them)."""
    X, y = zip(*(s.state["train_setup"]["_cache"]["train"] for s in fed._sites.values()))
    X, y = np.vstack(X), np.concatenate(y)
    return LogisticRegression(C=1 / (l2 * len(y)), tol=1e-12, max_iter=10_000).fit(X, y)


def _diff(out, sk):
    return max(np.abs(out.params["coef"] - sk.coef_).max(), np.abs(out.params["intercept"] - sk.intercept_).max())


def test_newton_reaches_the_pooled_maximum_likelihood_fit_in_few_exchanges():
    fed, feats = _fed()
    out = run_training(fed, feats, rounds=25)
    assert _diff(out, _pooled_fit(fed)) < 1e-6
    assert out.rounds <= 7 and out.steps[-1] < NEWTON_TOL and len(out.steps) == out.rounds
    kinds = [r.kind for r in fed.traffic.records if r.site == "s0"]
    assert kinds.count("newton") == out.rounds and "fit" not in kinds


def test_penalty_follows_the_model_and_fedavg_is_still_there():
    fed, feats = _fed()
    out = run_training(fed, feats, model={"name": "logistic", "params": {"l2": 0.05}}, rounds=25)
    assert _diff(out, _pooled_fit(fed, 0.05)) < 1e-6
    fed2, _ = _fed()
    fedavg = run_training(fed2, feats, model={"name": "logistic", "params": {"solver": "fedavg"}}, rounds=2,
                          local_epochs=2)
    kinds = [r.kind for r in fed2.traffic.records if r.site == "s0"]
    assert kinds.count("fit") == 2 and "newton" not in kinds
    assert _diff(fedavg, _pooled_fit(fed2)) > 1e-4  # FedAvg does not reach the pooled fit in 2 rounds


def test_multiclass_newton_matches_the_pooled_softmax_fit():
    table, parts = classification_parts(600, 5, 4, 0, seed=2, n_classes=3)
    fed = federation(parts)
    out = run_training(fed, [c for c in table.columns if c != "target"], rounds=25)
    sk = _pooled_fit(fed)
    np.testing.assert_allclose(out.params["coef"], sk.coef_, atol=1e-6)
    b = out.params["intercept"]  # the softmax's intercepts are fixed up to a common shift
    np.testing.assert_allclose(b - b.mean(), sk.intercept_ - sk.intercept_.mean(), atol=1e-6)


def test_secure_sums_give_the_same_model():
    fed, feats = _fed()
    plain = run_training(fed, feats, rounds=25)
    fed2, _ = _fed()
    set_options(fed2, secure_aggregation=True)
    secure = run_training(fed2, feats, rounds=25)
    assert _diff(secure, _pooled_fit(fed2)) < 1e-6
    for k in plain.params:
        np.testing.assert_allclose(secure.params[k], plain.params[k], atol=1e-6)
    assert secure.per_site == {}
    assert secure.solver == plain.solver == "newton" and secure.solver_reason is None
    assert "newton" in _kinds(fed2) and "fit" not in _kinds(fed2)


def _kinds(fed):
    return {r.kind for r in fed.traffic.records}


def test_dp_run_trains_logistic_by_fedavg_and_says_so():
    """Newton declares plain and secure only: under DP the logistic model trains by DP gradient descent
    (kind ``fit``), its accountant pays FedAvg's releases, and the outcome says which solver ran and why."""
    fed, feats = _fed()
    set_options(fed, dp={"epsilon": 4.0, "bounds": [-6, 6]})
    out = run_training(fed, feats, rounds=2, local_epochs=1)
    assert "fit" in _kinds(fed) and "newton" not in _kinds(fed)
    assert out.solver == "fedavg" and out.model_spec["params"]["solver"] == "fedavg"
    assert out.solver_reason is not None and "dp mode" in out.solver_reason and "robust" not in out.solver_reason
    assert out.privacy is not None and 0 < out.privacy["epsilon"] <= 4.0 + 1e-9
    assert out.privacy["releases"]["training.fit"] == 2 * DP_GD_STEPS_PER_EPOCH
    assert out.steps == [] and all(np.isfinite(v).all() for v in out.params.values())


def test_the_dp_plan_of_a_newton_logistic_model_is_fedavgs():
    newton, fedavg = LogisticRegressionModel(), LogisticRegressionModel(solver="fedavg")
    assert dp_plan(newton, 4, 2, 0, False) == dp_plan(fedavg, 4, 2, 0, False)
    assert dp_plan(newton, 4, 2, 0, False)[0]["training.fit"] == 4 * 2 * DP_GD_STEPS_PER_EPOCH


def test_the_newton_step_refuses_a_mode_it_did_not_declare():
    for options in ({"robust": True}, {"dp": {"epsilon": 1.0, "bounds": [-6, 6]}}):
        fed, feats = _fed()
        set_options(fed, **options)
        mode = "robust" if "robust" in options else "dp"
        with pytest.raises(ValueError, match=f"{mode} is not available for federated Newton-Raphson"):
            newton_round(fed, newton_request(np.zeros((1, len(feats) + 1)), round_=1, setup=None,
                                             mean=np.zeros(len(feats)), std=np.ones(len(feats))), 1, len(feats),
                         "train", round_=1)
        assert fed.traffic.records == []  # refused before anything is sent


def test_dp_sums_are_clipped_to_their_sensitivity():
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(50, 3)) * 10, rng.integers(0, 2, 50)
    theta = rng.normal(size=(1, 4))
    for i in range(5):  # replace row i with a far-away row: the clipped sums move within Δ
        X2, y2 = X.copy(), y.copy()
        X2[i], y2[i] = 100.0, 1 - y[i]
        g1, h1 = dp_logistic_sums(theta, X, y, clip=1.0, radius=3.0)
        g2, h2 = dp_logistic_sums(theta, X2, y2, clip=1.0, radius=3.0)
        assert np.linalg.norm(g1 - g2) <= 2.0 + 1e-9
        assert np.linalg.norm(h1 - h2) <= hessian_sensitivity(1, 3.0) + 1e-9


def test_newton_update_solves_the_penalised_pooled_objective_from_split_sums():
    rng = np.random.default_rng(1)
    X, y = rng.normal(size=(200, 3)), rng.integers(0, 2, 200)
    theta = np.zeros((1, 4))
    for _ in range(20):
        sums = [logistic_sums(theta, X[p], y[p]) for p in np.array_split(np.arange(200), 3)]
        theta, step = newton_update(theta, sum(g for g, _ in sums), sum(h for _, h in sums), 200, 0.01)
    sk = LogisticRegression(C=1 / (0.01 * 200), tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(theta[0, :3], sk.coef_[0], atol=1e-8)
    with pytest.raises(ValueError, match="finite"):
        newton_update(theta, np.full(4, np.nan), np.eye(4), 200, 0.01)


def test_robust_run_trains_logistic_by_fedavg_and_says_so():
    """Under robust mode the logistic model trains by FedAvg with the coordinate-wise median: a site
    whose replies negate its parameters (×10) moves it little."""
    fed, feats = _fed()
    set_options(fed, robust=True)
    _Lying(fed.site("s2"), None, kind="fit")
    out = run_training(fed, feats, rounds=3, local_epochs=2)
    assert "fit" in _kinds(fed) and "newton" not in _kinds(fed)
    assert out.solver == "fedavg" and out.model_spec["params"]["solver"] == "fedavg" and out.robust
    assert out.solver_reason is not None and "robust mode" in out.solver_reason
    honest, _ = _fed()
    plain = run_training(honest, feats, rounds=25)
    assert plain.solver == "newton" and plain.solver_reason is None
    # the median of 3 sites' parameters, one of them negated: the sign of every clear coefficient holds
    big = np.abs(plain.params["coef"]) > 0.3
    assert big.any() and (np.sign(out.params["coef"][big]) == np.sign(plain.params["coef"][big])).all()


class _Lying:
    """Wraps a site's ``handle``: its replies of ``kind`` are tampered with by ``how(arrays, meta)``
    (``None``: every parameter negated and scaled ×10)."""

    def __init__(self, site, how, kind="newton"):
        self.site, self.how, self.kind, self.handle0 = site, how, kind, site.handle
        site.handle = self

    def __call__(self, request):
        reply = self.handle0(request)
        if request.kind != self.kind or reply.is_error:
            return reply
        arrays = {k: np.array(v, dtype=np.float64) for k, v in reply.arrays.items()}
        meta = dict(reply.meta)
        (self.how or _reversed)(arrays, meta)
        return Message(reply.kind, arrays, meta)


def _reversed(arrays, meta):
    for k in arrays:
        if k.startswith("param:"):
            arrays[k] = -10.0 * arrays[k]


@pytest.mark.parametrize("how", [
    lambda a, m: a.__setitem__("hess", a["hess"] + np.triu(np.ones_like(a["hess"]), 1)),  # not symmetric
    lambda a, m: a["hess"].__setitem__((-1, -1), 10 * m["n_samples"]),  # curvature beyond n/4
    lambda a, m: a["grad"].__setitem__(-1, 2.0 * m["n_samples"]),  # an intercept gradient beyond n
    lambda a, m: m.__setitem__("n_samples", m["n_samples"] + 50),  # rows it did not declare
    lambda a, m: a.__setitem__("grad", a["grad"][:-1]),  # wrong shape
    lambda a, m: a["grad"].__setitem__(0, np.inf),
])
def test_a_hostile_site_is_named_and_refused(how):
    fed, feats = _fed()
    _Lying(fed.site("s1"), how)
    with pytest.raises(FederationError, match="s1"):
        run_training(fed, feats, rounds=5)


def test_the_site_refuses_steep_or_misshapen_coefficients():
    fed, feats = _fed()
    run_training(fed, feats, rounds=1)
    d = len(feats)
    for coef in (np.full((1, d), 2e3), np.zeros((2, d))):
        reply = fed.ask({"s0": Message("newton", {"param:coef": coef, "param:intercept": np.zeros(coef.shape[0])},
                                       {"round": 2})})["s0"]
        assert reply.is_error


@pytest.mark.parametrize("limit,solver", [(7, "newton"), (6, "fedavg")])
def test_a_logistic_model_wider_than_the_newton_limit_trains_by_fedavg_and_says_so(monkeypatch, limit, solver):
    """6 features and 2 classes: 7 coefficients. At a limit of 7 Newton–Raphson; at 6 FedAvg (a Newton
    round would carry 7² Hessian sums per site), and the model spec records the solver that ran."""
    import fedtab.federation.workflows.training.server as server

    monkeypatch.setattr(server, "NEWTON_MAX_PARAMS", limit)
    fed, feats = _fed()
    out = run_training(fed, feats, rounds=3, local_epochs=1)
    kinds = [r.kind for r in fed.traffic.records if r.site == "s0"]
    assert ("newton" in kinds, "fit" in kinds) == (solver == "newton", solver == "fedavg")
    assert out.model_spec["params"]["solver"] == solver
