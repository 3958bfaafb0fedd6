"""The training workflow's server loop: describe, FedAvg rounds, evaluate — a short loop over
the steps of :mod:`.steps`.

Exchanges: ``describe`` (unless the caller passes ``described``, e.g. from the election's
``set_mask``, which answers it in the same exchange), ``fit`` × rounds (the first carries the
setup: features, classes, standardisation, model spec, part), ``evaluate`` (plus one per
``eval_every`` evaluation) — ``rounds + 2`` in all (``rounds + 1`` with ``described``). An
exact-aggregation model (GaussianNB) runs one round of statistics. The run's options
(``federation.options``: secure sums, DP, robust reducers) apply to every step; with DP, the
run's one accountant (:func:`fedtab.federation.protocol.run_ledger`) pays for every release.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

import numpy as np

from fedtab._settings import settings_with
from fedtab.learn.metrics import SCORE_BINS
from fedtab.learn.models import FederatedModel, LogisticRegressionModel, Params, make_model, model_cost
from fedtab.learn.newton import NEWTON_TOL, as_theta, from_theta, newton_update
from fedtab.privacy.policy import DisclosurePolicy
from fedtab.federation.protocol import validate
from fedtab.federation.protocol import Federation, run_ledger, set_quorum
from fedtab.federation.protocol.modes import run_strategy
from fedtab.federation.site.matrices import check_part
from fedtab.federation.workflows.training.outcome import TrainingOutcome, historic_scores
from fedtab.federation.workflows.training.trainers import trainer_for
from fedtab.federation.workflows.training.steps import EXACT_TRAINING_MODES, solver_for_modes, LINEAR_MODES, TRAINING_MODES, dp_fit_release, dp_plan, FitRound, fit_request, fit_round, newton_request, newton_round
from fedtab.federation.steps.describe import as_description, describe, standardisation
from fedtab.federation.steps.evaluate import evaluate, evaluate_step

log = logging.getLogger("fedtab.training")

__all__ = ["TrainingOutcome", "TrainingSettings", "run_training", "training_task"]



def _round_traffic(federation: Federation, start: int, r: int, down: Mapping[str, np.ndarray], n_up: int
                   ) -> list[dict[str, Any]]:
    """Per-site traffic of one round: every exchange of the round (fit or newton, and a secure sum's
    key exchange and unmasking), from the engine's traffic log when it keeps one."""
    per_site: dict[str, list[int]] = {}
    for t in federation.traffic.records[start:]:
        if t.kind in ("fit", "newton", "secagg_unmask", "secagg_keys", "secagg_sign"):
            acc = per_site.setdefault(t.site, [0, 0])
            acc[0] += t.bytes_down
            acc[1] += t.bytes_up
    n_down = int(sum(v.size for v in down.values()))
    return [{"round": r, "site": s, "bytes_down": d, "bytes_up": u, "params_down": n_down, "params_up": n_up}
            for s, (d, u) in per_site.items()]


@dataclass(frozen=True)
class TrainingSettings:
    """The options of :func:`run_training` (each is also a keyword argument of it; see there).

    Attributes:
        model: a name from :data:`fedtab.learn.MODELS`, a ``{"name", "params"}`` dict or a model.
        rounds / local_epochs: federated rounds (Newton iterations at most, for logistic Newton) and
            local passes per round.
        seed: the run's seed. eval_every: also evaluate every that many rounds (0: only at the end).
        on_round: progress callback ``(round, metrics or None)``.
        on_error: ``"skip"`` leaves failing sites out of each step; ``None``/``"raise"``: the quorum policy.
        train_part / eval_part: the sites' row parts to train on and to score.
        described: the description already gathered (skips the describe exchange).
        score_bins: grid of the final score histograms (None: no histograms, no Brier sums).
        min_sites: quorum (``None`` keeps the federation's). max_param_abs: largest accepted ``|entry|``.
        task: ``"binary"``, ``"multiclass"``, ``"regression"`` or ``None`` (read from the schema).
        newton_tol: Newton–Raphson stops once a step's L2 norm is below it.
        bounds: the public data dictionary ``{column: [low, high]}`` (a job's ``[columns] bounds``):
            boosted trees bin those columns on the equal-width grid of their bounds (no sketch);
            other models do not use it (their DP releases read the DP settings' bounds).
        before_rounds: ``fn(setup)`` called once the setup (``features``, ``classes``, ``model`` spec,
            ``part``) is known, right before the first round's exchange: a caller may queue a request
            to ride on it (:func:`fedtab.federation.protocol.piggyback.ride`).
        ahead: the first Newton iteration asked ahead (a
            :class:`~fedtab.federation.workflows.training.ahead.NewtonAhead`, e.g. riding on the
            election's ``set_mask``): used, rewritten for the pooled standardisation, when it was asked
            for this run's setup, start and sites (one exchange fewer); ignored otherwise.
    """

    model: Any = "logistic"
    rounds: int = 10
    local_epochs: int = 5
    seed: int = 0
    eval_every: int = 0
    on_round: Callable[[int, dict[str, float] | None], None] | None = None
    on_error: Literal["raise", "skip"] | None = None
    train_part: str = "train"
    eval_part: str = "test"
    described: Any = None
    score_bins: int | None = SCORE_BINS
    min_sites: int | None = None
    max_param_abs: float = validate.MAX_PARAM_ABS
    task: str | None = None
    newton_tol: float = NEWTON_TOL
    bounds: Mapping[str, Any] | None = None
    before_rounds: Callable[[Mapping[str, Any]], None] | None = None
    ahead: Any = None


