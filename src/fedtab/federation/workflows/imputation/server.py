"""The imputation's server loop: schema, statistics, setup, FedAvg rounds, evaluation — a
short loop over the steps of :mod:`.steps`.

Exchanges: ``impute_schema`` (the first of a run also agrees the federation's schema; with
secure sums or DP a second one sums the moments over the global schema), ``impute_stats`` (in a
plain run given a public ``centre`` per column — a job's profile ranges — one exchange for both:
``impute_stats`` about the centre with ``impute_schema`` riding on it),
``impute_setup`` (riding on the first ``impute_fit`` when there are rounds,
:mod:`fedtab.federation.protocol.piggyback`), ``impute_fit`` × rounds, ``impute_eval`` (in a plain run the earlier best round's evaluation rides
on it; with secure sums or robust reducers a second one when an earlier round's model is kept; none
under DP). The rounds stop early when the median site's validation RMSE plateaus (``patience``,
``tolerance``; only where the server learns per-site errors: not under secure sums or DP). :func:`~fedtab.federation.workflows.imputation.steps.apply_imputation`
(``impute_apply``) is a separate step: the sites fill their tables. The run's options
(``federation.options``: secure sums, DP, robust reducers and ``max_site_share``) apply to
every step; with DP, the run's one accountant (:func:`fedtab.federation.protocol.run_ledger`)
pays for every release.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import numpy as np

from fedtab.impute.stats import STAT_ARRAYS
from fedtab.privacy.accountant import PrivacyLedger
from fedtab.privacy.dp import DP_GD_NOISE_SCALE, DP_SCHEMA_NOISE_SCALE
from fedtab.federation.protocol import validate
from fedtab.federation.protocol import Federation, run_ledger, set_quorum
from fedtab.federation.workflows.imputation.config import ImputationResult, ImputeConfig
from fedtab.federation.workflows.imputation.site import DP_STEPS_PER_ROUND
from fedtab.federation.workflows.imputation.stopping import Plateau
from fedtab.federation.workflows.imputation.steps import (Evaluation, centred_on, centring, evaluate, evaluate_step,
                                                          fit_round, model_inputs, moments_with_statistics,
                                                          pooled_statistics, schema_step, setup_step, validation_report)

__all__ = ["run_imputation", "dp_plan"]


def dp_plan(cfg: ImputeConfig) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per step, noise scale per step)`` of one DP imputation, for the accountant:
    the column moments (3 releases), the statistics (one per statistics array) and
    ``DP_STEPS_PER_ROUND`` gradient steps per round."""
    plan = {"imputation.schema": 3, "imputation.stats": len(STAT_ARRAYS),
            "imputation.fit": cfg.rounds * DP_STEPS_PER_ROUND}
    return plan, {"imputation.schema": DP_SCHEMA_NOISE_SCALE, "imputation.fit": DP_GD_NOISE_SCALE}


def run_imputation(
    federation: Federation,
    config: ImputeConfig | None = None,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    *,
    min_sites: int | None = None,
    max_param_abs: float = validate.MAX_PARAM_ABS,
    centre: Mapping[str, float] | None = None,
) -> ImputationResult:
    """Run FedHF-Impute over ``federation`` and return the learned imputer state.

    The run's options (``federation.options``, :func:`fedtab.federation.protocol.set_options`)
    choose how the sums travel and are reduced: per site (default; ``robust``: the centring
    shift is the median site's column mean, sites whose means, spreads or correlations disagree
    with the median site's are left out of the pooled statistics — ``left_out`` names them —,
    no site carries more than ``max_site_share`` of them, FedAvg is the coordinate-wise median
    and the best round is chosen by the median site's RMSE); secure sums (the server learns
    only sums: no per-site validation errors or training losses); DP (the column moments and
    statistics of values clipped into the public ``bounds`` and the GNN's DP gradient steps
    are Gaussian releases the sites make, paid from the run's accountant; the validation errors
    are not released: no validation report, no best-round choice).

    Args:
        federation: any engine's :class:`Federation`; every site must have the
            ``impute_*`` handlers (:mod:`fedtab.federation.workflows.imputation.site`).
        config: settings (defaults: :class:`ImputeConfig`).
        progress: optional ``fn(round, rounds, info)`` called after each round.
        min_sites: quorum (sets ``federation.min_sites``): failing, timed-out or
            rejected sites are dropped while this many remain; ``None`` keeps the
            federation's policy (by default every site must answer).
        max_param_abs: largest ``|entry|`` accepted in a site's model weights.
        centre: a *public* centre per column (the job profile's coarse ranges' midpoints, which the
            server already holds): in a plain run whose schema is agreed and whose every site column
            has one, the statistics are taken about it and the column moments ride on their exchange
            (:func:`~fedtab.federation.workflows.imputation.steps.moments_with_statistics`: one
            exchange for both, the same quantities released); otherwise (or ``None``) the moments
            come first and the statistics are taken about the pooled mean.

    Raises:
        FederationError: a site failed (the message names it), a reply was malformed,
            or the sites share no column (with more than one site).
        ValueError: invalid ``config``.
    """
    from fedtab.impute.train import set_threads

    cfg = config or ImputeConfig()
    cfg.validate()
    set_threads(cfg.n_threads)
    t0 = time.perf_counter()
    down0, up0 = federation.traffic.total()
    set_quorum(federation, min_sites)
    p0, dropped0 = len(federation.participation), set(federation.dropped)
    ledger = run_ledger(federation, *dp_plan(cfg))

    shift = centred_on(federation, centre)
    if shift is not None:  # plain run: the moments ride on the statistics' exchange (one, not two)
        columns, pooled = moments_with_statistics(federation, centre, shift)
        left_out: dict[str, str] = {}
    else:
        columns = schema_step(federation, ledger)
        pooled, left_out = pooled_statistics(federation, columns, centring(federation, columns), ledger)
    glob, f = columns.columns, len(columns.columns)
    model = model_inputs(cfg, pooled, glob)
    site_rows = setup_step(federation, cfg, glob, model, ride=cfg.rounds > 0)  # rides on the first round
    weights, history, best = _rounds(federation, cfg, model, site_rows, f, ledger, max_param_abs, progress)
    weights, ev, best_round = _final_evaluation(federation, cfg, weights, best, f, len(history))
    down1, up1 = federation.traffic.total()
    prior = model.prior
    return ImputationResult(
        columns=glob, mean=model.mean, std=model.std, pooled=pooled, graph=model.graph,
        model_config=model.config.to_dict(), weights=weights,
        prior_W=None if prior is None else prior.W, prior_psi=None if prior is None else prior.psi,
        site_columns=columns.site_columns, site_rows=site_rows, history=history,
        validation=validation_report(glob, ev), unobserved_pairs=model.unobserved_pairs, best_round=best_round,
        seconds=time.perf_counter() - t0, bytes=(down1 - down0, up1 - up0),
        participation=federation.participation[p0:],
        dropped={s: r for s, r in federation.dropped.items() if s not in dropped0},
        left_out=left_out, privacy=ledger.report() if ledger is not None else None,
    )


