"""Honest model selection as one federated workflow (issue 22): federated K-fold
cross-validation by pooled log-loss, a one-standard-error choice of the columns and of the
personalisation, a refit on all training rows, leave-one-site-out contributions.

Exchanges (``R`` = rounds; every candidate, fold, personalisation and left-out site rides
in the same exchanges): ``select_prepare`` (1: fold ballots, moments, measured counts; it
also agrees the schema when it is the run's first), ``select_fit`` (``R``), the
cross-validation ``select_evaluate`` (1) and the test ``select_evaluate`` (1) — ``R + 3``
in all, counted in :attr:`SelectionOutcome.exchanges`.

The folds are each site's own ``fold:k`` parts (:mod:`fedtab.federation.parts`, drawn from
the site's seed); the server only names them. Fold ``k`` of the federation is every site's
``fold:k``; a site with fewer folds trains fold ``k``'s models on all its training rows and
scores none of them. Scores are pooled by sums (a log-loss sum, a confusion matrix, score
histograms and exact within-site rank pairs per fold): no row or prediction leaves a site.

The choice (:func:`fedtab.election.one_se.one_standard_error`): each candidate's score is
the pooled cross-validated log-loss (all folds' rows), its standard error the spread of the
per-fold pooled log-losses over ``sqrt(K)``; the chosen columns are the fewest whose score is
within one standard error of the best candidate's; then, for those columns, the chosen
personalisation is the simplest mode within one standard error of the best mode. The final
model is the chosen candidate's refit on every site's training rows (scikit-learn's refit
convention); its metrics come from the sites' test rows, which nothing above has seen.

Plain sums only: secure aggregation, DP and robust reducers are not implemented for this
workflow yet (it raises ``ValueError``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ...election.ballot import Ballot
from ...election.one_se import Scored, one_standard_error
from ...learn.metrics import SCORE_BINS, pooled_auroc
from ...learn.models import LogisticRegressionModel, make_model
from ...learn.personalise import LOG_LOSS_EPS, check_mode, mode_order
from .. import validate
from ..election_flow import elect_from_ballots
from ..messages import Message
from ..protocol import Federation, FederationError, exchange
from ..training.steps import checked_sums, pool_evaluations, was_smoothed
from .plan import ALL, Candidate, Plan, build_plan, chain_standardisation, fold_ballots
from .site import histogram_slots

__all__ = ["SelectionOutcome", "select_model", "DEFAULT_FD_GRID", "DEFAULT_MODES"]

#: freedom degrees whose elections are candidates (besides all columns)
DEFAULT_FD_GRID = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 11))
#: personalisation modes the cross-validation compares (simplest first)
DEFAULT_MODES = ("none", "intercept", "calibration", "finetune:1", "finetune:0.1", "local")
_MAX_LOGLOSS = -np.log(LOG_LOSS_EPS) + 1e-6  # per row


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

    def to_dict(self) -> dict[str, Any]:
        """Everything but the ballots, JSON-able (arrays as lists)."""
        from dataclasses import asdict

        out = {k: v for k, v in asdict(self).items() if k != "ballots"}
        return _jsonable(out)


def _jsonable(value: Any) -> Any:
    """``value`` through JSON: numpy arrays become lists, numpy scalars numbers."""
    import json

    def plain(v: Any) -> Any:
        if isinstance(v, (np.ndarray, np.generic)):
            return v.tolist()
        raise TypeError(f"{type(v).__name__} is not JSON-able")

    return json.loads(json.dumps(value, default=plain))


# ----------------------------------------------------------------------------- prepare
@dataclass
class _Prepared:
    columns: list[str]
    n_folds: dict[str, int]
    ballots: dict[str, list[Ballot | None]]
    moments: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    measured: dict[str, np.ndarray]
    missing: dict[str, np.ndarray]


def _prepare(federation: Federation, selector: Any) -> _Prepared:
    from ...election.selectors import selector_spec

    meta = {} if selector is None else {"selector": selector_spec(selector)}
    raw: dict[str, tuple] = {}

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        K = validate.integer(reply.meta.get("n_folds"), "n_folds", equal=schema.folds(site))
        cols = schema.check_features(site, reply.meta.get("columns"), exact=True, what="columns")
        voting = schema.check_features(site, reply.meta.get("feature_names"), what="ballot features")
        P, m, d = K + 1, len(voting), len(cols)
        parts = [f"fit:{k}" for k in range(K)] + ["train"]
        bm, bs = validate.array(reply, "ballot_mask", (P, m)), validate.array(reply, "ballot_scores", (P, m))
        voted = validate.array(reply, "voted", (P,))
        ballots: list[Ballot | None] = []
        for p, part in enumerate(parts):
            n = schema.rows(site, part)
            ballots.append(Ballot.build(bm[p], bs[p], n, voting, site=site) if voted[p] else None)
        n_train = schema.rows(site, "train")
        measured = validate.counts(validate.array(reply, "measured_count", (d,)), n_train, "measured counts")
        missing = validate.counts(validate.array(reply, "missing_count", (d,)), n_train, "missing counts")
        if (measured + missing > n_train).any():
            raise ValueError("measured and missing cells add up to more than its training rows")
        mc, ms, mq = (validate.array(reply, k, (P, d)) for k in ("moment_count", "moment_sum", "moment_sumsq"))
        for p, part in enumerate(parts):
            validate.counts(mc[p], schema.rows(site, part), f"{part} counts")
            validate.moments(mc[p], ms[p], mq[p], f"{part} moments")
        raw[site] = (K, cols, ballots, (mc, ms, mq), measured, missing)

    replies = exchange(federation, Message("select_prepare", meta=meta), check, step="select.prepare")
    schema = federation.schema
    assert schema is not None
    columns = [c for c in schema.columns if any(c in raw[s][1] for s in replies)]
    pos = {c: i for i, c in enumerate(columns)}
    out = _Prepared(columns, {}, {}, {}, {}, {})
    for site in replies:
        K, cols, ballots, (mc, ms, mq), measured, missing = raw[site]
        idx = [pos[c] for c in cols]
        full = [np.zeros((K + 1, len(columns))) for _ in range(3)]
        for f, a in zip(full, (mc, ms, mq)):
            f[:, idx] = a
        out.n_folds[site], out.ballots[site], out.moments[site] = K, ballots, tuple(full)  # type: ignore[assignment]
        out.measured[site], out.missing[site] = np.zeros(len(columns)), np.zeros(len(columns))
        out.measured[site][idx], out.missing[site][idx] = measured, missing
    return out


# ----------------------------------------------------------------------------- candidates
def _mask(features: list[str], names: Sequence[str]) -> np.ndarray:
    chosen = set(names)
    return np.array([f in chosen for f in features], dtype=bool)


def _candidates(prep: _Prepared, grid: Sequence[float], K: int, election: Mapping[str, Any],
                l2_grid: Sequence[float]) -> list[Candidate]:
    """Every distinct election of ``grid`` (its smallest fd) and all columns, each with every
    L2 strength of ``l2_grid``; sorted by kept columns, then fd."""
    feats = prep.columns
    folds = list(range(K)) + [-1]
    ballots = {f: fold_ballots(prep.ballots, prep.n_folds, f) for f in folds}
    for f, b in ballots.items():
        if not b:
            raise FederationError(f"no site could vote on {'the training rows' if f < 0 else f'fold {f}'}")
    masks: dict[bytes, tuple[float | None, np.ndarray, np.ndarray]] = {}
    for fd in sorted(set(float(x) for x in grid)):
        by_fold = {f: _mask(feats, elect_from_ballots(ballots[f], fd, **election).selected_names) for f in folds}
        fold_masks = np.stack([by_fold[k] for k in range(K)])
        if fold_masks.all() and by_fold[-1].all():
            continue  # every column: the "all columns" candidate
        key = np.concatenate([fold_masks.ravel(), by_fold[-1]]).tobytes()
        masks.setdefault(key, (fd, fold_masks, by_fold[-1]))  # the smallest fd giving these masks
    everything = np.ones(len(feats), dtype=bool)
    masks[b"all"] = (None, np.tile(everything, (K, 1)), everything)
    several = len(l2_grid) > 1
    out = []
    for fd, fold_masks, refit in masks.values():
        for l2 in l2_grid:
            name = ALL if fd is None else f"fd={fd:g}"
            out.append(Candidate(name + (f", l2={l2:g}" if several else ""), fd, fold_masks, refit, float(l2)))
    return sorted(out, key=lambda c: (c.kept, c.freedom_degree if c.freedom_degree is not None else 2.0, -c.l2))


# ----------------------------------------------------------------------------- training
def _train(federation: Federation, plan: Plan, prep: _Prepared, classes: list[str], model_spec: dict[str, Any],
           rounds: int, local_epochs: int, seed: int, max_param_abs: float) -> tuple[dict[str, np.ndarray],
                                                                                   np.ndarray, np.ndarray]:
    """``R`` rounds of every chain; ``(params, mean, std)`` with params ``(M, k, d)`` / ``(M, k)``."""
    mean, std = chain_standardisation(plan, prep.moments, prep.n_folds)
    M, d = len(plan.chains), len(plan.features)
    k = 1 if len(classes) == 2 else len(classes)
    coef, intercept = np.zeros((M, k, d)), np.zeros((M, k))
    chain_mask = np.array([c.mask for c in plan.chains], dtype=np.int64)
    schema = federation.schema
    assert schema is not None

    def weight(site: str, m: int) -> int:
        ch = plan.chains[m]
        if ch.without == site:
            return 0
        fold = ch.fold
        return schema.rows(site, f"fit:{fold}" if 0 <= fold < prep.n_folds[site] else "train")

    for r in range(1, rounds + 1):
        arrays = {"param:coef": coef, "param:intercept": intercept}
        meta: dict[str, Any] = {"epochs": int(local_epochs), "round": r, "seed": seed + r}
        if r == 1:
            arrays.update({"setup:masks": plan.masks, "setup:chain_mask": chain_mask,
                           "setup:chain_fold": np.array([c.fold for c in plan.chains], dtype=np.int64),
                           "setup:mean": mean, "setup:std": std,
                           "setup:chain_l2": np.array([c.l2 for c in plan.chains], dtype=np.float64)})
            meta["setup"] = {"features": plan.features, "classes": classes, "model": model_spec,
                             "without": [c.without for c in plan.chains]}
        updates: dict[str, tuple[np.ndarray, np.ndarray]] = {}

        def check(site: str, reply: Message) -> None:
            c = validate.array(reply, "param:coef", (M, k, d))
            b = validate.array(reply, "param:intercept", (M, k))
            if max(np.abs(c).max(initial=0), np.abs(b).max(initial=0)) > max_param_abs:
                raise ValueError(f"parameters beyond ±{max_param_abs:g} (implausible norm)")
            outside = ~plan.masks[chain_mask]  # (M, d)
            if (c * outside[:, None, :]).any():
                raise ValueError("updates coefficients outside a chain's mask")
            empty = np.array([weight(site, m) == 0 for m in range(M)])
            if empty.any() and (c[empty].any() or b[empty].any()):
                raise ValueError("sent an update for a chain it does not train")
            updates[site] = (c, b)

        replies = exchange(federation, Message("select_fit", arrays, meta), check, step="select.fit")
        w = np.array([[weight(s, m) for m in range(M)] for s in replies], dtype=np.float64)  # (S, M)
        total = w.sum(axis=0)
        new_c = sum(w[i][:, None, None] * updates[s][0] for i, s in enumerate(replies))
        new_b = sum(w[i][:, None] * updates[s][1] for i, s in enumerate(replies))
        trained = total > 0
        coef[trained] = new_c[trained] / total[trained][:, None, None]
        intercept[trained] = new_b[trained] / total[trained][:, None]
    return {"coef": coef, "intercept": intercept}, mean, std


# ----------------------------------------------------------------------------- evaluation
_SlotSums = dict[str, tuple[np.ndarray, Any, Any, Any, float]]  # site -> (cm, hist, brier, pairs, logloss)


def _evaluate(federation: Federation, plan: Plan, params: Mapping[str, np.ndarray], slots: list[tuple[int, str]],
              classes: list[str], prep: _Prepared, bins: int | None, stage: str, personal: Mapping[str, Any],
              send: tuple[int, str] | None = None
              ) -> tuple[list[_SlotSums], dict[str, dict[str, np.ndarray]], bool]:
    """One ``select_evaluate`` exchange: per slot, every site's checked sums; the sites'
    personalised parameters of slot ``send``; whether a site's release gate smoothed a histogram."""
    C = len(classes)
    E = len(slots)
    schema = federation.schema
    assert schema is not None
    meta: dict[str, Any] = {"slots": [[int(m), str(v)] for m, v in slots], "stage": stage, "personal": dict(personal)}
    if bins is not None:
        meta["score_bins"] = int(bins)
    if send is not None:
        meta["send_personal"] = [int(send[0]), str(send[1])]
    per_slot: list[_SlotSums] = [{} for _ in range(E)]
    with_hist = {e: h for h, e in enumerate(histogram_slots(slots, stage))}
    personal_params: dict[str, dict[str, np.ndarray]] = {}

    def rows(site: str, m: int) -> int:
        fold = plan.chains[m].fold
        if stage == "test":
            return schema.rows(site, "test")
        return schema.rows(site, f"fold:{fold}") if 0 <= fold < prep.n_folds[site] else 0

    def check(site: str, reply: Message) -> None:
        ll = validate.array(reply, "logloss_sum", (E,))
        cms = reply.arrays.get("confusion")
        if cms is None or np.shape(cms) != (E, C, C):
            raise ValueError(f"confusion matrices of shape {np.shape(cms)}, expected {(E, C, C)}")
        brier = validate.array(reply, "brier_sum", (E,))
        pairs = validate.array(reply, "rank_pairs", (E,))
        hist = None
        if bins is not None and C == 2:
            hist = reply.arrays.get("score_hist")
            if hist is None or np.shape(hist) != (2 * len(with_hist), bins):
                raise ValueError(f"score histograms of shape {np.shape(hist)}, expected {(2 * len(with_hist), bins)}")
        out = []
        for e, (m, _) in enumerate(slots):
            n = rows(site, m)
            one = {"confusion": np.asarray(cms[e]), "brier_sum": brier[e:e + 1]}
            has_hist = hist is not None and e in with_hist
            if has_hist:
                h = with_hist[e]
                one["score_hist"] = np.asarray(hist[2 * h:2 * h + 2])
                one["rank_pairs"] = pairs[e:e + 1]
            cm, hh, b, p = checked_sums(site, Message("evaluate", one), C, bins if has_hist else None)
            if int(cm.sum()) != n:
                raise ValueError(f"slot {e}: {int(cm.sum())} rows scored, but {n} were declared for that part")
            if C == 2 and p is None:  # no histogram: the exact pairs alone, within the positives × negatives
                most = float(cm[1].sum()) * float(cm[0].sum())
                if not -1e-9 <= pairs[e] <= most * (1 + 1e-12) + 1e-9:
                    raise ValueError(f"slot {e}: invalid rank pairs for {int(cm[1].sum())} positives and "
                                     f"{int(cm[0].sum())} negatives")
                p = float(pairs[e])
            if not 0 <= ll[e] <= _MAX_LOGLOSS * n:
                raise ValueError(f"slot {e}: log-loss sum {ll[e]:.6g} is impossible for {n} rows")
            out.append((cm, hh, b, p, float(ll[e])))
        if send is not None:
            got = {k[len("param:site:"):]: validate.array(reply, k, np.shape(reply.arrays[k]))
                   for k in reply.arrays if k.startswith("param:site:")}
            if not got and send[1] != "none":
                raise ValueError("sent no personalised parameters")
            personal_params[site] = got
        for e, s in enumerate(out):
            per_slot[e][site] = s

    arrays = {"param:coef": params["coef"], "param:intercept": params["intercept"]}
    replies = exchange(federation, Message("select_evaluate", arrays, meta), check,
                       step="select.cv_evaluate" if stage == "cv" else "select.test_evaluate")
    return ([{s: v for s, v in slot.items() if s in replies} for slot in per_slot], personal_params,
            was_smoothed(replies))


