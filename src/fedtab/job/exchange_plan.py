"""How many exchanges a job makes, and what they weigh: the plan behind a run's progress estimate.

:func:`planned_exchanges` (an upper bound per step, checked against the in-process engine),
:func:`expected_exchanges` (what the estimate counts: a plain Newton fit converging) and
:func:`exchange_plan`, the :class:`~fedtab.engines.progress.ExchangePlan` the job hands the engine's
:class:`~fedtab.engines.progress.ProgressLog` (the engines read no job: they are handed its plan).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ..engines.progress import GNN_ROUND_WEIGHT, ExchangePlan, round_kinds

if TYPE_CHECKING:  # pragma: no cover
    from .spec import JobSpec

__all__ = ["NEWTON_EXPECTED", "exchange_plan", "expected_exchanges", "gbdt_exchanges", "planned_exchanges"]


def _gbdt_model(model: Any) -> Any:
    """The :class:`~fedtab.learn.models.GradientBoostedTreesModel` a training ``model`` spec names, else ``None``."""
    from ..learn.models import make_model

    fm = make_model(model)
    return fm if fm.name == "gbdt" else None


def gbdt_exchanges(params: Mapping[str, Any], *, plain: bool, dp: bool = False) -> int:
    """Exchanges of one federated boosting run (:func:`fedtab.federation.workflows.gbdt.run_gbdt`) at most:
    ``gbdt_summary``, two ``gbdt_sketch`` (none under DP: public bounds), ``gbdt_start``, one
    ``gbdt_level`` per depth level of every round (``n_trees × max_depth``), the closing
    ``gbdt_level``, ``gbdt_importance`` in a plain run, and the evaluation:
    ``n_trees × max_depth + 6`` (``+ 1`` plain, ``− 2`` DP). Early stopping, trees that stop
    growing before ``max_depth`` and public bounds for every column make fewer; a regression
    run makes as many (its evaluation is ``gbdt_score``)."""
    return int(params["n_trees"]) * int(params["max_depth"]) + 4 + int(plain) + (0 if dp else 2)


def _robust(spec: "JobSpec") -> bool:
    """Whether the job's ``[trust]`` asks for robust reducers."""
    return bool(getattr(getattr(spec, "trust", None), "robust", False))


def _linear_model(model: Any) -> bool:
    """Whether a training ``model`` spec names the exact linear regression (one round)."""
    from ..learn.models import LinearRegressionModel, make_model

    return isinstance(make_model(model), LinearRegressionModel)