@dataclass(frozen=True)
class _Rounds:
    """What every round of a run shares: the setup the first request carries (features, classes,
    model spec, part), the standardisation (``mean``/``std``, shape ``(d,)``), the run's accountant
    (or ``None``), the row parts, the evaluation cadence and callbacks, whether the model scores
    probabilities, and ``left_out`` — the run's ``{site: reason}`` of sites a reducer left out,
    which each round adds to (the one mutable field)."""

    setup: Mapping[str, Any]
    mean: np.ndarray
    std: np.ndarray
    ledger: Any
    train_part: str
    eval_part: str
    eval_every: int
    on_round: Callable[[int, dict[str, float] | None], None] | None
    on_error: Literal["raise", "skip"] | None
    left_out: dict[str, str]
    has_proba: bool

    def evaluate_round(self, federation: Federation, params: Params, r: int, last: bool,
                       history: list[dict[str, float]]) -> dict[str, float] | None:
        """The periodic evaluation after round ``r`` (every ``eval_every`` rounds and at the ``last``),
        appended to ``history``; then the ``on_round`` callback. Returns the metrics or ``None``."""
        metrics = None
        if self.eval_every and (r % self.eval_every == 0 or last):
            detail = evaluate(federation, params, len(self.setup["classes"]), self.eval_part,
                              has_proba=self.has_proba, ledger=self.ledger, on_error=self.on_error)
            metrics = historic_scores(detail)[0]
            history.append({"round": r, **metrics})
        if self.on_round:
            self.on_round(r, metrics)
        return metrics


