"""The first Newton iteration asked ahead (riding on an earlier exchange over a reference
standardisation) saves one exchange, gives the same iterates when no cell is missing, and never
moves the fit away from the pooled maximum-likelihood fit: not with missing cells, not with an absurd
reference, not when asked for another setup; a hostile site in it is named (issue 31)."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from fedtab.federation.protocol import FederationError, set_options
from fedtab.federation.protocol.agreement import agree_schema
from fedtab.federation.workflows.training import run_training
from fedtab.federation.workflows.training.ahead import reference_standardisation, ride_first_newton
from tests.builders import lie_in_newton_hessians, classification_parts, federation

L2 = 1e-3


def _fed(missing=0.0, seed=0, **options):
    table, parts = classification_parts(600, 6, 4, 1, seed=seed)
    feats = [c for c in table.columns if c != "target"]
    if missing:
        rng = np.random.default_rng(seed + 1)
        for p in parts:
            cells = rng.random((len(p), len(feats))) < missing
            p[feats] = p[feats].mask(cells)
    fed = federation(parts, **options)
    agree_schema(fed)
    return fed, feats


def _pooled_fit(fed):
    X, y = zip(*(s.state["train_setup"]["_cache"]["train"] for s in fed._sites.values()))
    X, y = np.vstack(X), np.concatenate(y)
    return LogisticRegression(C=1 / (L2 * len(y)), tol=1e-12, max_iter=10_000).fit(X, y)


def _diff(out, sk):
    return max(np.abs(out.params["coef"] - sk.coef_).max(), np.abs(out.params["intercept"] - sk.intercept_).max())


def _run(missing=0.0, reference=None, features=None, **options):
    """``(outcome, exchanges of run_training, federation, holder)``: the run with the first iteration asked
    ahead (riding on the training's describe exchange) over ``reference`` ``(mean, std)``; without
    ``reference`` no iteration is asked ahead."""
    fed, feats = _fed(missing, **options)
    held = None
    if reference is not None:
        asked = features or feats
        mean, std = reference(len(asked))
        held = ride_first_newton(fed, asked, list(fed.schema.classes), "logistic", mean=mean, std=std)
    n0 = fed.exchange_count
    out = run_training(fed, feats, rounds=25, ahead=held)
    return out, fed.exchange_count - n0, fed, held


def _near(d):
    return np.full(d, 0.1), np.full(d, 1.3)


def test_the_first_iteration_asked_ahead_saves_an_exchange_and_keeps_every_iterate():
    base, n_base, fed0, _ = _run()
    out, n, fed, held = _run(reference=_near)
    assert held is not None and held.sums is not None  # answered on the describe exchange
    assert n == n_base - 1 and out.rounds == base.rounds  # the same iterations, one exchange fewer
    np.testing.assert_allclose(out.steps, base.steps, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(out.params["coef"], base.params["coef"], atol=1e-10)
    assert _diff(out, _pooled_fit(fed)) < 1e-6
    # the sites train and were evaluated on the pooled standardisation, not the reference one
    np.testing.assert_allclose(fed.site("s0").state["train_setup"]["mean"], out.mean)
    assert out.metrics["pooled"] == base.metrics["pooled"]


@pytest.mark.parametrize("reference", [
    _near,
    lambda d: (np.full(d, 1e4), np.full(d, 1e-4)),  # absurd: far from every value, a tiny scale
    lambda d: (np.zeros(d), np.ones(d)),  # the raw columns
])
def test_with_missing_cells_any_reference_still_reaches_the_pooled_fit(reference):
    """Missing cells make the rewritten first iteration approximate (a missing cell stands for the
    reference mean there): later iterations correct it, or the run falls back to the start."""
    base, n_base, _, _ = _run(missing=0.2)
    out, n, fed, held = _run(missing=0.2, reference=reference)
    assert held.sums is not None
    assert _diff(out, _pooled_fit(fed)) < 1e-6 and out.steps[-1] < 1e-4
    assert n <= n_base + 1  # at worst the fall-back's one exchange more


def test_an_iterate_asked_for_another_setup_is_not_used():
    base, n_base, _, _ = _run()
    out, n, fed, held = _run(reference=_near, features=["f0", "f1"])  # asked over two columns only
    assert held.sums is not None and n == n_base  # answered, ignored: the run makes its first iteration itself
    np.testing.assert_allclose(out.params["coef"], base.params["coef"], atol=1e-10)
    assert _diff(out, _pooled_fit(fed)) < 1e-6


def test_a_secure_run_asks_nothing_ahead():
    fed, feats = _fed()
    set_options(fed, secure_aggregation=True)
    assert ride_first_newton(fed, feats, list(fed.schema.classes), "logistic", mean=np.zeros(6),
                             std=np.ones(6)) is None
    assert ride_first_newton(_fed()[0], feats, ["0", "1"], {"name": "logistic", "params": {"solver": "fedavg"}},
                             mean=np.zeros(6), std=np.ones(6)) is None


def test_a_hostile_site_in_the_iteration_asked_ahead_is_named():
    fed, feats = _fed()
    lie_in_newton_hessians(fed.site("s1"), 1e6)
    mean, std = _near(len(feats))
    ride_first_newton(fed, feats, list(fed.schema.classes), "logistic", mean=mean, std=std)
    with pytest.raises(FederationError, match="s1"):
        run_training(fed, feats, rounds=25)


def test_the_reference_standardisation_uses_only_sound_scales():
    mean, std = reference_standardisation(["a", "b", "c", "d"], {"a": (2.0, 3.0), "b": (1.0, 0.0),
                                                                  "c": (np.nan, 1.0)})
    np.testing.assert_array_equal(mean, [2.0, 0.0, 0.0, 0.0])
    np.testing.assert_array_equal(std, [3.0, 1.0, 1.0, 1.0])


def test_a_first_iterate_worse_than_the_start_falls_back_to_the_start():
    """An absurd reference with missing cells: the step from the first iterate is longer than the step
    that led to it, so the run goes back to the start point and repeats the run without anything asked
    ahead from there (one exchange more than it, the pooled fit all the same)."""
    absurd = lambda d: (np.full(d, 1e4), np.full(d, 1e-4))  # noqa: E731
    base, n_base, _, _ = _run(missing=0.2)
    out, n, fed, _ = _run(missing=0.2, reference=absurd)
    assert out.steps[1] > out.steps[0] and n == n_base + 1
    np.testing.assert_allclose(out.steps[2:], base.steps, rtol=1e-6, atol=1e-12)
    assert _diff(out, _pooled_fit(fed)) < 1e-6