def _fold_scores(slot_sums: _SlotSums) -> tuple[float, float, float | None]:
    """``(log-loss sum, rows, pooled AUROC or None)`` of one slot over the sites that scored rows."""
    scored = {s: v for s, v in slot_sums.items() if v[0].sum() > 0}
    loss = sum(v[4] for v in scored.values())
    n = float(sum(v[0].sum() for v in scored.values()))
    auroc = None
    if scored and all(v[1] is not None and v[3] is not None for v in scored.values()):
        auroc, _ = pooled_auroc([v[1] for v in scored.values()], [v[3] for v in scored.values()])
    return loss, n, auroc


def _cv_summary(sums: Sequence[_SlotSums]) -> dict[str, Any]:
    """Pooled CV scores of one (candidate or chain set, mode) over its ``K`` fold slots."""
    folds = [_fold_scores(s) for s in sums]
    loss = sum(f[0] for f in folds)
    n = sum(f[1] for f in folds)
    fold_ll = [f[0] / f[1] if f[1] else float("nan") for f in folds]
    aurocs = [f[2] for f in folds if f[2] is not None]
    return {"logloss": loss / n if n else float("nan"), "fold_logloss": fold_ll,
            "logloss_se": float(np.std(fold_ll, ddof=1) / np.sqrt(len(fold_ll))) if len(fold_ll) > 1 else None,
            "auroc": float(np.mean(aurocs)) if aurocs else None,
            "auroc_se": float(np.std(aurocs, ddof=1) / np.sqrt(len(aurocs))) if len(aurocs) > 1 else None,
            "rows": int(n)}