def run_training(
    federation: Federation,
    features: list[str] | None = None,
    *,
    settings: TrainingSettings | None = None,
    **options: Any,
) -> TrainingOutcome:
    """Train ``model`` by federated rounds on ``features`` (default: each site's elected mask).

    The options are the fields of :class:`TrainingSettings`, given as keyword arguments
    (``run_training(fed, feats, model="gnb", rounds=3)``), as ``settings=TrainingSettings(...)``,
    or both (the keywords override the settings' fields); an unknown keyword raises ``TypeError``.

    The run's options (``federation.options``, :func:`fedtab.federation.protocol.set_options`)
    choose how the sums travel and are reduced: plain sums (default); secure sums (the server
    learns no single site's description, update or scores: ``per_site`` is empty); DP (the
    description, the updates — DP gradient descent for logistic regression, DP-FedAvg for
    other FedAvg models; not for exact-aggregation models — and the confusion matrices are
    Gaussian releases made by the sites on their own terms, paid from the run's accountant;
    no score histograms); robust reducers (screened and capped moments, coordinate-wise median
    FedAvg, median scores; ``left_out`` names the sites they left out).

    Args:
        features: column names to train on; ``None`` uses the mask the sites were told
            by the election (``site.state["features"]``), or all their columns.
        model: a name from :data:`fedtab.learn.MODELS`, a ``{"name", "params"}`` dict
            or a :class:`~fedtab.learn.FederatedModel`.
        rounds: federated rounds; local_epochs: local passes per round. A logistic model
            (``solver="newton"``, the default) trains by federated Newton–Raphson: at most
            ``rounds`` iterations, one exchange each, stopping once a step's L2 norm is below
            ``newton_tol`` (``local_epochs`` unused); it reaches the pooled penalised
            maximum-likelihood fit itself.
        eval_every: also evaluate every that many rounds (0 = only at the end) to fill ``history``.
        on_round: progress callback ``(round, metrics or None)``.
        train_part / eval_part: the sites' row parts to train on and to score (``"fit"``
            and ``"validation"`` for tuning; ``"fit:k"`` / ``"fold:k"`` for cross-validation).
        described: the description over these features and ``train_part``, already gathered
            (:class:`~fedtab.federation.steps.describe.Description`, e.g.
            ``ElectionOutcome.described``); skips the describe exchange, same result.
        score_bins: grid of the score histograms the final evaluation asks for (AUROC,
            PR-AUC); None skips the histograms and the Brier sums.
        on_error: ``"skip"`` leaves failing sites out of each step; ``None``/``"raise"``
            follow the federation's quorum policy.
        min_sites: quorum (sets ``federation.min_sites``); ``None`` keeps the federation's.
        max_param_abs: largest ``|entry|`` accepted in a site's parameters.
        task: ``"binary"``, ``"multiclass"`` or ``"regression"``; ``None``: :func:`training_task`
            (regression when every site reads its target as a number). A regression run trains
            ``"linear"`` (pooled normal equations, one exact round) or ``"gbdt"`` (objective
            ``"regression"``) and scores RMSE / MAE / R² (:func:`~.steps.evaluate_regression`);
            ``classes`` is empty.
        newton_tol: the Newton–Raphson stopping threshold (default :data:`fedtab.learn.newton.NEWTON_TOL`).

    Raises:
        FederationError: a site failed or replied inconsistently (naming it).
        ValueError: bad arguments, DP with an exact-aggregation model, fewer than 2 classes, a
            model that cannot serve the task (one line, :func:`fedtab.learn.tasks.model_refusal`).
        TypeError: a keyword that is no field of :class:`TrainingSettings`.
    """
    o = settings_with(TrainingSettings, settings, options, "run_training")
    if trainer_for(o.model) is None:  # a mode the model does not support is refused before any exchange (once:
        early = make_model(o.model)  # the task below changes only a gbdt spec)
        run_strategy(federation).check_supported(EXACT_TRAINING_MODES if early.exact else TRAINING_MODES,
                                                 f"the exact-aggregation model {early.name!r}" if early.exact
                                                 else f"the model {early.name!r}")
    task = training_task(federation, o.task)
    model = _model_for_task(o.model, task)
    trainer = trainer_for(model)
    if task == "regression" and trainer is None:
        return _run_linear(federation, features, model, o)
    if trainer is not None:  # e.g. boosted trees: level by level from summed histograms, not by FedAvg rounds
        return trainer.train(federation, features, model, seed=o.seed, train_part=o.train_part,
                             eval_part=o.eval_part, score_bins=o.score_bins, min_sites=o.min_sites,
                             on_error=o.on_error, described=o.described,
                             **({"bounds": o.bounds} if o.bounds else {}))
    if o.rounds < 1 or o.local_epochs < 1:
        raise ValueError("rounds and local_epochs must be at least 1")
    fm, why = _solver_for_run(make_model(model), federation, features)
    return _run_rounds(federation, features, fm, o, task, why)


#: the widest logistic model (``k·(d+1)`` coefficients) that trains by Newton–Raphson: a Newton round
#: carries ``(k·(d+1))²`` Hessian sums per site (at 500, 250,000 float64: 2 MB up per site per round);
#: a wider one trains by FedAvg, and its model spec says so
NEWTON_MAX_PARAMS = 500


