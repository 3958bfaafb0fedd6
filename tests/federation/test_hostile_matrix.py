"""Hostile-site matrix (issue 10, item 7): every protocol step x every garbage/poison attack.

Five sites, four honest (``honest-1`` ... ``honest-4``) and ``mallory``, whose replies to one
step are rewritten after its honest handler (:class:`fedtab.testing.HostileSite`), so the
wire format, the validators and the reducers all see the attack. A case passes when the
run either rejects mallory by name (an error naming it and no honest site) or keeps the
honest sites' results within 0.05 F1 / 15 % RMSE of the all-honest run — measured on the
honest sites' own held-out rows with the returned model, not on what the sites report
(plus, for the training workflow, the reported pooled F1). Garbage must be handled in both
modes; poison with ``robust=True``. ``test_poison_hurts_without_robust`` shows the
tolerances bite: the same poison without robust mode moves the result past them.
"""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

from fedtab.federation.protocol import set_options

from fedtab.data import classification_table, split_rows
from fedtab.data.impute_datasets import heterogeneous_split
from fedtab.engines.local import LocalFederation
from fedtab.federation import FederationError, Site, gather_ballots, run_election, run_training
from fedtab.federation.training_flow import label_key, site_matrix
from fedtab.learn.metrics import confusion, scores_from_confusion
from fedtab.learn.models import make_model
from fedtab.testing import GARBAGE, POISON, HostileSite

HONEST = [f"honest-{i}" for i in range(1, 5)]
HOSTILE = "mallory"
F1_TOL = 0.05
RMSE_TOL = 0.15
TRAINING_STEPS = ("ballot", "describe", "fit", "evaluate")
IMPUTE_STEPS = ("impute_stats", "impute_fit")
LASSO = {"name": "lasso", "params": {"C": 0.1}}


def _rejected(exc: BaseException) -> None:
    """A rejection must name mallory, and only mallory."""
    text = str(exc)
    assert HOSTILE in text, f"the error does not name the hostile site: {text[:300]}"
    assert "honest-" not in text, f"the error blames an honest site: {text[:300]}"


# ----------------------------------------------------------------------------- training
def _training_sites(step: str | None = None, attack: str | None = None) -> list[Site]:
    table = classification_table(1000, 24, 6, 4, seed=3)
    parts = split_rows(table, [0.2] * 5, stratify="target", seed=3)
    sites: list[Site] = []
    for name, part in zip(HONEST + [HOSTILE], parts):
        if name == HOSTILE and step is not None:
            sites.append(HostileSite(name, part, "target", step=step, attack=attack, selector=LASSO))
        else:
            sites.append(Site(name, part, "target", selector=LASSO))
    return sites


def _honest_f1(outcome, sites: list[Site]) -> float:
    """Weighted F1 of the returned model on the honest sites' test rows (ground truth)."""
    model = make_model(outcome.model)
    index = {c: i for i, c in enumerate(outcome.classes)}
    total = np.zeros((len(index), len(index)), dtype=np.int64)
    for site in sites:
        if site.name == HOSTILE:
            continue
        X, y_raw = site_matrix(site, outcome.features, "test")
        Z = (X - outcome.mean) / outcome.std
        Z[np.isnan(Z)] = 0.0
        total += confusion([index[label_key(v)] for v in y_raw], model.predict(outcome.params, Z), len(index))
    return scores_from_confusion(total)["weighted_f1"]


def _train(sites: list[Site], robust: bool, ballots=None) -> tuple[float, float]:
    fed = LocalFederation(sites)
    set_options(fed, robust=robust)
    run_election(fed, 0.5, ballots=ballots)
    outcome = run_training(fed, rounds=2, local_epochs=3)
    return _honest_f1(outcome, sites), outcome.pooled["weighted_f1"]


@pytest.fixture(scope="module")
def honest_ballots() -> list:
    """The honest ballots (every step but ``ballot`` reuses them: the selectors are the slow part)."""
    return gather_ballots(LocalFederation(_training_sites()))


@pytest.fixture(scope="module")
def training_baseline(honest_ballots) -> tuple[float, float]:
    return _train(_training_sites(), False, honest_ballots)


def _check_training(step: str, attack: str, robust: bool, baseline: tuple[float, float], ballots: list) -> None:
    try:
        honest, reported = _train(_training_sites(step, attack), robust, None if step == "ballot" else ballots)
    except (FederationError, ValueError) as exc:
        _rejected(exc)
        return
    assert abs(honest - baseline[0]) <= F1_TOL, f"honest sites' F1 {honest:.3f}, all-honest {baseline[0]:.3f}"
    assert abs(reported - baseline[1]) <= F1_TOL, f"reported pooled F1 {reported:.3f}, all-honest {baseline[1]:.3f}"


#: garbage that the decoder and validators must stop before any reducer runs: tried once (plain
#: mode); numeric garbage reaches the reducers and is tried in both modes.
WIRE_GARBAGE = ("deep_meta", "huge_shape", "huge_count")