def planned_exchanges(spec: "JobSpec") -> dict[str, int]:
    """``{step: exchanges}`` the job's plan makes (an estimate), in step order.

    Exact for schema, election, FedAvg training and baselines as the job folds them, an upper bound
    for the imputation (its rounds stop early on a validation plateau, ``[impute] patience``)
    (checked against the in-process engine's exchange count); an upper bound for a logistic model
    trained by Newton–Raphson (the default), whose ``rounds`` are its most iterations: it stops
    once a step is shorter than :data:`~fedtab.learn.newton.NEWTON_TOL` (the heart job: 6 of 10,
    its final evaluation riding on the last; :func:`expected_exchanges`, what the estimate counts,
    counts a plain run converging). In a *plain* run (no secure sums, DP or robust reducers) requests ride on the
    next exchange (:mod:`fedtab.federation.protocol.piggyback`): imputation ``rounds + 2`` with the column
    profile (the statistics taken about the profile's coarse ranges' midpoints with the column moments
    riding on them, the rounds with the setup on the first, one evaluation with the kept best round's
    riding on it; ``3`` with no rounds), ``+ 1`` without the profile or when ``[columns] ignore`` or
    ``categorical`` make the sites declare their schema again (the moments then come first: schema,
    statistics) — also, not counted, when the profile flags a row identifier or leaves a column
    without a coarse range; its ``impute_apply`` rides on the election's ballot; for a Newton
    model the count assumes the run stops at its cap (training ``rounds + 1``, baselines 1): a
    converging run makes ``iterations`` (its evaluation rides on the last) and no baselines exchange
    (they ride on the first iteration of its own); after a voting election the first Newton iteration
    rides on ``set_mask`` (training ``rounds``, a converging run ``iterations − 1``). Otherwise the steps keep their own exchanges: the column profile 1,
    imputation ``rounds + 5`` (``+ 1`` with the column profile), election 2 (``ballot``, ``set_mask``), training ``rounds + 1``
    after an election (its ``describe`` rides on ``set_mask``) else ``rounds + 2`` (``+ 1`` when no earlier step
    agreed the schema: the training step agrees it to read the task),
    baselines 1; tuning is counted as its grid (11 freedom degrees by default) + 2. An exact ``linear``
    model trains in one round (no baselines: a regression). ``[election] tune = "cv"`` is the selection
    step in place of tuning, election, training and baselines: ``rounds + 3`` (``select_prepare``, the
    fit rounds, the CV and the test evaluation); with a ``linear`` model 3 (one fit exchange, no test
    evaluation) and the training step's 3 (describe, fit, evaluate).
    A ``gbdt`` model's training is :func:`gbdt_exchanges` (its ``n_trees × max_depth`` level
    exchanges, not ``rounds``; an upper bound: early stopping and shallow trees make fewer), its
    schema agreement and, for a regression task, no baselines.
    Secure aggregation adds two exchanges per summed one (the survivors' signatures and the
    unmasking) and one for a session's keys: election ``+ 3``, imputation ``+ 4·rounds + 4``,
    FedAvg training ``+ 2`` per summed exchange (its rounds, evaluate and, without an election,
    describe) and GBDT ``+ 2·(n_trees × max_depth + 5)`` (``+ 3`` under DP), each ``+ 1`` for the keys unless an
    election opened the session. A score test and the all-columns comparison are not counted.
    """
    out: dict[str, int] = {}
    private = spec.privacy.private
    secure = bool(spec.privacy.secure_aggregation)
    # a plain run: riders travel on the next exchange (:mod:`fedtab.federation.protocol.piggyback`)
    plain = not private and not secure and spec.privacy.dp is None and not _robust(spec)
    profile = spec.schema.profile if spec.schema.profile is not None else not private
    if profile:
        out["schema"] = 1
    if spec.impute is not None:
        r = spec.impute.rounds
        if plain:  # fused (issue 31): the statistics (the column moments riding on them when the profile's
            # ranges give every column a public centre and no column roles made the sites declare their schema
            # again), the rounds (the setup rides on the first), one evaluation (the kept best round's rides
            # on it); impute_apply rides on the next step's exchange
            roles = bool(spec.columns.ignore or spec.columns.categorical)
            out["imputation"] = r + 2 + int(r == 0) + int(not profile or roles)
        else:
            out["imputation"] = r + 5 + int(profile) + (4 * r + 4 if secure else 0)
    el = spec.election
    voting = el is not None and el.method == "vote"
    linear = spec.training is not None and _linear_model(spec.training.model)
    if voting and el.tune == "cv" and spec.training is not None:
        # the selection (plain sums only): select_prepare (it agrees the schema when it is the run's
        # first exchange), the select_fit rounds (one for an exact linear model), the CV evaluation and
        # the test evaluation — which a regression leaves to its training step (describe, fit, evaluate)
        if linear:
            out["selection"] = 3
            out["training"] = 3
        else:
            out["selection"] = spec.training.rounds + 3
        return out
    if voting and el.tune != "none" and el.freedom_degree is None:
        out["tuning"] = len(el.grid or range(11)) + 2
    if voting:
        out["election"] = 2 + (3 if secure else 0)  # secure: the ballot is summed, the session opened
    if spec.training is not None:
        # its describe rides on set_mask after an election; with no earlier step agreeing the schema,
        # the training step agrees it first (the task is read from the sites' declarations)
        agreed = profile or spec.impute is not None or voting
        gbdt = _gbdt_model(spec.training.model)
        if gbdt is not None:  # boosted trees grow level by level: no describe, no FedAvg rounds
            params = gbdt.get_params()
            regression = spec.training.task == "regression" or params.get("objective") == "regression"
            dp = spec.privacy.dp is not None
            # (sketch ×2,) start, levels, closing level, evaluate
            summed = int(params["n_trees"]) * int(params["max_depth"]) + 3 + (0 if dp else 2)
            out["training"] = gbdt_exchanges(params, plain=not private, dp=dp) + (0 if agreed else 1)
        else:
            regression = linear
            rounds = 1 if linear else spec.training.rounds  # an exact linear model: one round
            summed = rounds + (1 if voting else 2)  # (describe,) fit rounds or at most `rounds` Newton steps, evaluate
            # a plain Newton fit after an election: its iteration at zero (over every candidate column) rides on
            # the ballot and the next one on set_mask (with at least 3 iterations: one exchange of its own must
            # follow; a job whose candidates exceed the Newton width asks the zero start on set_mask: one more)
            ahead = _first_newton_on_mask(spec, plain, voting)
            out["training"] = summed + (0 if agreed else 1) - int(ahead) - int(ahead and rounds >= 3)
        if secure:
            out["training"] += 2 * summed + (0 if voting else 1)
        if not regression and (spec.evaluation.baselines if spec.evaluation.baselines is not None else not private):
            # (plain Newton: they ride on the first iteration and cost none of their own when the run
            # converges; counted as when it stops at its cap, the bound the training's count assumes too)
            out["baselines"] = 1
    return out