def _solver_for_run(fm: FederatedModel, federation: Federation, features: list[str] | None
                    ) -> tuple[FederatedModel, str | None]:
    """``(model, why)``: ``fm`` (``why`` ``None``), or the same logistic model trained by FedAvg with the
    reason — when the run has a mode the Newton step does not serve (:func:`~.steps.solver_for_modes`,
    from the run's strategy: DP, robust), or when the model is wider than :data:`NEWTON_MAX_PARAMS`
    (width from ``features``, else the agreed schema's columns, and the agreed classes)."""
    fm, why = solver_for_modes(fm, run_strategy(federation).modes)
    if why is not None:
        log.warning("logistic regression %s", why)
        return fm, why
    if not _is_newton(fm) or federation.schema is None:
        return fm, None
    d = len(features) if features is not None else len(federation.schema.columns)
    n_classes = len(federation.schema.classes)
    width = (1 if n_classes <= 2 else n_classes) * (d + 1)
    if width <= NEWTON_MAX_PARAMS:
        return fm, None
    why = (f"trained by FedAvg ({width} coefficients: a Newton round's Hessian would carry {width * width} sums per "
           f"site; at most {NEWTON_MAX_PARAMS} coefficients by Newton-Raphson)")
    log.warning("logistic regression %s", why)
    return LogisticRegressionModel(l2=fm.l2, mu=fm.mu, solver="fedavg"), why


def _run_rounds(federation: Federation, features: list[str] | None, fm: FederatedModel, o: TrainingSettings,
                task: str, solver_reason: str | None = None) -> TrainingOutcome:
    """A classification run of a FedAvg, exact or Newton model: describe (unless ``o.described``),
    standardise, the rounds, the final evaluation; the outcome with its traffic and participation
    (``solver_reason``: why a logistic model trains by FedAvg, :func:`_solver_for_run`)."""
    spec = {"name": fm.name, "params": fm.get_params()}
    check_part(o.train_part), check_part(o.eval_part)
    set_quorum(federation, o.min_sites)
    p0, dropped0 = len(federation.participation), set(federation.dropped)
    opts = federation.options
    ledger = run_ledger(federation, *dp_plan(fm, o.rounds, o.local_epochs, o.eval_every, o.described is not None))
    if o.described is None:
        description = describe(federation, features, o.train_part, ledger, on_error=o.on_error)
    else:
        description = as_description(o.described, features, federation)
    if len(description.classes) < 2:
        raise ValueError(f"training needs at least 2 classes across the sites, found {description.classes}")
    feats, class_list = description.features, description.classes
    mean, std, left_out = standardisation(federation, description)
    dp_fit = None if fm.exact else dp_fit_release(fm, o.local_epochs)  # how a fit round releases under DP
    has_proba = getattr(fm, "predict_proba", None) is not None
    ctx = _Rounds(setup={"features": feats, "classes": class_list, "model": spec, "part": o.train_part},
                  mean=mean, std=std, ledger=ledger, train_part=o.train_part, eval_part=o.eval_part,
                  eval_every=o.eval_every, on_round=o.on_round, on_error=o.on_error, left_out=left_out,
                  has_proba=has_proba)
    params = _initial_params(fm, len(feats), len(class_list), o.seed)
    steps: list[float] = []
    detail = None
    if o.before_rounds is not None:
        o.before_rounds(ctx.setup)
    if _is_newton(fm):  # logistic: federated Newton–Raphson, at most `rounds` iterations
        final = functools.partial(evaluate_step, federation, n_classes=len(class_list), part=o.eval_part,
                                  bins=o.score_bins, has_proba=has_proba)
        params, history, traffic, steps, detail = _newton_rounds(federation, fm, params, o.rounds, ctx,
                                                                 tol=o.newton_tol, final=final, ahead=o.ahead)
        n_rounds = len(steps)
    else:
        n_rounds = 1 if fm.exact else o.rounds
        params, history, traffic = _fedavg_rounds(federation, fm, params, n_rounds, ctx, local_epochs=o.local_epochs,
                                                  seed=o.seed, dp_fit=dp_fit, max_param_abs=o.max_param_abs)
    if detail is None:  # no evaluation rode on the last Newton iteration
        detail = evaluate(federation, params, len(class_list), o.eval_part, o.score_bins, has_proba=has_proba,
                          ledger=ledger, on_error=o.on_error)
    pooled, per_site = historic_scores(detail)
    # every fit exchange of the rounds, a secure sum's key exchange and unmasking included
    bytes_down, bytes_up = sum(t["bytes_down"] for t in traffic), sum(t["bytes_up"] for t in traffic)
    return TrainingOutcome(
        model=fm.name, params=params, features=list(feats), classes=class_list, mean=mean, std=std, pooled=pooled,
        per_site=per_site, history=history, n_params=fm.n_params(len(feats), len(class_list)),
        bytes_down=bytes_down, bytes_up=bytes_up, traffic=traffic, rounds=n_rounds, metrics=detail, steps=steps,
        local_epochs=int(o.local_epochs), seed=o.seed, model_spec=spec, participation=federation.participation[p0:],
        dropped={s: why for s, why in federation.dropped.items() if s not in dropped0}, robust=opts.robust,
        left_out=left_out, privacy=ledger.report() if ledger is not None else None, task=task,
        solver=("newton" if _is_newton(fm) else "fedavg") if fm.name == "logistic" else None,
        solver_reason=solver_reason,
    )