def _garbage_cases(steps: tuple[str, ...]) -> list:
    cases = []
    for step in steps:
        for attack in GARBAGE:
            for robust in (False, True):
                if robust and attack in WIRE_GARBAGE:
                    continue
                cases.append(pytest.param(step, attack, robust, id=f"{step}-{attack}-{'robust' if robust else 'plain'}"))
    return cases


@pytest.mark.parametrize(("step", "attack", "robust"), _garbage_cases(TRAINING_STEPS))
def test_training_garbage(step: str, attack: str, robust: bool, training_baseline, honest_ballots) -> None:
    _check_training(step, attack, robust, training_baseline, honest_ballots)


@pytest.mark.parametrize("attack", POISON)
@pytest.mark.parametrize("step", TRAINING_STEPS)
def test_training_poison_robust(step: str, attack: str, training_baseline, honest_ballots) -> None:
    _check_training(step, attack, True, training_baseline, honest_ballots)


# ----------------------------------------------------------------------------- imputation
def _impute_data():
    """Five sites' tables (6 of 8 columns each) and held-out rows to score the honest sites on."""
    rng = np.random.default_rng(11)
    n, f = 900, 8
    z = rng.normal(size=(n, 2))
    x = z @ rng.normal(size=(2, f)) + 0.3 * rng.normal(size=(n, f))
    x = x * rng.uniform(1, 20, size=f) + rng.uniform(-50, 50, size=f)  # real units, not z-scores
    x[rng.random(x.shape) < 0.1] = np.nan
    cols = [f"c{i}" for i in range(f)]
    table = pd.DataFrame(x, columns=cols)
    split = heterogeneous_split(cols, n, n_sites=5, keep_fraction=0.75, seed=2)
    tables, held_out = {}, {}
    for name, rows, keep in zip(HONEST + [HOSTILE], split.rows, split.columns):
        k = int(0.8 * len(rows))
        tables[name] = table.iloc[rows[:k]][keep].reset_index(drop=True)
        held_out[name] = (table.iloc[rows[k:]].reset_index(drop=True), keep)
    return tables, held_out


_IMPUTE = dict(rounds=3, local_epochs=1, hidden_dim=8, n_layers=1, batch_size=32, max_steps_per_round=4,
               k_neighbors=4, seed=0)


def _impute(step: str | None, attack: str | None, robust: bool) -> float:
    """Original-units RMSE on the honest sites' held-out rows: 30 % of their own observed
    cells hidden, plus the columns they do not hold."""
    from fedtab.imputer import FederatedImputer

    tables, held_out = _impute_data()
    sites = [HostileSite(n, t, step=step, attack=attack, test_size=0.2) if n == HOSTILE and step is not None
             else Site(n, t, test_size=0.2) for n, t in tables.items()]
    imp = FederatedImputer(robust=robust, **_IMPUTE).fit_federation(LocalFederation(sites))
    se, count = 0.0, 0
    for name in HONEST:
        truth, keep = held_out[name]
        query = truth[keep]
        hide = query.notna().to_numpy() & (np.random.default_rng(5).random(query.shape) < 0.3)
        pred = imp.transform(query.mask(hide))[truth.columns].to_numpy()
        target = truth.to_numpy()
        scored = ~np.isnan(target) & ~np.isin(truth.columns, keep)[None, :]
        scored[:, np.isin(truth.columns, keep)] |= hide
        se += float(((pred - target)[scored] ** 2).sum())
        count += int(scored.sum())
    return float(np.sqrt(se / count))


@pytest.fixture(scope="module")
def impute_baseline() -> float:
    pytest.importorskip("torch")
    return _impute(None, None, robust=False)


def _check_impute(step: str, attack: str, robust: bool, baseline: float) -> None:
    try:
        rmse = _impute(step, attack, robust)
    except (FederationError, ValueError) as exc:
        _rejected(exc)
        return
    assert abs(rmse - baseline) <= RMSE_TOL * baseline, f"honest sites' RMSE {rmse:.4g}, all-honest {baseline:.4g}"


@pytest.mark.parametrize(("step", "attack", "robust"), _garbage_cases(IMPUTE_STEPS))
def test_impute_garbage(step: str, attack: str, robust: bool, impute_baseline) -> None:
    _check_impute(step, attack, robust, impute_baseline)


@pytest.mark.parametrize("attack", POISON)
@pytest.mark.parametrize("step", IMPUTE_STEPS)
def test_impute_poison_robust(step: str, attack: str, impute_baseline) -> None:
    _check_impute(step, attack, True, impute_baseline)


@pytest.mark.parametrize("step", ["fit", "evaluate", "impute_stats"])
def test_poison_hurts_without_robust(step: str, training_baseline, honest_ballots, request) -> None:
    """The tolerances bite: the strongest poison (10⁶× the rows, reversed) passes validation and,
    without robust mode, moves the result past them (so the robust cases above are not vacuous)."""
    if step == "impute_stats":
        baseline = request.getfixturevalue("impute_baseline")
        assert abs(_impute(step, "rows_reversed", False) - baseline) > RMSE_TOL * baseline
        return
    honest, reported = _train(_training_sites(step, "rows_reversed"), False, honest_ballots)
    assert abs(honest - training_baseline[0]) > F1_TOL or abs(reported - training_baseline[1]) > F1_TOL