#: Newton–Raphson iterations a plain logistic fit is expected to make before it converges (its
#: ``rounds`` are a cap): 6 on the heart job (measured: ``tests/job/test_job_exchanges.py`` and the
#: deployments of docs/deployment.md), where counting the cap of 10 put the estimate 1.6× high. After
#: an election the first of them rides on the ballot and the second on ``set_mask``
#: (:func:`_first_newton_on_mask`): 4 training exchanges, the evaluation riding on the last
NEWTON_EXPECTED = 6


def _first_newton_on_mask(spec: "JobSpec", plain: bool, voting: bool) -> bool:
    """Whether a plain Newton logistic fit's first iterations ride on the election: at zero on the ballot,
    the next on ``set_mask`` (:func:`fedtab.job.steps.training.ride_ballot_iteration`,
    :func:`~fedtab.job.steps.training.ride_first_iteration`): a plain run, a voting election, a
    logistic model trained by Newton–Raphson for a classification task."""
    if not (plain and voting and spec.training is not None and spec.training.task != "regression"):
        return False
    from ..learn.models import LogisticRegressionModel, make_model

    fm = make_model(spec.training.model)
    return isinstance(fm, LogisticRegressionModel) and bool(fm.newton)


def _plain_newton(spec: "JobSpec") -> bool:
    """Whether the job trains a logistic model by federated Newton–Raphson with plain sums (no
    secure sums, DP or robust reducers), the case whose converging run :func:`expected_exchanges` counts."""
    from ..learn.models import LogisticRegressionModel, make_model

    if spec.training is None or spec.privacy.private or spec.privacy.secure_aggregation:
        return False
    if spec.privacy.dp is not None or _robust(spec):
        return False
    fm = make_model(spec.training.model)
    return isinstance(fm, LogisticRegressionModel) and bool(fm.newton)


def expected_exchanges(spec: "JobSpec") -> dict[str, int]:
    """``{step: exchanges}`` the estimate counts: :func:`planned_exchanges`, but a plain Newton
    logistic fit whose ``rounds`` exceed :data:`NEWTON_EXPECTED` is counted as converging after
    ``NEWTON_EXPECTED`` iterations — ``rounds + 1 − NEWTON_EXPECTED`` fewer training exchanges
    (its evaluation rides on the last iteration) and no baselines exchange (they ride on the first
    iteration; after an election the first two iterations ride on the ballot and ``set_mask``, so the
    heart job's training counts 4). A run that needs more iterations counts none left of its own once past the
    expected ones (the step's estimate then says ≈ 0 s until it ends)."""
    out = planned_exchanges(spec)
    if "training" in out and _plain_newton(spec) and "selection" not in out:
        rounds = spec.training.rounds
        if rounds > NEWTON_EXPECTED:  # the plan's `rounds` iterations (and evaluate) become NEWTON_EXPECTED
            out["training"] -= rounds + 1 - NEWTON_EXPECTED
            out.pop("baselines", None)
    return out


def _units(spec: "JobSpec", plan: Mapping[str, int]) -> dict[str, float]:
    """``{step: cost}`` of the plan's steps in ordinary exchanges (:func:`kind_weight`): the
    imputation's ``rounds`` GNN rounds weigh :data:`GNN_ROUND_WEIGHT`, every other exchange 1."""
    out = {k: float(n) for k, n in plan.items()}
    if "imputation" in out and spec.impute is not None:
        heavy = min(spec.impute.rounds, plan["imputation"])
        out["imputation"] += (GNN_ROUND_WEIGHT - 1.0) * heavy
    return out



def exchange_plan(spec: "JobSpec") -> ExchangePlan:
    """The job's :class:`~fedtab.engines.progress.ExchangePlan`: :func:`expected_exchanges` per step,
    their weight in ordinary exchanges (:func:`_units`) and the rounds of every round kind
    (:func:`~fedtab.engines.progress.round_kinds`: the kinds' declared ``rounds_of`` the spec)."""
    plan = expected_exchanges(spec)
    rounds = {kind: int(rounds_of(spec)) for kind, (_, rounds_of) in round_kinds().items()}
    return ExchangePlan(plan, _units(spec, plan), rounds)