def training_task(federation: Federation, task: str | None = None) -> str:
    """The run's task: ``task`` when given (checked against the sites), else read from the agreed
    schema — ``"regression"`` when every site declares no class label (each reads its target as a
    number), ``"binary"`` / ``"multiclass"`` by the agreed classes.

    Raises:
        ValueError: an unknown task; sites that read the target differently (naming them), or a
            classification task where a site reads the target as a number (and the reverse).
    """
    from fedtab.learn.tasks import TASKS
    from fedtab.federation.protocol.agreement import agree_schema

    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    if federation.schema is None:
        agree_schema(federation)
    schema = federation.schema
    assert schema is not None
    numeric = sorted(s for s, d in schema.sites.items() if d.target is not None and not d.classes)
    labelled = sorted(s for s, d in schema.sites.items() if d.target is not None and d.classes)
    if task == "regression" and labelled:
        raise ValueError(f"task = \"regression\", but site(s) {labelled} read the target as classes (tell them "
                         f"task = \"regression\")")
    if task in ("binary", "multiclass") and numeric:
        raise ValueError(f"task = {task!r}, but site(s) {numeric} read the target as a number (tell them "
                         f"task = \"classes\")")
    if task is None and numeric and labelled:
        raise ValueError(f"site(s) {numeric} read the target as a number and {labelled} as classes: set "
                         f"[training] task = \"regression\" or \"binary\"/\"multiclass\"")
    if task is not None:
        return task
    if numeric:
        return "regression"
    return "binary" if len(schema.classes) <= 2 else "multiclass"


def _model_for_task(model: Any, task: str) -> Any:
    """``model`` fit for ``task`` (a ``"gbdt"`` spec gets ``objective = "regression"`` for a
    regression task); ``ValueError`` with :func:`~fedtab.learn.tasks.model_refusal`'s line otherwise."""
    from fedtab.learn.tasks import given_objective, model_refusal

    fm = make_model(model)
    objective = given_objective(model) if fm.name == "gbdt" else None
    why = model_refusal(fm.name, task, objective)
    if why is not None:
        raise ValueError(why)
    if fm.name == "gbdt" and task == "regression" and objective is None:
        return {"name": "gbdt", "params": {**fm.get_params(), "objective": "regression"}}
    return model


def _run_linear(federation: Federation, features: list[str] | None, model: Any, o: TrainingSettings
                ) -> TrainingOutcome:
    """A regression run of an exact model (``"linear"``): describe, one fit round of the sites'
    normal-equation statistics over standardised columns, the regression evaluation (of ``o``, only
    ``seed``, the parts, ``described``, ``min_sites`` and ``on_error`` apply)."""
    from fedtab.federation.steps.evaluate import evaluate_regression

    fm: FederatedModel = make_model(model)
    spec = {"name": fm.name, "params": fm.get_params()}
    check_part(o.train_part), check_part(o.eval_part)
    set_quorum(federation, o.min_sites)
    p0, dropped0 = len(federation.participation), set(federation.dropped)
    run_strategy(federation).check_supported(LINEAR_MODES, f"the regression model {fm.name!r}")
    description = describe(federation, features, o.train_part, None, on_error=o.on_error) if o.described is None \
        else as_description(o.described, features, federation)
    feats = description.features
    mean, std, left_out = standardisation(federation, description)
    ctx = _Rounds(setup={"features": feats, "classes": [], "model": spec, "part": o.train_part, "task": "regression"},
                  mean=mean, std=std, ledger=None, train_part=o.train_part, eval_part=o.eval_part, eval_every=0,
                  on_round=None, on_error=o.on_error, left_out=left_out, has_proba=False)
    params = _initial_params(fm, len(feats), 1, o.seed)
    params, _, traffic = _fedavg_rounds(federation, fm, params, 1, ctx, local_epochs=1, seed=o.seed, dp_fit=None,
                                        max_param_abs=validate.MAX_PARAM_ABS)
    detail = evaluate_regression(federation, params, o.eval_part, on_error=o.on_error)
    return TrainingOutcome(
        model=fm.name, params=params, features=list(feats), classes=[], mean=mean, std=std,
        pooled=dict(detail["pooled"]), per_site={s: dict(m) for s, m in detail["per_site"].items()},
        n_params=fm.n_params(len(feats), 1), bytes_down=sum(t["bytes_down"] for t in traffic),
        bytes_up=sum(t["bytes_up"] for t in traffic), traffic=traffic, rounds=1, metrics=detail, local_epochs=1,
        seed=o.seed, model_spec=spec, participation=federation.participation[p0:],
        dropped={s: why for s, why in federation.dropped.items() if s not in dropped0}, robust=False,
        left_out=left_out, task="regression")


