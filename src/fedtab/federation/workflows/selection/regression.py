"""Honest model selection for a numeric target (issue 30): the columns chosen by federated
K-fold cross-validation of a linear regression, scored by pooled squared error.

The same plan as the classification workflow (:mod:`.server`): every candidate (the election at
each freedom degree of the grid, and all columns) elected on each fold's ballots, its chains
trained on every site's ``fit:k`` rows and scored on its ``fold:k`` rows (the site's own,
quantile-stratified folds, :mod:`fedtab.federation.site.parts`). A linear model is exact, so training
is one exchange of normal-equation statistics per chain. Exchanges: ``select_prepare``,
``select_fit`` (1), the cross-validation ``select_evaluate`` and (``score_test``) the test
``select_evaluate`` — 3 or 4 in all.

The score of a candidate is its pooled CV mean squared error (Σ SSE / Σ rows over every fold and
site; its square root is the CV RMSE), its fold scores the per-fold pooled MSEs. The choice is the
one-standard-error rule on the paired fold differences of squared error, guarded: never a
candidate whose CV RMSE is more than ``rmse_tolerance`` (3 %) above the best candidate's when one
within it exists (:func:`~fedtab.election.one_se.guarded_one_standard_error` on the ratio
``best RMSE / RMSE``); the candidates it passes over are reported.

What a site releases per slot: :func:`~fedtab.learn.metrics.regression_sums` (SSE, SAE, Σy,
Σy²) over a fold it drew itself, or its test part — the same parts, release floors and
per-part model caps as the classification selection (the policy's ``select_evaluate`` check).
Plain sums only.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from fedtab.election.one_se import Scored, guarded_one_standard_error
from fedtab.learn.metrics import regression_scores
from fedtab.learn.models import LinearRegressionModel
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, exchange
from fedtab.federation.workflows.selection.plan import Plan, build_plan, chain_standardisation
from fedtab.federation.workflows.selection.steps import Prepared, candidates

__all__ = ["RMSE_TOLERANCE", "select_regression", "fit_linear_chains", "evaluate_regression_slots"]

#: the largest relative CV RMSE excess over the best candidate a choice may have unannounced
RMSE_TOLERANCE = 0.03

_SUMS = ("sse", "sae", "sum_y", "sum_y2")


def _rows(federation: Federation, plan: Plan, prep: Prepared, site: str, m: int, stage: str) -> tuple[int, int]:
    """``(training rows, held-out rows)`` of chain ``m`` at ``site``."""
    schema = federation.schema
    assert schema is not None
    ch = plan.chains[m]
    has = 0 <= ch.fold < prep.n_folds[site]
    train = 0 if ch.without == site else schema.rows(site, f"fit:{ch.fold}" if has else "train")
    held = schema.rows(site, "test") if stage == "test" else (schema.rows(site, f"fold:{ch.fold}") if has else 0)
    return train, held


def fit_linear_chains(federation: Federation, plan: Plan, prep: Prepared, fm: LinearRegressionModel,
                      max_param_abs: float = validate.MAX_PARAM_ABS
                      ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """One ``select_fit`` exchange: every chain's least-squares fit on its sites' pooled rows.

    Returns ``(params, mean, std)``: ``coef`` ``(M, 1, d)`` (zeros outside each mask),
    ``intercept`` ``(M, 1)``; the chains' standardisation ``(M, d)``.

    Raises:
        FederationError: a site's statistics are malformed, inconsistent with its declared rows,
            outside a chain's mask or for a chain it does not train (naming it); a chain without rows.
    """
    mean, std = chain_standardisation(plan, prep.moments, prep.n_folds)
    M, d = len(plan.chains), len(plan.features)
    chain_mask = np.array([c.mask for c in plan.chains], dtype=np.int64)
    arrays = {"param:coef": np.zeros((M, 1, d)), "param:intercept": np.zeros((M, 1)),
              "setup:masks": plan.masks, "setup:chain_mask": chain_mask,
              "setup:chain_fold": np.array([c.fold for c in plan.chains], dtype=np.int64),
              "setup:mean": mean, "setup:std": std, "setup:chain_l2": np.full(M, float(fm.l2))}
    meta = {"epochs": 1, "round": 1, "seed": 0,
            "setup": {"features": plan.features, "classes": [], "model": {"name": fm.name, "params": fm.get_params()},
                      "without": [c.without for c in plan.chains]}}
    inside = np.concatenate([np.ones((M, 1), bool), plan.masks[chain_mask]], axis=1)  # (M, d+1)
    stats: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def check(site: str, reply: Message) -> None:
        count = validate.array(reply, "param:count", (M,))
        xtx = validate.array(reply, "param:xtx", (M, d + 1, d + 1))
        xty = validate.array(reply, "param:xty", (M, d + 1))
        outside = ~(inside[:, :, None] & inside[:, None, :])
        if (xtx * outside).any() or (xty * ~inside).any():
            raise ValueError("sent statistics outside a chain's mask")
        for m in range(M):
            n, _ = _rows(federation, plan, prep, site, m, "cv")
            if count[m] != n:
                raise ValueError(f"chain {m}: statistics over {count[m]:g} rows, but {n} were declared for its part")
            try:
                LinearRegressionModel.check_statistics({"count": count[m:m + 1], "xtx": xtx[m], "xty": xty[m]}, n)
            except ValueError as exc:
                raise ValueError(f"chain {m}: {exc}") from None
        stats[site] = (count, xtx, xty)

    replies = exchange(federation, Message("select_fit", arrays, meta), check, step="select.fit")
    coef, intercept = np.zeros((M, 1, d)), np.zeros((M, 1))
    for m in range(M):
        idx = np.flatnonzero(inside[m])
        ups = [({"count": stats[s][0][m:m + 1], "xtx": stats[s][1][m][np.ix_(idx, idx)], "xty": stats[s][2][m][idx]},
                0) for s in replies if stats[s][0][m] > 0]
        p = fm.aggregate(ups)  # raises ValueError on a chain no site trains
        if max(np.abs(p["coef"]).max(initial=0), np.abs(p["intercept"]).max(initial=0)) > max_param_abs:
            raise ValueError(f"chain {m}: the least-squares fit is beyond ±{max_param_abs:g}")
        coef[m, 0, idx[1:] - 1], intercept[m] = p["coef"], p["intercept"]
    return {"coef": coef, "intercept": intercept}, mean, std


def evaluate_regression_slots(federation: Federation, plan: Plan, params: Mapping[str, np.ndarray],
                              chains: Sequence[int], prep: Prepared, stage: str
                              ) -> list[dict[str, tuple[np.ndarray, int]]]:
    """One ``select_evaluate`` exchange: per chain of ``chains``, ``{site: (sums (4,), rows)}``
    with ``sums`` = SSE, SAE, Σy, Σy² over the chain's held-out rows at that site (sites with none
    left out). Each reply is checked: non-negative errors, zeros where the site has no rows,
    ``SAE² ≤ n·SSE`` and ``(Σy)² ≤ n·Σy²`` (Cauchy–Schwarz)."""
    E = len(chains)
    per: list[dict[str, tuple[np.ndarray, int]]] = [{} for _ in range(E)]
    got: dict[str, list[tuple[np.ndarray, int]]] = {}

    def check(site: str, reply: Message) -> None:
        arr = np.stack([validate.array(reply, k, (E,)) for k in _SUMS], axis=1)  # (E, 4)
        out = []
        for e, m in enumerate(chains):
            _, n = _rows(federation, plan, prep, site, m, stage)
            sse, sae, sy, sy2 = arr[e]
            slack = 1e-9 * (1 + abs(n * sse) + abs(n * sy2))
            if n == 0 and arr[e].any():
                raise ValueError(f"slot {e}: sums over a part it declared empty")
            if sse < 0 or sae < 0 or sy2 < 0 or sae * sae > n * sse + slack or sy * sy > n * sy2 + slack:
                raise ValueError(f"slot {e}: regression sums impossible for {n} rows")
            out.append((arr[e].copy(), n))
        got[site] = out

    meta = {"slots": [[int(m), "none"] for m in chains], "stage": stage, "personal": {}}
    arrays = {"param:coef": params["coef"], "param:intercept": params["intercept"]}
    replies = exchange(federation, Message("select_evaluate", arrays, meta), check,
                       step="select.cv_evaluate" if stage == "cv" else "select.test_evaluate")
    for site in replies:
        for e, (sums, n) in enumerate(got[site]):
            if n:
                per[e][site] = (sums, n)
    return per


def _pooled(slot: Mapping[str, tuple[np.ndarray, int]]) -> dict[str, Any]:
    total = sum((v[0] for v in slot.values()), np.zeros(4))
    return regression_scores(*total, float(sum(v[1] for v in slot.values())))


def cv_regression_summary(slots: Sequence[Mapping[str, tuple[np.ndarray, int]]]) -> dict[str, Any]:
    """A candidate's CV scores over its ``K`` fold slots: ``mse`` (Σ SSE / Σ rows over all folds),
    ``rmse`` = √mse, ``fold_mse`` per fold (NaN for a fold no site scored), ``rmse_se`` (the
    spread of the per-fold RMSEs over √K), ``mae``, ``r2`` (pooled over every fold's rows) and ``rows``."""
    total = sum((v[0] for s in slots for v in s.values()), np.zeros(4))
    n = float(sum(v[1] for s in slots for v in s.values()))
    fold_n = [float(sum(v[1] for v in s.values())) for s in slots]
    fold_mse = [float(sum(v[0][0] for v in s.values()) / k) if k else float("nan") for s, k in zip(slots, fold_n)]
    rmses = [np.sqrt(x) for x in fold_mse if np.isfinite(x)]
    pooled = regression_scores(*total, n)
    return {"mse": float(total[0] / n) if n else float("nan"), "rmse": pooled["rmse"], "fold_mse": fold_mse,
            "rmse_se": float(np.std(rmses, ddof=1) / np.sqrt(len(rmses))) if len(rmses) > 1 else None,
            "mae": pooled["mae"], "r2": pooled["r2"], "rows": int(n)}


def select_regression(federation: Federation, prep: Prepared, fm: LinearRegressionModel, *, grid: Sequence[float],
                      election: Mapping[str, Any], paired: bool = True, score_test: bool = True,
                      rmse_tolerance: float = RMSE_TOLERANCE, max_param_abs: float = validate.MAX_PARAM_ABS
                      ) -> dict[str, Any]:
    """The regression selection after :func:`~.steps.prepare` (see the module docstring).

    Returns ``{"plan", "chosen", "all_columns", "scored" (list of (dict, Candidate)), "choice",
    "guard", "params", "mean", "std", "test" (or None)}``; the candidate dicts hold ``name,
    freedom_degree, kept, features, mse, rmse, fold_mse, rmse_se, mae, r2, rows, chosen``.

    Raises:
        ValueError: a negative or non-finite ``rmse_tolerance``; fold scores the rule cannot use.
        FederationError: as :func:`fit_linear_chains` and :func:`evaluate_regression_slots`.
    """
    if not (np.isfinite(rmse_tolerance) and rmse_tolerance >= 0):
        raise ValueError(f"rmse_tolerance must be finite and non-negative, got {rmse_tolerance!r}")
    K = max(prep.n_folds.values())
    cands = candidates(prep, grid, K, election, [float(fm.l2)])
    plan = build_plan(prep.columns, cands, list(prep.n_folds), loso=False)
    params, mean, std = fit_linear_chains(federation, plan, prep, fm, max_param_abs)
    cv_chains = list(dict.fromkeys(m for c in cands for m in c.cv_chains))
    cv = dict(zip(cv_chains, evaluate_regression_slots(federation, plan, params, cv_chains, prep, "cv")))
    scored = []
    for c in cands:
        s = cv_regression_summary([cv[m] for m in c.cv_chains])
        if not all(np.isfinite(s["fold_mse"])):
            raise ValueError(f"candidate {c.name!r}: a fold no site scored (every fold needs held-out rows)")
        scored.append(({"name": c.name, "freedom_degree": c.freedom_degree, "kept": c.kept,
                        "features": [f for f, k in zip(plan.features, c.refit_mask) if k], **s}, c))
    best_rmse = min(d["rmse"] for d, _ in scored)
    # the guard reads a score in [0, 1], higher better: best RMSE / RMSE, within tol/(1+tol) of 1 ⇔
    # RMSE ≤ (1 + tol) · best RMSE
    ratio = [best_rmse / d["rmse"] if d["rmse"] else 1.0 for d, _ in scored]
    choice, guard = guarded_one_standard_error(
        [Scored(d["name"], d["kept"], d["mse"], tuple(d["fold_mse"])) for d, _ in scored], ratio,
        paired=paired, tolerance=rmse_tolerance / (1 + rmse_tolerance))
    chosen_d, chosen = next((d, c) for d, c in scored if d["name"] == choice.chosen.name)
    all_d, all_c = next((d, c) for d, c in scored if c.freedom_degree is None)
    for d, _ in scored:
        d["chosen"] = d is chosen_d
    test = None
    if score_test:
        slots = list(dict.fromkeys([chosen.refit_chain, all_c.refit_chain]))
        sums = evaluate_regression_slots(federation, plan, params, slots, prep, "test")
        by = dict(zip(slots, sums))

        def metrics(m: int) -> dict[str, Any]:
            return {"pooled": _pooled(by[m]), "per_site": {s: regression_scores(*v[0], float(v[1]))
                                                          for s, v in by[m].items()}}

        test = {"rows": "test", "trained_on": "train", "modes": {"none": metrics(chosen.refit_chain)},
                "all_columns": metrics(all_c.refit_chain)}
    g = guard.to_dict()
    rmse_guard = {"tolerance": rmse_tolerance, "best": g["best"], "best_rmse": best_rmse,
                  "rule_choice": g["rule_choice"], "chosen_rmse": chosen_d["rmse"],
                  "excess": chosen_d["rmse"] / best_rmse - 1 if best_rmse else 0.0,
                  "passed_over": g["passed_over"], "flagged": g["flagged"]}
    return {"plan": plan, "chosen": chosen_d, "chosen_candidate": chosen, "all_columns": all_d,
            "all_candidate": all_c, "scored": scored, "choice": choice, "rmse_guard": rmse_guard,
            "params": params, "mean": mean, "std": std, "test": test}
