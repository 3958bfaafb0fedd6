"""The selection workflow's server steps (:mod:`.server` runs them): each builds its request,
validates every reply, naming the site at fault, and reduces.

* :func:`prepare` — the ``select_prepare`` exchange: fold ballots, moments, measured counts;
* :func:`candidates` — the elections of the fd grid and all columns (no traffic);
* :func:`train` — ``rounds`` ``select_fit`` exchanges of every chain (FedAvg per chain);
* :func:`evaluate` — one ``select_evaluate`` exchange, the checked sums of every slot;
  :func:`cv_summary` / :func:`per_site_cv` / :func:`test_metrics` — scores from those sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from fedtab.election.ballot import Ballot
from fedtab.learn.metrics import pooled_ranking
from fedtab.learn.personalise import LOG_LOSS_EPS
from fedtab.privacy.gate import SMOOTHED
from fedtab.federation.protocol import validate
from fedtab.federation.workflows.election.server import elect_from_ballots
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, FederationError, exchange
from fedtab.federation.steps.evaluate import checked_sums, pool_evaluations, was_smoothed
from fedtab.federation.workflows.selection.plan import ALL, Candidate, Plan, chain_standardisation, fold_ballots
from fedtab.federation.workflows.selection.site import histogram_slots

__all__ = ["Prepared", "prepare", "candidates", "train", "Chains", "evaluate", "cv_summary", "per_site_cv", "test_metrics",
           "SlotSums", "MAX_LOGLOSS"]

MAX_LOGLOSS = -np.log(LOG_LOSS_EPS) + 1e-6  # per row


# ----------------------------------------------------------------------------- prepare
@dataclass
class Prepared:
    """What the ``select_prepare`` exchange gathered, per site: its folds ``K``, its ballots
    (``K`` fold ballots, then the training rows'; ``None`` where it abstained), the moments
    ``(P, d)`` over :attr:`columns`, its measured / missing training cells ``(d,)``, and the
    columns it holds but does not vote on (``unvoted``: not measured in the fit rows of every
    fold)."""

    columns: list[str]
    n_folds: dict[str, int]
    ballots: dict[str, list[Ballot | None]]
    moments: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    measured: dict[str, np.ndarray]
    missing: dict[str, np.ndarray]
    unvoted: dict[str, list[str]] = field(default_factory=dict)


def prepare(federation: Federation, selector: Any) -> Prepared:
    from fedtab.election.selector_specs import selector_wire_spec as selector_spec  # no scikit-learn for a named one

    meta = {} if selector is None else {"selector": selector_spec(selector)}
    raw: dict[str, tuple] = {}
    voters: dict[str, list[str]] = {}

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
        voters[site] = list(voting)

    replies = exchange(federation, Message("select_prepare", meta=meta), check, step="select.prepare")
    schema = federation.schema
    assert schema is not None
    columns = [c for c in schema.columns if any(c in raw[s][1] for s in replies)]
    pos = {c: i for i, c in enumerate(columns)}
    out = Prepared(columns, {}, {}, {}, {}, {})
    for site in replies:
        K, cols, ballots, (mc, ms, mq), measured, missing = raw[site]
        idx = [pos[c] for c in cols]
        full = [np.zeros((K + 1, len(columns))) for _ in range(3)]
        for f, a in zip(full, (mc, ms, mq)):
            f[:, idx] = a
        out.n_folds[site], out.ballots[site], out.moments[site] = K, ballots, tuple(full)  # type: ignore[assignment]
        out.measured[site], out.missing[site] = np.zeros(len(columns)), np.zeros(len(columns))
        out.measured[site][idx], out.missing[site][idx] = measured, missing
        voting = set(voters[site])
        out.unvoted[site] = [c for c in cols if c not in voting]
    return out


# ----------------------------------------------------------------------------- candidates
def mask_of(features: list[str], names: Sequence[str]) -> np.ndarray:
    chosen = set(names)
    return np.array([f in chosen for f in features], dtype=bool)


def candidates(prep: Prepared, grid: Sequence[float], K: int, election: Mapping[str, Any],
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
        by_fold = {f: mask_of(feats, elect_from_ballots(ballots[f], fd, **election).selected_names) for f in folds}
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
def train(federation: Federation, plan: Plan, prep: Prepared, classes: list[str], model_spec: dict[str, Any],
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
#: site -> (cm, hist, brier, pairs, logloss, smoothed: whether its gate smoothed the reply's histograms)
SlotSums = dict[str, tuple[np.ndarray, Any, Any, Any, float, bool]]


@dataclass(frozen=True)
class Chains:
    """The trained chains a ``select_evaluate`` exchange scores: the ``plan`` (its chains and
    masks), what :func:`prepare` gathered (``prep``: each site's folds), the agreed ``classes``
    and the chains' parameters ``params`` (``{"coef": (M, k, d), "intercept": (M, k)}``, as
    :func:`train` returns them)."""

    plan: Plan
    prep: Prepared
    classes: list[str]
    params: Mapping[str, np.ndarray]


def evaluate(federation: Federation, chains: Chains, slots: list[tuple[int, str]], bins: int | None, stage: str,
             personal: Mapping[str, Any], send: tuple[int, str] | None = None
             ) -> tuple[list[SlotSums], dict[str, dict[str, np.ndarray]], bool]:
    """One ``select_evaluate`` exchange of ``chains``: per slot ``(chain, mode)`` of ``slots``,
    every site's checked sums; the sites' personalised parameters of slot ``send``; whether a
    site's release gate smoothed a histogram. ``stage``: ``"cv"`` (each chain scored on its
    fold's rows) or ``"test"``; ``bins``: score histogram bins (``None``: none).

    Raises:
        FederationError: a site failed or replied impossible sums (naming it)."""
    plan, prep, classes, params = chains.plan, chains.prep, chains.classes, chains.params
    C = len(classes)
    E = len(slots)
    schema = federation.schema
    assert schema is not None
    meta: dict[str, Any] = {"slots": [[int(m), str(v)] for m, v in slots], "stage": stage, "personal": dict(personal)}
    if bins is not None:
        meta["score_bins"] = int(bins)
    if send is not None:
        meta["send_personal"] = [int(send[0]), str(send[1])]
    per_slot: list[SlotSums] = [{} for _ in range(E)]
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
            if not 0 <= ll[e] <= MAX_LOGLOSS * n:
                raise ValueError(f"slot {e}: log-loss sum {ll[e]:.6g} is impossible for {n} rows")
            out.append((cm, hh, b, p, float(ll[e]), reply.meta.get(SMOOTHED) is True))
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


def fold_scores(slot_sums: SlotSums) -> tuple[float, float, float | None, float | None]:
    """``(log-loss sum, rows, pooled AUROC, its error bound)`` of one slot over the sites that
    scored rows: the AUROC of :func:`~fedtab.learn.metrics.pooled_ranking` (each site's pairs
    exact, cross-site pairs bounded by its histogram's bins, or runs where its gate smoothed
    it); both ``None`` without a histogram from every scoring site or without both classes."""
    scored = {s: v for s, v in slot_sums.items() if v[0].sum() > 0}
    loss = sum(v[4] for v in scored.values())
    n = float(sum(v[0].sum() for v in scored.values()))
    auroc = bound = None
    if scored and all(v[1] is not None and v[3] is not None for v in scored.values()):
        r = pooled_ranking([v[1] for v in scored.values()], [v[3] for v in scored.values()],
                           [bool(v[5]) for v in scored.values()])
        auroc, bound = r["auroc"], r["auroc_error_bound"]
    return loss, n, auroc, bound


def cv_summary(sums: Sequence[SlotSums]) -> dict[str, Any]:
    """Pooled CV scores of one (candidate or chain set, mode) over its ``K`` fold slots:
    ``logloss`` (all folds' rows) with ``fold_logloss`` and ``logloss_se``; ``auroc`` (the
    mean of the folds' pooled AUROCs) with ``fold_auroc`` (``None`` for a fold without one),
    ``auroc_se`` and ``auroc_error_bound`` (the largest fold's bound: how far the pooled
    AUROCs can be from the exact AUROC of the same predictions); ``rows``."""
    folds = [fold_scores(s) for s in sums]
    loss = sum(f[0] for f in folds)
    n = sum(f[1] for f in folds)
    fold_ll = [f[0] / f[1] if f[1] else float("nan") for f in folds]
    aurocs = [f[2] for f in folds if f[2] is not None]
    bounds = [f[3] for f in folds if f[2] is not None and f[3] is not None]
    return {"logloss": loss / n if n else float("nan"), "fold_logloss": fold_ll,
            "logloss_se": float(np.std(fold_ll, ddof=1) / np.sqrt(len(fold_ll))) if len(fold_ll) > 1 else None,
            "auroc": float(np.mean(aurocs)) if aurocs else None,
            "fold_auroc": [f[2] for f in folds],
            "auroc_se": float(np.std(aurocs, ddof=1) / np.sqrt(len(aurocs))) if len(aurocs) > 1 else None,
            "auroc_error_bound": float(max(bounds)) if bounds else None,
            "rows": int(n)}


def per_site_cv(sums: Sequence[SlotSums]) -> dict[str, dict[str, float | None]]:
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


def test_metrics(slot_sums: SlotSums, smoothed: bool) -> dict[str, Any]:
    flags: bool | set[str] = True if smoothed else {s for s, v in slot_sums.items() if v[5]}
    metrics = pool_evaluations({s: v[:4] for s, v in slot_sums.items()}, smoothed=flags)
    n = sum(float(v[0].sum()) for v in slot_sums.values())
    metrics["pooled"]["logloss"] = sum(v[4] for v in slot_sums.values()) / n if n else None
    for s, v in slot_sums.items():
        k = float(v[0].sum())
        metrics["per_site"][s]["logloss"] = v[4] / k if k else None
    return metrics