def _initial_params(fm: FederatedModel, d: int, c: int, seed: int) -> Params:
    """The model's starting parameters, after checking a site would accept a model of that size.

    Raises:
        ValueError: the model would exceed a site's default ``max_size``.
    """
    size = model_cost(fm, d, c).size  # before the server allocates it
    if not size <= DisclosurePolicy().max_size:
        raise ValueError(f"model {fm.name!r} would hold ~{size:.1e} parameters, more than a site accepts by default "
                         f"(max_size={DisclosurePolicy().max_size:g})")
    return fm.init(d, c, seed)


def _fedavg_rounds(federation: Federation, fm: FederatedModel, params: Params, n_rounds: int, ctx: _Rounds, *,
                   local_epochs: int, seed: int, dp_fit: Mapping[str, Any] | None, max_param_abs: float,
                   ) -> tuple[Params, list[dict[str, float]], list[dict[str, Any]]]:
    """``n_rounds`` fit exchanges from ``params`` (the setup rides on the first), with an
    evaluation every ``ctx.eval_every`` rounds; adds the sites each round left out to ``ctx.left_out``.

    Returns:
        ``(params, history, traffic)``: the final parameters, the periodic metrics and the
        bytes of each round (:func:`_round_traffic`).
    """
    n_classes = len(ctx.setup["classes"])
    template = fm.update_template(len(ctx.setup["features"]), n_classes)
    n_up = int(sum(np.prod(v) for v in template.values()))
    history: list[dict[str, float]] = []
    traffic: list[dict[str, Any]] = []
    for r in range(1, n_rounds + 1):
        request = fit_request(params, fm, epochs=local_epochs, round_=r, seed=seed,
                              setup=ctx.setup if r == 1 else None, mean=ctx.mean, std=ctx.std, dp_fit=None)
        n_log = len(federation.traffic.records)
        fit = FitRound(request, template, ctx.train_part, max_param_abs=max_param_abs, n_classes=n_classes,
                       round_=r, dp_fit=dp_fit)
        params, dropped, _ = fit_round(federation, fm, fit, on_error=ctx.on_error, ledger=ctx.ledger)
        ctx.left_out.update(dropped)
        traffic += _round_traffic(federation, n_log, r, {} if fm.exact else {k: v for k, v in request.arrays.items()
                                                                              if k.startswith("param:")}, n_up)
        ctx.evaluate_round(federation, params, r, r == n_rounds, history)
    return params, history, traffic


def _is_newton(fm: FederatedModel) -> bool:
    return isinstance(fm, LogisticRegressionModel) and fm.newton


#: an iterate whose Newton step is shorter than this is returned as the fit itself (it is within about
#: that L2 distance of the pooled penalised maximum-likelihood fit)
NEWTON_FINAL_TOL = 1e-7
#: once a step is shorter than this, the next iterate's evaluation rides on its Newton exchange
#: (quadratic convergence: its own step is then about the square, often below NEWTON_FINAL_TOL)
NEWTON_RIDE_TOL = 1e-3