def _per_site_cv(sums: Sequence[_SlotSums]) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    sites = {s for slot in sums for s in slot}
    for site in sorted(sites):
        loss = sum(slot[site][4] for slot in sums if site in slot)
        n = sum(float(slot[site][0].sum()) for slot in sums if site in slot)
        aucs = [slot[site][3] / (float(slot[site][0][1].sum()) * float(slot[site][0][0].sum())) for slot in sums
                if site in slot and slot[site][3] is not None and slot[site][0].shape == (2, 2)
                and slot[site][0][1].sum() > 0 and slot[site][0][0].sum() > 0]  # exact: the site's own pairs
        out[site] = {"logloss": loss / n if n else None, "auroc": float(np.mean(aucs)) if aucs else None,
                     "rows": int(n)}
    return out


def _test_metrics(slot_sums: _SlotSums, smoothed: bool) -> dict[str, Any]:
    metrics = pool_evaluations({s: v[:4] for s, v in slot_sums.items()}, smoothed=smoothed)
    n = sum(float(v[0].sum()) for v in slot_sums.values())
    metrics["pooled"]["logloss"] = sum(v[4] for v in slot_sums.values()) / n if n else None
    for s, v in slot_sums.items():
        k = float(v[0].sum())
        metrics["per_site"][s]["logloss"] = v[4] / k if k else None
    return metrics