#: the best round so far: (validation RMSE, round whose weights were scored, those weights)
Best = tuple[float, int, dict[str, np.ndarray]]


def _rounds(federation: Federation, cfg: ImputeConfig, model: Any, site_rows: dict[str, int], f: int,
            ledger: PrivacyLedger | None, max_param_abs: float,
            progress: Callable[[int, int, dict[str, Any]], None] | None,
            ) -> tuple[dict[str, np.ndarray], list[dict], Best]:
    """The FedAvg rounds from the seeded initial weights: ``(final weights, history, best)``;
    each round scores the weights it sends (``val_rmse``: ``None`` when not released). At most
    ``cfg.rounds`` rounds: they stop early once the median site's validation RMSE has not
    improved by more than ``cfg.tolerance`` (relative) for ``cfg.patience`` rounds
    (:class:`~fedtab.federation.workflows.imputation.stopping.Plateau`); a round that returns
    no median site's RMSE (the errors only summed) never stops them."""
    import torch

    from fedtab.impute.model import GNNImputer, state_to_numpy

    torch.manual_seed(cfg.seed)
    weights = state_to_numpy(GNNImputer(model.config))
    history: list[dict] = []
    best: Best = (np.inf, 0, weights)
    plateau = Plateau(cfg.patience, cfg.tolerance)
    for rnd in range(1, cfg.rounds + 1):
        new, val, train_loss, median = fit_round(federation, weights, rnd, site_rows, f,
                                                 max_param_abs=max_param_abs, ledger=ledger)
        if val is not None and val < best[0]:
            best = (val, rnd - 1, weights)
        weights = new
        history.append({"round": rnd, "train_loss": train_loss, "val_rmse": val})
        if progress is not None:
            progress(rnd, cfg.rounds, history[-1])
        if plateau.update(rnd, median):
            break
    return weights, history, best


def _final_evaluation(federation: Federation, cfg: ImputeConfig, weights: dict[str, np.ndarray], best: Best, f: int,
                      rounds: int | None = None) -> tuple[dict[str, np.ndarray], Evaluation, int]:
    """``(weights kept, their evaluation, their round)``: the last round's (``rounds``, the rounds
    run; ``None``: ``cfg.rounds``), or with ``keep_best``
    an earlier round's that scored better (evaluated again). In a plain run the earlier round's
    evaluation rides on the last one's exchange (one exchange for both,
    :func:`fedtab.federation.protocol.riders.ride_step`; the sites evaluate both, each charged as
    alone); with secure sums, DP or robust reducers it is an exchange of its own when needed.

    This exchange cannot ride on the next one (a job's ballot, which carries ``impute_apply``): the
    weights the sites fill their tables with are chosen from it. Every round already scores the
    weights it receives, so only the last round's are unscored here; keeping the best of the
    scored ones instead would be the same as one round fewer (a default, not a fusion)."""
    from fedtab.federation.protocol.riders import ride_step

    ridden: list[Evaluation] = []
    if cfg.keep_best and np.isfinite(best[0]):
        ride_step(federation, evaluate_step(federation, best[2], f), ridden.append)
    ev = evaluate(federation, weights, f)
    if cfg.keep_best and ev.overall is not None and best[0] < ev.overall:
        return best[2], (ridden[0] if ridden else evaluate(federation, best[2], f)), best[1]
    return weights, ev, cfg.rounds if rounds is None else rounds
