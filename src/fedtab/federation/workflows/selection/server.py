"""Honest model selection as one federated workflow (issue 22): federated K-fold
cross-validation by pooled log-loss, a one-standard-error choice of the columns and of the
personalisation, a refit on all training rows, leave-one-site-out contributions.

Exchanges (``R`` = rounds; every candidate, fold, personalisation and left-out site rides
in the same exchanges): ``select_prepare`` (1: fold ballots, moments, measured counts; it
also agrees the schema when it is the run's first), ``select_fit`` (``R`` FedAvg rounds: the chains train by FedAvg even when the logistic model's
default solver is Newton–Raphson — a Newton round would carry each chain's Hessian — and the
model's spec records ``solver = "fedavg"``), the
cross-validation ``select_evaluate`` (1) and the test ``select_evaluate`` (1) — ``R + 3``
in all, counted in :attr:`SelectionOutcome.exchanges`.

The folds are each site's own ``fold:k`` parts (:mod:`fedtab.federation.site.parts`, drawn from
the site's seed); the server only names them. Fold ``k`` of the federation is every site's
``fold:k``; a site with fewer folds trains fold ``k``'s models on all its training rows and
scores none of them. Scores are pooled by sums (a log-loss sum, a confusion matrix, score
histograms and exact within-site rank pairs per fold): no row or prediction leaves a site.

The choice (:func:`fedtab.election.one_se.one_standard_error`): each candidate's score is
the pooled cross-validated log-loss (all folds' rows), its standard error the spread of the
per-fold pooled log-losses over ``sqrt(K)``; the chosen columns are the fewest whose score is
within one standard error of the best candidate's (the standard error of the paired fold
differences to it) and whose pooled CV AUROC is within 0.01 of the best candidate's AUROC
(:func:`~fedtab.election.one_se.guarded_one_standard_error`: the candidates it passes over are
reported); then, for those columns, the chosen
personalisation is the simplest mode within one standard error of the best mode. The final
model is the chosen candidate's refit on every site's training rows (scikit-learn's refit
convention); its metrics come from the sites' test rows, which nothing above has seen.

Abstentions, not failures (issue 30): a site votes only on the columns it measures in the fit
rows of every fold; it casts no ballot on a part with one class; a site without folds (too few
rows for folds above its ``min_rows``) trains every chain on its training rows and scores no
fold; a one-class site has no within-site AUROC; a site without test rows is in no test score.
Each is named in :attr:`SelectionOutcome.abstentions`. Only a failing or refusing site stops
the run — or, with a quorum (``min_sites``), is dropped, named too, until too few remain.

Plain sums only: secure aggregation, DP and robust reducers are not implemented for this
workflow yet (it raises ``ValueError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from fedtab.election.ballot import Ballot
from fedtab.election.one_se import AUROC_TOLERANCE, Scored, guarded_one_standard_error, one_standard_error
from fedtab.learn.metrics import SCORE_BINS
from fedtab.learn.models import LinearRegressionModel, LogisticRegressionModel, make_model
from fedtab.learn.personalise import check_mode, mode_order
from fedtab.federation.protocol import validate
from fedtab.federation.protocol import Federation
from fedtab.federation.protocol.modes import declare_modes, run_strategy
from fedtab.federation.workflows.selection.plan import Candidate, Plan, build_plan
from fedtab.federation.workflows.selection.steps import (Chains, Prepared, candidates, cv_summary, evaluate, per_site_cv, prepare,
                                                          test_metrics, train)

#: the modes model selection supports: none (its sums travel in the clear, reduced plainly)
SELECTION_MODES = declare_modes("selection")

__all__ = ["SelectionOutcome", "SelectionOptions", "select_model", "selection_options", "DEFAULT_FD_GRID", "DEFAULT_MODES"]

#: freedom degrees whose elections are candidates (besides all columns)
DEFAULT_FD_GRID = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 11))
#: personalisation modes the cross-validation compares (simplest first)
DEFAULT_MODES = ("none", "intercept", "calibration", "finetune:1", "finetune:0.1", "local")


@dataclass
class SelectionOutcome:
    """What :func:`select_model` returns (JSON-able through :meth:`to_dict`, except ``ballots``).

    Attributes:
        features: the chosen columns (the refit mask); freedom_degree: the chosen fd
            (``None`` when "all columns" won); personalisation: the chosen mode.
        chosen / all_columns / best_fd: ``{name, freedom_degree, kept, features, logloss,
            logloss_se, auroc, auroc_se, fold_logloss}`` of the chosen candidate, of all
            columns and of the best-scoring election (lowest log-loss).
        candidates: the same for every candidate, in order of kept columns.
        rule: the one-standard-error rule's outcome for the columns and for the personalisation.
        modes: per personalisation mode of the chosen columns, its cross-validated scores and,
            per site, its cross-validated log-loss and AUROC (``per_site``).
        test: the refit models on the sites' test rows: ``{"rows": "test", "trained_on":
            "train", "modes": {mode: {"pooled", "per_site"}}, "all_columns": {...}}`` with every
            metric of :func:`~fedtab.learn.metrics.evaluation_scores` plus ``logloss``.
        model: the personalised model (:data:`fedtab.learn.personalise.PersonalisedModel`);
            model_all_columns: the all-columns refit (no personalisation), the no-election reference.
        measured: per site ``{"missing_share", "imputed_share"}`` per column (training rows),
            ``must_impute`` (kept columns it never measures) and ``partly_imputed`` (kept
            columns with some cells it did not measure).
        loso: per site, the chosen columns' pooled CV ``{"logloss", "auroc"}`` when trained
            without it (``{}`` unless ``contributions``); see :func:`site_contributions`.
        exchanges: ``{"total", "steps": {step: n}}`` exchanges this workflow made (``total``
            from :attr:`Federation.exchange_count`: every message round, including a secure
            sum's; ``steps`` from the participation record), with the bytes the engine measured.
        ballots: per site the train-rows ballot (``None`` if it abstained).
        n_folds: the federation's folds ``K``; rounds / local_epochs: the FedAvg settings.
        abstentions: per site, what it abstained from and why (sentences naming the folds,
            columns or stage; :func:`_abstentions`), and the sites the quorum dropped.
        task: ``"classes"`` or ``"regression"`` (a linear model: ``chosen`` / ``candidates`` hold
            ``mse, rmse, fold_mse, rmse_se, mae, r2`` instead of the log-loss and AUROC, ``rule``
            an ``rmse_guard``; ``modes`` is empty, ``test["modes"]`` holds ``"none"`` only).
    """

    features: list[str]
    freedom_degree: float | None
    personalisation: str
    chosen: dict[str, Any]
    all_columns: dict[str, Any]
    best_fd: dict[str, Any] | None
    candidates: list[dict[str, Any]]
    rule: dict[str, Any]
    modes: dict[str, Any]
    test: dict[str, Any]
    model: dict[str, Any]
    measured: dict[str, Any]
    loso: dict[str, dict[str, float | None]] = field(default_factory=dict)
    exchanges: dict[str, Any] = field(default_factory=dict)
    ballots: dict[str, Ballot | None] = field(default_factory=dict)
    n_folds: int = 0
    rounds: int = 0
    local_epochs: int = 0
    election: dict[str, Any] = field(default_factory=dict)
    model_all_columns: dict[str, Any] = field(default_factory=dict)
    abstentions: dict[str, list[str]] = field(default_factory=dict)
    task: str = "classes"

    def to_dict(self) -> dict[str, Any]:
        """Everything but the ballots, JSON-able (arrays as lists)."""
        from dataclasses import asdict

        out = {k: v for k, v in asdict(self).items() if k != "ballots"}
        return _jsonable(out)

    def result_sections(self) -> dict[str, Any]:
        """What ``result.json`` reports of the selection (JSON-able), for the job to merge in:

        ``{"selection": {rule, chosen, all_columns, best_fd, candidates, personalisation, modes},
        "metrics_from": {"rows": "test", "trained_on": "train"}, "metrics": {mode: {"pooled",
        "per_site"}} and "all_columns" (the test rows), "local_only": {"pooled", "per_site"},
        "contributions": {site: ...} (empty without leave-one-site-out chains), "measured":
        {site: ...}, "exchanges": {...}}``.
        """
        from fedtab.federation.workflows.selection.contributions import site_contributions

        test = self.test
        return _jsonable({
            "selection": {"rule": self.rule, "freedom_degree": self.freedom_degree, "features": self.features,
                          "personalisation": self.personalisation, "chosen": self.chosen,
                          "all_columns": self.all_columns, "best_fd": self.best_fd, "candidates": self.candidates,
                          "modes": self.modes, "n_folds": self.n_folds, "abstentions": self.abstentions},
            "metrics_from": {"rows": test["rows"], "trained_on": test["trained_on"]},
            "metrics": test["modes"], "all_columns": test["all_columns"], "local_only": test["modes"].get("local"),
            "contributions": site_contributions(self) if self.loso else {},
            "measured": self.measured, "exchanges": self.exchanges,
        })


def _jsonable(value: Any) -> Any:
    """``value`` through JSON: numpy arrays become lists, numpy scalars numbers."""
    import json

    def plain(v: Any) -> Any:
        if isinstance(v, (np.ndarray, np.generic)):
            return v.tolist()
        raise TypeError(f"{type(v).__name__} is not JSON-able")

    return json.loads(json.dumps(value, default=plain))


# ----------------------------------------------------------------------------- the workflow
@dataclass(frozen=True)
class SelectionOptions:
    """The settings of :func:`select_model` (each as its ``Args`` describe; the defaults are
    its defaults). Checked when the selection runs, not here."""

    selector: Any = None
    model: Any = "logistic"
    rounds: int = 10
    local_epochs: int = 5
    grid: Sequence[float] = DEFAULT_FD_GRID
    modes: Sequence[str] = DEFAULT_MODES
    l2_grid: Sequence[float] | None = None
    contributions: bool = True
    paired: bool = True
    aggregation: str = "weighted"
    normalization: str = "all"
    min_holders: int | None = None
    personal_epochs: int = 50
    score_bins: int | None = 100
    test_bins: int | None = SCORE_BINS
    seed: int = 0
    max_param_abs: float = validate.MAX_PARAM_ABS
    score_test: bool = True

    @property
    def election(self) -> dict[str, Any]:
        """The election rule of every candidate: ``{aggregation, normalization, min_holders}``."""
        return {"aggregation": self.aggregation, "normalization": self.normalization, "min_holders": self.min_holders}


def selection_options(options: SelectionOptions | None, settings: Mapping[str, Any]) -> SelectionOptions:
    """``options``, or (``None``) the :class:`SelectionOptions` of the keywords ``settings``.

    Raises:
        TypeError: an unknown keyword (named as Python names it for ``select_model``), or
            ``options`` together with keywords.
    """
    known = {f.name for f in fields(SelectionOptions)}
    unknown = [k for k in settings if k not in known]
    if unknown:
        raise TypeError(f"select_model() got an unexpected keyword argument {unknown[0]!r}")
    if options is not None and settings:
        raise TypeError(f"select_model() got options= and the keyword(s) {', '.join(settings)}: give one or the other")
    return options if options is not None else SelectionOptions(**settings)


def select_model(federation: Federation, options: SelectionOptions | None = None, **settings: Any
                 ) -> SelectionOutcome:
    """Choose the columns and the personalisation by federated cross-validation, refit, and
    score the refit on the test rows (see the module docstring).

    The settings come as ``options`` (a :class:`SelectionOptions`) or by keyword, as below
    (:func:`selection_options`).

    Args:
        selector: the selector every site runs (``None``: each site's own).
        model: logistic regression (a name or ``{"name": "logistic", "params": {...}}``), or
            ``"linear"`` for a numeric target: the columns chosen by pooled CV squared error
            (:mod:`.regression`; no personalisation, no leave-one-site-out chains, ``rounds``,
            ``modes``, ``l2_grid`` and the bins unused).
        score_test: score the refit on the sites' test rows (a regression may leave that to the
            job's training step; the classification selection always does).
        rounds / local_epochs: FedAvg rounds (default 10) and local L-BFGS iterations (5) of every chain.
        grid: freedom degrees whose elections are candidates ("all columns" always is;
            default :data:`DEFAULT_FD_GRID`).
        modes: personalisation modes to compare (:mod:`fedtab.learn.personalise`; default
            :data:`DEFAULT_MODES`); ``"none"`` is always compared.
        l2_grid: L2 strengths of the logistic model to compare (``None``: the model's own);
            with several, every column candidate is trained with each; the strength of the
            best candidate (lowest CV log-loss) is kept and the one-SE rule compares the
            masks at that strength.
        contributions: also train every fold's chains without each site (leave-one-site-out)
            in the same exchanges, for :func:`site_contributions` (default ``True``).
        paired: the one-SE rule's standard error of the difference to the best candidate
            (default) or the best candidate's own (:func:`~fedtab.election.one_se.one_standard_error`).
        aggregation / normalization / min_holders: the election rule of every candidate.
        personal_epochs: L-BFGS iterations of a fine-tune or local model (default 50).
        score_bins: bins of the cross-validation's score histograms (its AUROC; every slot sends
            ``2 × score_bins`` values; default 100); ``None``: log-loss only. test_bins: the same
            for the test rows.
        seed: the chains' training seed; max_param_abs: the largest parameter a site may send.

    Raises:
        TypeError: an unknown keyword, or ``options`` together with keywords.
        ValueError: a model other than logistic or linear regression, unknown modes, a run with secure
            sums, DP or robust reducers, sites with fewer than 2 folds in all.
        FederationError: a site failed or replied something impossible (naming it).
    """
    opts = selection_options(options, settings)
    if isinstance(make_model(opts.model), LinearRegressionModel):
        return _select_regression(federation, opts)
    fm, modes, spec = _checked(federation, opts.model, opts.rounds, opts.local_epochs, opts.modes)
    dropped0 = set(federation.dropped)
    p0, x0, b0 = len(federation.participation), federation.exchange_count, federation.traffic.total()
    prep, K, schema = _folds(federation, opts.selector)
    classes = list(schema.classes)
    if len(classes) < 2:
        raise ValueError(f"selection needs at least 2 classes across the sites, found {classes}")
    election = opts.election
    l2_grid = sorted({float(x) for x in (opts.l2_grid if opts.l2_grid is not None else [fm.l2])})
    if not l2_grid or min(l2_grid) < 0:
        raise ValueError("l2_grid must hold non-negative L2 strengths")
    cands = candidates(prep, opts.grid, K, election, l2_grid)
    sites = list(prep.n_folds)
    plan = build_plan(prep.columns, cands, sites, loso=opts.contributions and len(sites) > 1)
    params, mean, std = train(federation, plan, prep, classes, spec, opts.rounds, opts.local_epochs, opts.seed,
                              opts.max_param_abs)
    chains = Chains(plan, prep, classes, params)
    personal = {"epochs": int(opts.personal_epochs)}

    # cross-validation: every candidate's fold chains in every mode, and the LOSO chains unpersonalised
    slot_of = _cv_slots(cands, modes)
    cv, _, _ = evaluate(federation, chains, list(slot_of), opts.score_bins, "cv", personal)
    cv_of = {key: cv[i] for key, i in slot_of.items()}
    cols = _choose_columns(plan, cands, cv_of, opts.paired)
    chosen, all_cand = cols.chosen, cols.all_columns
    mode_scores, mode_choice = _choose_mode(chosen, modes, cv_of, opts.paired)
    mode = mode_choice.chosen.name
    loso = {s: {k: v for k, v in _summary(cv_of, ch, "none").items() if k in ("logloss", "auroc")}
            for s, ch in chosen.loso_chains.items()}

    # the refit on all training rows, scored on the test rows (never seen above)
    test_out, personal_params = _test(federation, chains, opts.test_bins, personal, chosen, all_cand, mode)
    model_data = _model_data(plan, chosen.refit_chain, mean, std, params, classes, spec, mode, personal_params)
    all_model = _model_data(plan, all_cand.refit_chain, mean, std, params, classes, spec, "none", {})
    return SelectionOutcome(
        features=list(model_data["features"]), freedom_degree=chosen.freedom_degree, personalisation=mode,
        chosen=cols.chosen_d, all_columns=cols.all_d, best_fd=cols.best_fd, candidates=[d for d, _ in cols.scored],
        rule={"columns": {**cols.choice.to_dict(), "auroc_guard": cols.guard.to_dict()},
              "personalisation": mode_choice.to_dict(),
              "score": "pooled cross-validated log-loss (lower is better), paired fold differences; "
                       f"no candidate more than {AUROC_TOLERANCE:g} below the best pooled CV AUROC"},
        modes=mode_scores, test=test_out, model=model_data, model_all_columns=all_model,
        measured=_measured(prep, schema, model_data["features"]), loso=loso,
        exchanges=_exchanges(federation, p0, x0, b0),
        ballots={s: b[-1] for s, b in prep.ballots.items()}, n_folds=K, rounds=opts.rounds,
        local_epochs=opts.local_epochs,
        election={**election, "fd": chosen.freedom_degree, "columns": list(plan.features)},
        abstentions=_abstentions(federation, prep, cv_of, chosen, test_out, dropped0),
    )


# ----------------------------------------------------------------------------- its parts
def _folds(federation: Federation, selector: Any) -> tuple[Prepared, int, Any]:
    """``(prepared, K, schema)``: the sites' fold preparation (:func:`prepare`), the most folds a site
    holds and the agreed schema.

    Raises:
        ValueError: no site holds at least 2 folds.
    """
    prep = prepare(federation, selector)
    K = max(prep.n_folds.values())
    if K < 2:
        raise ValueError("cross-validation needs sites with at least 2 folds (each site's `folds` setting)")
    schema = federation.schema
    assert schema is not None
    return prep, K, schema


def _select_regression(federation: Federation, opts: SelectionOptions) -> SelectionOutcome:
    """:func:`select_model` for a numeric target (:func:`.regression.select_regression`): of
    ``opts`` it uses the selector, the model, the grid, ``paired``, the election rule,
    ``score_test`` and ``max_param_abs``."""
    from .regression import select_regression

    run_strategy(federation).check_supported(SELECTION_MODES, "model selection (it runs with plain sums only)")
    fm = make_model(opts.model)
    assert isinstance(fm, LinearRegressionModel)
    dropped0 = set(federation.dropped)
    p0, x0, b0 = len(federation.participation), federation.exchange_count, federation.traffic.total()
    prep, K, schema = _folds(federation, opts.selector)
    if list(schema.classes):
        raise ValueError(f"a linear regression selection needs a numeric target; the sites agree classes "
                         f"{list(schema.classes)[:5]}")
    election = opts.election
    r = select_regression(federation, prep, fm, grid=opts.grid, election=election, paired=opts.paired,
                          score_test=opts.score_test, max_param_abs=opts.max_param_abs)
    plan, chosen, all_cand = r["plan"], r["chosen_candidate"], r["all_candidate"]
    spec = {"name": fm.name, "params": fm.get_params()}
    model_data = _model_data(plan, chosen.refit_chain, r["mean"], r["std"], r["params"], [], spec, "none", {})
    all_model = _model_data(plan, all_cand.refit_chain, r["mean"], r["std"], r["params"], [], spec, "none", {})
    for m in (model_data, all_model):  # a linear model: coef (d,), intercept (1,)
        m["params"] = {"coef": m["params"]["coef"][0], "intercept": m["params"]["intercept"]}
    scored = [d for d, _ in r["scored"]]
    elected = [d for d in scored if d["freedom_degree"] is not None]
    test = r["test"] or {"rows": "test", "trained_on": "train", "modes": {}, "all_columns": None}
    return SelectionOutcome(
        features=list(model_data["features"]), freedom_degree=chosen.freedom_degree, personalisation="none",
        chosen=r["chosen"], all_columns=r["all_columns"],
        best_fd=min(elected, key=lambda d: d["mse"]) if elected else None, candidates=scored,
        rule={"columns": {**r["choice"].to_dict(), "rmse_guard": r["rmse_guard"]},
              "score": "pooled cross-validated squared error (lower is better), paired fold differences; "
                       f"no candidate more than {r['rmse_guard']['tolerance']:.0%} above the best CV RMSE"},
        modes={}, test=test, model=model_data, model_all_columns=all_model,
        measured=_measured(prep, schema, model_data["features"]), exchanges=_exchanges(federation, p0, x0, b0),
        ballots={s: b[-1] for s, b in prep.ballots.items()}, n_folds=K, rounds=1, local_epochs=1,
        election={**election, "fd": chosen.freedom_degree, "columns": list(plan.features)},
        abstentions=_regression_abstentions(federation, prep, dropped0), task="regression")


def _unvoted_notes(prep: Prepared, site: str) -> list[str]:
    """The sentence (or none) naming the columns ``site`` measures in its training rows (a count the
    gate did not suppress) but not in the fit rows of every fold; a column it never measures is no
    abstention (ballots rank measured cells only)."""
    measured = dict(zip(prep.columns, prep.measured[site]))
    cols = [c for c in prep.unvoted.get(site, []) if measured.get(c, 0) > 0]
    if not cols:
        return []
    return [f"does not vote on {len(cols)} column(s) it measures in its training rows but not in the "
            f"fit rows of every fold ({', '.join(cols[:10])}{' …' if len(cols) > 10 else ''})"]


def _regression_abstentions(federation: Federation, prep: Prepared, dropped_before: set[str]) -> dict[str, list[str]]:
    """``{site: [sentence, ...]}`` of a regression selection: columns it does not vote on, folds it
    lacks, no test rows, and the sites the quorum dropped."""
    schema = federation.schema
    assert schema is not None
    K = max(prep.n_folds.values()) if prep.n_folds else 0
    out: dict[str, list[str]] = {}
    for site, k in prep.n_folds.items():
        notes: list[str] = []
        notes += _unvoted_notes(prep, site)
        if (prep.ballots.get(site) or [None])[-1] is None:
            notes.append("casts no ballot: its training rows hold one target value (or none)")
        if k == 0:
            notes.append("scores no cross-validation fold: too few training rows for folds of at least its min_rows "
                         "(its training rows still train every fold's chains)")
        elif k < K:
            notes.append(f"has {k} of {K} folds: it scores folds 0–{k - 1} and trains the other folds' chains "
                         "on all its training rows")
        if site not in federation.dropped and schema.rows(site, "test") == 0:
            notes.append("has no test rows: it is in no test score")
        if notes:
            out[site] = notes
    for site, why in federation.dropped.items():
        if site not in dropped_before:
            out.setdefault(site, []).append(f"was dropped from the run (the quorum went on without it): {why}")
    return out


def _checked(federation: Federation, model: Any, rounds: int, local_epochs: int, modes: Sequence[str]
             ) -> tuple[LogisticRegressionModel, list[str], dict[str, Any]]:
    """``(model, modes with "none" first, the model's {name, params})`` of valid settings (raises ``ValueError``)."""
    run_strategy(federation).check_supported(SELECTION_MODES, "model selection (it runs with plain sums only)")
    fm = make_model(model)
    if not isinstance(fm, LogisticRegressionModel):
        raise ValueError(f"model selection trains logistic regression, not {fm.name!r}")
    if rounds < 1 or local_epochs < 1:
        raise ValueError("rounds and local_epochs must be at least 1")
    modes = list(dict.fromkeys(["none", *map(check_mode, modes)]))
    # every chain (candidate × fold × left-out site, and the refit) trains by FedAvg in the same
    # R exchanges: federated Newton would send each chain's (k(d+1))² Hessian per site and round.
    # The refit stays FedAvg too, so it is the estimator the cross-validation scored; the spec says so.
    params = fm.get_params()
    if "solver" in params:
        params["solver"] = "fedavg"
    return fm, modes, {"name": fm.name, "params": params}


def _cv_slots(cands: Sequence[Candidate], modes: Sequence[str]) -> dict[tuple[int, str], int]:
    """The cross-validation's slots ``{(chain, mode): index}`` in request order: every
    candidate's fold chains in every mode, the leave-one-site-out chains unpersonalised."""
    slot_of: dict[tuple[int, str], int] = {}
    for c in cands:
        for m in c.cv_chains:
            for mode in modes:
                slot_of.setdefault((m, mode), len(slot_of))
        for chains in c.loso_chains.values():
            for m in chains:
                slot_of.setdefault((m, "none"), len(slot_of))
    return slot_of


def _summary(cv_of: Mapping[tuple[int, str], Any], chains: Sequence[int], mode: str) -> dict[str, Any]:
    return cv_summary([cv_of[(m, mode)] for m in chains])


@dataclass
class _Columns:
    """The columns' choice: every candidate's scores ``scored`` (``(dict, Candidate)``), the rule's
    outcome, the chosen, all-columns and best-fd candidates."""

    scored: list[tuple[dict[str, Any], Candidate]]
    choice: Any
    chosen_d: dict[str, Any]
    chosen: Candidate
    all_d: dict[str, Any]
    all_columns: Candidate
    best_fd: dict[str, Any] | None
    guard: Any = None


def _choose_columns(plan: Plan, cands: Sequence[Candidate], cv_of: Mapping[tuple[int, str], Any], paired: bool
                    ) -> _Columns:
    """The one-standard-error choice of the columns over the candidates' unpersonalised CV scores."""
    scored = []
    for c in cands:
        s = _summary(cv_of, c.cv_chains, "none")
        scored.append(({"name": c.name, "freedom_degree": c.freedom_degree, "l2": c.l2, "kept": c.kept,
                        "features": [f for f, k in zip(plan.features, c.refit_mask) if k], **s}, c))
    # the L2 strength of the best candidate, then the rule over the masks at that strength (compared on
    # the same penalty, the paired fold differences measure the masks, not the penalties)
    best_l2 = min(scored, key=lambda dc: dc[0]["logloss"])[1].l2
    finalists = [(d, c) for d, c in scored if c.l2 == best_l2]
    choice, guard = guarded_one_standard_error(
        [Scored(d["name"], d["kept"], d["logloss"], tuple(d["fold_logloss"])) for d, _ in finalists],
        [d["auroc"] for d, _ in finalists], paired=paired)
    chosen_d, chosen = next((d, c) for d, c in scored if d["name"] == choice.chosen.name)
    all_d, all_cand = min(((d, c) for d, c in scored if c.freedom_degree is None), key=lambda dc: dc[0]["logloss"])
    elected = [d for d, c in scored if c.freedom_degree is not None]
    best_fd = min(elected, key=lambda d: d["logloss"]) if elected else None
    for d, _ in scored:
        d["chosen"] = d is chosen_d
        d["finalist"] = any(d is f for f, _ in finalists)
    return _Columns(scored, choice, chosen_d, chosen, all_d, all_cand, best_fd, guard)


def _choose_mode(chosen: Candidate, modes: Sequence[str], cv_of: Mapping[tuple[int, str], Any], paired: bool
                 ) -> tuple[dict[str, Any], Any]:
    """Every mode's CV scores for the chosen columns (pooled and per site) and the one-SE choice."""
    mode_scores = {mode: {**_summary(cv_of, chosen.cv_chains, mode),
                          "per_site": per_site_cv([cv_of[(m, mode)] for m in chosen.cv_chains])}
                   for mode in modes}
    choice = one_standard_error([Scored(mode, mode_order(mode), s["logloss"], tuple(s["fold_logloss"]))
                                 for mode, s in mode_scores.items()], paired=paired)
    return mode_scores, choice


def _test(federation: Federation, chains: Chains, bins: int | None, personal: Mapping[str, Any], chosen: Candidate,
          all_cand: Candidate, mode: str) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """The test exchange of ``chains``: the chosen refit unpersonalised, in its mode and local,
    and the all-columns refit; ``(SelectionOutcome.test, the sites' personalised parameters)``."""
    r = chosen.refit_chain
    slots = list(dict.fromkeys([(r, "none"), (r, mode), (r, "local"), (all_cand.refit_chain, "none")]))
    test, personal_params, smoothed = evaluate(federation, chains, slots, bins, "test", personal, send=(r, mode))
    out = {"rows": "test", "trained_on": "train",
           "modes": {md: test_metrics(test[i], smoothed) for i, (m, md) in enumerate(slots) if m == r},
           "all_columns": test_metrics(test[slots.index((all_cand.refit_chain, "none"))], smoothed)}
    return out, personal_params


def _exchanges(federation: Federation, p0: int, x0: int, b0: tuple[int, int]) -> dict[str, Any]:
    """``SelectionOutcome.exchanges`` since the participation record had ``p0`` entries, the
    exchange count was ``x0`` and the traffic ``b0``."""
    steps: dict[str, int] = {}
    for rec in federation.participation[p0:]:
        steps[rec["step"]] = steps.get(rec["step"], 0) + 1
    down, up = federation.traffic.total()
    return {"total": federation.exchange_count - x0, "steps": steps, "bytes_down": down - b0[0],
            "bytes_up": up - b0[1]}


def _model_data(plan: Plan, r: int, mean: np.ndarray, std: np.ndarray, params: Mapping[str, np.ndarray],
                classes: list[str], spec: dict[str, Any], mode: str,
                personal: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, Any]:
    """Refit chain ``r`` as a :data:`~fedtab.learn.personalise.PersonalisedModel` (JSON-able)."""
    mask = plan.masks[plan.chains[r].mask]
    return {
        "features": [f for f, k in zip(plan.features, mask) if k], "classes": list(classes),
        "mean": mean[r][mask].tolist(), "std": std[r][mask].tolist(), "model": dict(spec),
        "params": {"coef": params["coef"][r][:, mask].tolist(), "intercept": params["intercept"][r].tolist()},
        "personalisation": {"mode": mode, "sites": {} if mode == "none" else {
            s: {k: np.asarray(v).tolist() for k, v in p.items()} for s, p in personal.items()}},
    }


def _measured(prep: Prepared, schema: Any, kept: Sequence[str]) -> dict[str, Any]:
    """Per site: missing / imputed share per column of its training rows and the kept columns
    it must impute (never measured) or partly imputes."""
    out: dict[str, Any] = {}
    kept_set = set(kept)
    for site in prep.n_folds:
        n = max(schema.rows(site, "train"), 1)
        measured, missing = prep.measured[site], prep.missing[site]
        unmeasured = n - measured
        out[site] = {
            "missing_share": {c: float(u / n) for c, u in zip(prep.columns, unmeasured)},
            "imputed_share": {c: float(max(u - m, 0) / n) for c, u, m in zip(prep.columns, unmeasured, missing)},
            "must_impute": [c for c, k in zip(prep.columns, measured) if c in kept_set and k == 0],
            "partly_imputed": [c for c, k in zip(prep.columns, measured) if c in kept_set and 0 < k < n],
        }
    return out


def _abstentions(federation: Federation, prep: Prepared, cv_of: Mapping[tuple[int, str], Any], chosen: Candidate,
                 test: Mapping[str, Any], dropped_before: set[str]) -> dict[str, list[str]]:
    """``{site: [sentence, ...]}``: what each site abstained from in this selection and why,
    read from what the server holds (its ballots' columns and flags, its folds, its scored rows
    and classes per fold, its test rows) — and the sites the quorum dropped, with the reason."""
    schema = federation.schema
    assert schema is not None
    K = max(prep.n_folds.values()) if prep.n_folds else 0
    per_site = per_site_cv([cv_of[(m, "none")] for m in chosen.cv_chains])
    tested = set(((test.get("modes") or {}).get("none") or {}).get("per_site") or {})
    out: dict[str, list[str]] = {}
    for site, k in prep.n_folds.items():
        notes: list[str] = []
        notes += _unvoted_notes(prep, site)
        ballots = prep.ballots.get(site) or []
        if ballots and ballots[-1] is None:
            notes.append("casts no ballot: its training rows hold one class (or none)")
        else:
            missing = [str(f) for f, b in enumerate(ballots[:-1]) if b is None]
            if missing:
                notes.append(f"casts no ballot on fold(s) {', '.join(missing)}: one class in their fit rows")
        if k == 0:
            notes.append("scores no cross-validation fold: too few training rows for folds of at least its "
                         "min_rows per class (its training rows still train every fold's chains)")
        elif k < K:
            notes.append(f"has {k} of {K} folds: it scores folds 0–{k - 1} and trains the other folds' chains "
                         "on all its training rows")
        scored = per_site.get(site) or {}
        if scored.get("rows") and scored.get("auroc") is None:
            notes.append("has no within-site CV AUROC: its held-out fold rows hold one class (its rows count in the "
                         "pooled scores)")
        if site not in federation.dropped and schema.rows(site, "test") == 0:
            notes.append("has no test rows: it is in no test score")
        elif site not in federation.dropped and site not in tested:
            notes.append("was not scored on its test rows")
        if notes:
            out[site] = notes
    for site, why in federation.dropped.items():
        if site not in dropped_before:
            out.setdefault(site, []).append(f"was dropped from the run (the quorum went on without it): {why}")
    return out
