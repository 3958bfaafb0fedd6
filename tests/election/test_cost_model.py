"""The selectors' cost model against counted operations (issue 28, item 5; no timing here:
``python -m benchmarks.cost_model`` compares the estimates with measured CPU time).

The Markov-blanket estimate was ~100× low: it priced one group test per feature and no fixed
costs. Its :meth:`operation_counts` now bound what :meth:`select` really runs — counted here
by instrumenting the fits and predictions of real runs — and the work scales with each count.
"""

import numpy as np
import pytest
from sklearn.datasets import make_classification

from fedtab.election.markov_blanket import MarkovBlanketSelector
from fedtab.election.selectors import make_selector, selector_cost
from fedtab.learn.models import STEP_OVERHEAD


def _instrumented(sel: MarkovBlanketSelector, X: np.ndarray, y: np.ndarray) -> dict[str, int]:
    """Run ``sel.select`` counting fits, prediction calls and predicted rows."""
    counts = {"fits": 0, "calls": 0, "rows": 0}
    fit, losses = sel._fit, sel._row_losses

    def counting_fit(*args, **kw):
        counts["fits"] += 1
        return fit(*args, **kw)

    def counting_losses(est, Xp, *args, **kw):
        counts["calls"] += 1
        counts["rows"] += len(Xp)
        return losses(est, Xp, *args, **kw)

    sel._fit, sel._row_losses = counting_fit, counting_losses
    sel.select(X, y)
    return counts


@pytest.mark.parametrize("rounds", [1, 2, None])
def test_markov_blanket_counts_bound_what_select_runs(rounds):
    X, y = make_classification(240, 8, n_informative=3, n_redundant=2, random_state=0)
    sel = MarkovBlanketSelector(model="forest", n_trees=4, max_shrink_rounds=rounds, seed=0)
    ops = sel.operation_counts(*X.shape)
    got = _instrumented(sel, X, y)
    tests = 1 + sel.n_shrink_tests_
    assert sel.n_shrink_tests_ >= 1  # the data make the shrink round run
    assert got["fits"] == sel.n_splits * tests <= ops["fits"]
    base_rows = tests * len(y)  # each test predicts its held-out rows once unpermuted
    assert got["rows"] - base_rows <= ops["predicted_rows"]
    assert got["calls"] - tests * sel.n_splits <= ops["tests"]
    if rounds == 1:  # the default: fits exact, the predictions within 3x of the bound
        assert got["fits"] == ops["fits"]
        assert ops["predicted_rows"] <= 3 * max(got["rows"] - base_rows, 1) * 3


def test_markov_blanket_work_scales_with_its_counts():
    base = MarkovBlanketSelector()
    w = base.cost(2000, 40).work
    # the folds multiply the fits and tests (not the predicted rows: each fold holds its share)
    ops, ops10 = base.operation_counts(2000, 40), MarkovBlanketSelector(n_splits=10).operation_counts(2000, 40)
    assert ops10["fits"] == 2 * ops["fits"] and ops10["tests"] == 2 * ops["tests"]
    assert ops10["predicted_rows"] == ops["predicted_rows"]
    assert w < MarkovBlanketSelector(n_splits=10).cost(2000, 40).work < 2 * w
    assert w < MarkovBlanketSelector(n_repeats=2).cost(2000, 40).work < 2 * w
    assert MarkovBlanketSelector(max_rows=1000).cost(2000, 40).work < w
    assert base.cost(10**6, 40).work == base.cost(5000, 40).work  # max_rows caps the rows used
    assert 1.5 * w < MarkovBlanketSelector(n_trees=60).cost(2000, 40).work < 2.1 * w
    # rows: at most rows·log rows (the fixed costs do not grow); features: a group test per
    # feature and per shrink round up to 3 per feature, each over every row
    w2 = base.cost(4000, 40).work
    assert w < w2 < 2.5 * w
    assert base.cost(2000, 80).work > w
    wide = base.operation_counts(2000, 80)
    assert wide["predicted_rows"] == 2 * ops["predicted_rows"] and wide["tests"] > 1.9 * ops["tests"]
    # every shrink round a fold's fits again, up to one per feature
    assert MarkovBlanketSelector(max_shrink_rounds=None).cost(2000, 40).work > 10 * w
    # the fixed costs: a tiny table still costs the fits' and tests' overheads
    tiny = base.operation_counts(30, 3)
    assert base.cost(30, 3).work >= tiny["fits"] * 30 * STEP_OVERHEAD


def test_the_linear_and_boosting_estimates_count_their_fixed_costs():
    """Small tables are overhead-bound (a scikit-learn logistic fit ~10 ms, a boosting
    iteration ~0.5 ms on 303 rows): the estimate no longer prices them as a few passes."""
    lin = MarkovBlanketSelector(model="linear")
    ops = lin.operation_counts(303, 13)
    assert lin.cost(303, 13).work >= ops["fits"] * 10 * STEP_OVERHEAD
    boost = MarkovBlanketSelector(model="boosting")
    assert boost.cost(303, 13).work >= boost.operation_counts(303, 13)["fits"] * 100 * STEP_OVERHEAD / 2


def test_selector_costs_scale_with_rows_and_features():
    for spec in ("lasso", "elastic_net", "lasso_cv", "mutual_info", "anova", "random_forest", "markov_blanket"):
        small, rows2, cols2 = (selector_cost(spec, n, d).work for n, d in ((1000, 10), (2000, 10), (1000, 20)))
        assert small < rows2 and small < cols2, spec
        assert rows2 <= 4 * small and cols2 <= 8 * small, spec
    assert make_selector("lasso_cv").cost(1000, 10).work < make_selector({"name": "lasso_cv", "params": {
        "cv": 6}}).cost(1000, 10).work