def _newton_rounds(federation: Federation, fm: LogisticRegressionModel, params: Params, max_iter: int,
                   ctx: _Rounds, *, tol: float, final: Callable[..., Any] | None = None, ahead: Any = None,
                   ) -> tuple[Params, list[dict[str, float]], list[dict[str, Any]], list[float], Any]:
    """Federated Newton–Raphson from ``params``: each iteration one ``"newton"`` exchange (the setup
    rides on the first) whose summed gradient and Hessian give the next point
    (:func:`fedtab.learn.newton.newton_update`); stops after ``max_iter`` iterations or once a step's
    norm is below ``tol``; adds the sites each iteration left out to ``ctx.left_out``.

    With ``final`` (``final(params)`` builds the final evaluation's summed step) and plain sums,
    once the last step is below :data:`NEWTON_RIDE_TOL` the evaluation of the iterate sent rides
    on its Newton exchange (:func:`fedtab.federation.protocol.riders.ride_step`); when that
    iterate's own step is below :data:`NEWTON_FINAL_TOL` it is returned, evaluated, and the run
    needs no evaluation exchange of its own.

    With ``ahead`` answered for this run (:func:`~fedtab.federation.workflows.training.ahead.ahead_point`:
    asked at the start, or at θ1 from the ballot's sums at zero) the iterations up to its point and the
    one from its sums are taken without an exchange, and the first exchange carries the setup with the
    pooled standardisation. A start is never trusted blindly: when the step from the first point sent is
    longer than the step that led to it (the rewritten sums were too far off, e.g. many missing cells),
    the iteration falls back to the start point and goes on from there.

    Returns:
        ``(params, history, traffic, step norms, final evaluation or None)`` (one norm per iteration run).
    """
    from fedtab.federation.protocol.riders import ride_step
    from fedtab.federation.workflows.training.ahead import ahead_point

    d = len(ctx.setup["features"])
    theta = as_theta(params)
    k = theta.shape[0]
    n_up = k * (d + 1) * (k * (d + 1) + 1)
    history: list[dict[str, float]] = []
    traffic: list[dict[str, Any]] = []
    steps: list[float] = []
    start, warm = theta, False
    # the ahead iterate is used when an exchange follows that carries the pooled setup (the sites hold the
    # reference one until then) and no periodic evaluation comes before it
    point = None if ctx.eval_every else ahead_point(ahead, ctx.setup, theta, ctx.mean, ctx.std, federation.active)
    if point is not None and max_iter >= len(point.steps) + 2:  # rode ahead: the sums at that point (the start,
        theta1, step = newton_update(point.theta, point.sums.grad, point.sums.hess, point.sums.n, fm.l2)  # or θ1)
        if np.isfinite(theta1).all():
            theta, warm = theta1, True
            steps += [*point.steps, step]
            for r in range(1, len(steps) + 1):
                if ctx.on_round:
                    ctx.on_round(r, None)
    n_ahead = len(steps)
    setup_sent = False
    for r in range(len(steps) + 1, max_iter + 1):
        request = newton_request(theta, round_=r, setup=None if setup_sent else ctx.setup, mean=ctx.mean,
                                 std=ctx.std)
        sent, evaluated = theta, []
        # a rider is answered before the request it rides on: never on the one that carries the setup
        rides = (setup_sent and final is not None and not ctx.eval_every and bool(steps) and steps[-1] < NEWTON_RIDE_TOL
                 and ride_step(federation, final(from_theta(theta)), evaluated.append))
        setup_sent = True
        n_log = len(federation.traffic.records)
        sums, dropped = newton_round(federation, request, k, d, ctx.train_part, round_=r, ledger=ctx.ledger,
                                     on_error=ctx.on_error, l2=fm.l2)
        ctx.left_out.update(dropped)
        theta, step = newton_update(theta, sums.grad, sums.hess, sums.n, fm.l2)
        rows = _round_traffic(federation, n_log, r, {k_: v for k_, v in request.arrays.items()
                                                    if k_.startswith("param:")}, n_up)
        traffic += rows
        steps.append(step)
        if warm and r == n_ahead + 1 and not step <= steps[-2]:  # the warm iterate's step is longer than the
            # step that led to it: worse than the start, back to it
            warm, theta = False, start
            if ctx.on_round:
                ctx.on_round(r, None)
            continue
        if rides and evaluated and step < NEWTON_FINAL_TOL:  # the iterate sent is the fit, and it is evaluated
            if ctx.on_round:
                ctx.on_round(r, None)
            return from_theta(sent), history, traffic, steps, evaluated[0]
        converged = step < tol
        ctx.evaluate_round(federation, from_theta(theta), r, r == max_iter or converged, history)
        if converged:
            break
    return from_theta(theta), history, traffic, steps, None