# ----------------------------------------------------------------------------- the workflow
def select_model(
    federation: Federation,
    *,
    selector: Any = None,
    model: Any = "logistic",
    rounds: int = 10,
    local_epochs: int = 5,
    grid: Sequence[float] = DEFAULT_FD_GRID,
    modes: Sequence[str] = DEFAULT_MODES,
    l2_grid: Sequence[float] | None = None,
    contributions: bool = True,
    paired: bool = True,
    aggregation: str = "weighted",
    normalization: str = "all",
    min_holders: int | None = None,
    personal_epochs: int = 50,
    score_bins: int | None = 100,
    test_bins: int | None = SCORE_BINS,
    seed: int = 0,
    max_param_abs: float = validate.MAX_PARAM_ABS,
) -> SelectionOutcome:
    """Choose the columns and the personalisation by federated cross-validation, refit, and
    score the refit on the test rows (see the module docstring).

    Args:
        selector: the selector every site runs (``None``: each site's own).
        model: logistic regression (a name or ``{"name": "logistic", "params": {...}}``).
        rounds / local_epochs: FedAvg rounds and local L-BFGS iterations of every chain.
        grid: freedom degrees whose elections are candidates ("all columns" always is).
        modes: personalisation modes to compare (:mod:`fedtab.learn.personalise`);
            ``"none"`` is always compared.
        l2_grid: L2 strengths of the logistic model to compare (``None``: the model's own);
            with several, every column candidate is trained with each; the strength of the
            best candidate (lowest CV log-loss) is kept and the one-SE rule compares the
            masks at that strength.
        contributions: also train every fold's chains without each site (leave-one-site-out)
            in the same exchanges, for :func:`site_contributions`.
        paired: the one-SE rule's standard error of the difference to the best candidate
            (default) or the best candidate's own (:func:`~fedtab.election.one_se.one_standard_error`).
        aggregation / normalization / min_holders: the election rule of every candidate.
        personal_epochs: L-BFGS iterations of a fine-tune or local model.
        score_bins: bins of the cross-validation's score histograms (its AUROC; every slot sends
            ``2 × score_bins`` values); ``None``: log-loss only. test_bins: the same for the test rows.

    Raises:
        ValueError: a model other than logistic regression, unknown modes, a run with secure
            sums, DP or robust reducers, sites with fewer than 2 folds in all.
        FederationError: a site failed or replied something impossible (naming it).
    """
    opts = federation.options
    if opts.secure or opts.dp is not None or opts.robust:
        raise ValueError("model selection runs with plain sums only (no secure aggregation, DP or robust mode yet)")
    fm = make_model(model)
    if not isinstance(fm, LogisticRegressionModel):
        raise ValueError(f"model selection trains logistic regression, not {fm.name!r}")
    if rounds < 1 or local_epochs < 1:
        raise ValueError("rounds and local_epochs must be at least 1")
    modes = list(dict.fromkeys(["none", *map(check_mode, modes)]))
    spec = {"name": fm.name, "params": fm.get_params()}
    p0, x0, b0 = len(federation.participation), federation.exchange_count, federation.traffic.total()
    prep = _prepare(federation, selector)
    K = max(prep.n_folds.values())
    if K < 2:
        raise ValueError("cross-validation needs sites with at least 2 folds (each site's `folds` setting)")
    schema = federation.schema
    assert schema is not None
    classes = list(schema.classes)
    if len(classes) < 2:
        raise ValueError(f"selection needs at least 2 classes across the sites, found {classes}")
    election = {"aggregation": aggregation, "normalization": normalization, "min_holders": min_holders}
    l2_grid = sorted({float(x) for x in (l2_grid if l2_grid is not None else [fm.l2])})
    if not l2_grid or min(l2_grid) < 0:
        raise ValueError("l2_grid must hold non-negative L2 strengths")
    cands = _candidates(prep, grid, K, election, l2_grid)
    sites = list(prep.n_folds)
    plan = build_plan(prep.columns, cands, sites, loso=contributions and len(sites) > 1)
    params, mean, std = _train(federation, plan, prep, classes, spec, rounds, local_epochs, seed, max_param_abs)
    personal = {"epochs": int(personal_epochs)}

    # cross-validation: every candidate's fold chains in every mode, and the LOSO chains unpersonalised
    slots: list[tuple[int, str]] = []
    slot_of: dict[tuple[int, str], int] = {}

    def slot(m: int, mode: str) -> int:
        if (m, mode) not in slot_of:
            slot_of[(m, mode)] = len(slots)
            slots.append((m, mode))
        return slot_of[(m, mode)]

    for c in cands:
        for m in c.cv_chains:
            for mode in modes:
                slot(m, mode)
        for chains in c.loso_chains.values():
            for m in chains:
                slot(m, "none")
    cv, _, _ = _evaluate(federation, plan, params, slots, classes, prep, score_bins, "cv", personal)

    def summary(chains: Sequence[int], mode: str) -> dict[str, Any]:
        return _cv_summary([cv[slot_of[(m, mode)]] for m in chains])

    scored = []
    for c in cands:
        s = summary(c.cv_chains, "none")
        scored.append(({"name": c.name, "freedom_degree": c.freedom_degree, "l2": c.l2, "kept": c.kept,
                        "features": [f for f, k in zip(plan.features, c.refit_mask) if k], **s}, c))
    # the L2 strength of the best candidate, then the rule over the masks at that strength (compared on
    # the same penalty, the paired fold differences measure the masks, not the penalties)
    best_l2 = min(scored, key=lambda dc: dc[0]["logloss"])[1].l2
    finalists = [(d, c) for d, c in scored if c.l2 == best_l2]
    choice = one_standard_error([Scored(d["name"], d["kept"], d["logloss"], tuple(d["fold_logloss"]))
                                 for d, _ in finalists], paired=paired)
    chosen_d, chosen = next((d, c) for d, c in scored if d["name"] == choice.chosen.name)
    all_d = min((d for d, c in scored if c.freedom_degree is None), key=lambda d: d["logloss"])
    elected = [d for d, c in scored if c.freedom_degree is not None]
    best_fd = min(elected, key=lambda d: d["logloss"]) if elected else None
    for d, _ in scored:
        d["chosen"] = d is chosen_d
        d["finalist"] = any(d is f for f, _ in finalists)

    mode_scores = {mode: {**summary(chosen.cv_chains, mode),
                          "per_site": _per_site_cv([cv[slot_of[(m, mode)]] for m in chosen.cv_chains])}
                   for mode in modes}
    mode_choice = one_standard_error([Scored(mode, mode_order(mode), s["logloss"], tuple(s["fold_logloss"]))
                                      for mode, s in mode_scores.items()], paired=paired)
    mode = mode_choice.chosen.name
    loso = {s: {k: v for k, v in summary(ch, "none").items() if k in ("logloss", "auroc")}
            for s, ch in chosen.loso_chains.items()}

    # the refit on all training rows, scored on the test rows (never seen above)
    all_cand = next(c for d, c in scored if d is all_d)
    test_slots = list(dict.fromkeys([(chosen.refit_chain, "none"), (chosen.refit_chain, mode),
                                     (chosen.refit_chain, "local"), (all_cand.refit_chain, "none")]))
    test, personal_params, smoothed = _evaluate(federation, plan, params, test_slots, classes, prep, test_bins, "test",
                                      personal, send=(chosen.refit_chain, mode))
    test_out = {"rows": "test", "trained_on": "train",
                "modes": {md: _test_metrics(test[i], smoothed) for i, (m, md) in enumerate(test_slots)
                          if m == chosen.refit_chain},
                "all_columns": _test_metrics(test[test_slots.index((all_cand.refit_chain, "none"))], smoothed)}

    model_data = _model_data(plan, chosen.refit_chain, mean, std, params, classes, spec, mode, personal_params)
    all_model = _model_data(plan, all_cand.refit_chain, mean, std, params, classes, spec, "none", {})
    steps: dict[str, int] = {}
    for rec in federation.participation[p0:]:
        steps[rec["step"]] = steps.get(rec["step"], 0) + 1
    return SelectionOutcome(
        features=list(model_data["features"]), freedom_degree=chosen.freedom_degree, personalisation=mode, chosen=chosen_d,
        all_columns=all_d, best_fd=best_fd, candidates=[d for d, _ in scored],
        rule={"columns": choice.to_dict(), "personalisation": mode_choice.to_dict(),
              "score": "pooled cross-validated log-loss (lower is better)"},
        modes=mode_scores, test=test_out, model=model_data, model_all_columns=all_model,
        measured=_measured(prep, schema, model_data["features"]), loso=loso,
        exchanges={"total": federation.exchange_count - x0, "steps": steps,
                   "bytes_down": federation.traffic.total()[0] - b0[0], "bytes_up": federation.traffic.total()[1] - b0[1]},
        ballots={s: b[-1] for s, b in prep.ballots.items()}, n_folds=K, rounds=rounds, local_epochs=local_epochs,
        election={**election, "fd": chosen.freedom_degree, "columns": list(plan.features)},
    )


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


def _measured(prep: _Prepared, schema: Any, kept: Sequence[str]) -> dict[str, Any]:
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
