"""Evaluation: a model's sums on a part at every site, pooled into the federation's scores.

* site side, ``"evaluate"`` — the evaluation sums of a classifier on a part (confusion matrix,
  Brier sum, score histogram, the site's own rank pairs: :func:`evaluation_sums`), and
  ``"regression_evaluate"`` — a regression model's SSE, SAE, Σy, Σy² and rows;
* server side, :func:`evaluate` / :func:`evaluate_regression` — the sums through the run's
  summing strategy, each reply checked (:func:`checked_sums`), pooled (:func:`pool_evaluations`),
  with the pooled ranking scores exact or bounded (:func:`fedtab.learn.metrics.pooled_ranking`).
"""

from __future__ import annotations

from typing import Any, Callable, Collection, Literal, Mapping

import numpy as np

from fedtab.federation.protocol import SECURE_SUM, Federation, FederationError, Summed, SumSpec, validate
from fedtab.federation.protocol.kinds import declared as _declared
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.modes import NoisyRelease, SumStep, run_strategy
from fedtab.federation.protocol.reduce import (
    site_median,
)
from fedtab.federation.site.core import Site
from fedtab.federation.site.mods import site_params
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import (
    prepared_matrix,
    requested_bins,
)
from fedtab.federation.steps.params import params_from, params_to
from fedtab.learn.metrics import (
    REGRESSION_SUMS,
    brier_sum,
    confusion,
    evaluation_scores,
    pooled_ranking,
    rank_pairs,
    regression_scores,
    regression_sums,
    score_histogram,
)
from fedtab.learn.models import FederatedModel, Params, make_model
from fedtab.privacy.accountant import PrivacyLedger
from fedtab.privacy.gate import SMOOTHED
from fedtab.privacy.secagg import MOMENT_BITS


__all__ = ["evaluation_sums", "checked_sums", "pool_evaluations", "was_smoothed", "smoothed_sites", "evaluate_step", "evaluate", "median_scores", "pool_regression", "regression_checker", "evaluate_regression_step", "evaluate_regression", "EVALUATE_RELEASES"]


def evaluation_sums(model: FederatedModel, params: Params, X: np.ndarray, y: np.ndarray, n_classes: int,
                    bins: int | None, pairs: bool = True) -> dict[str, np.ndarray]:
    """A site's evaluation sums on ``(X, y)``: ``confusion`` and, when ``bins`` is set and the
    model has ``predict_proba``, ``brier_sum`` (shape ``(1,)``) and, for two classes,
    ``score_hist`` ``(2, bins)`` (:func:`fedtab.learn.metrics.score_histogram`) and
    ``rank_pairs`` ``(1,)`` (:func:`fedtab.learn.metrics.rank_pairs`; not with ``pairs=False``, as
    in a secure sum, where the pooled histogram is exact and a per-site count would be left over)."""
    pred = model.predict(params, X) if len(y) else np.zeros(0, dtype=np.int64)
    out = {"confusion": confusion(y, pred, n_classes)}
    proba_of = getattr(model, "predict_proba", None)
    if bins is not None and proba_of is not None:
        proba = proba_of(params, X) if len(y) else np.zeros((0, n_classes))
        out["brier_sum"] = np.array([brier_sum(y, proba)])
        if n_classes == 2:
            out["score_hist"] = score_histogram(y, np.clip(proba[:, 1], 0.0, 1.0), bins)
            if pairs:
                out["rank_pairs"] = np.array([rank_pairs(y, proba[:, 1])])  # the site's own pairs, exactly
    return out


#: an evaluation: per-class counts of the part (classes below min_rows refused), score
#: histograms smoothed to runs of min_rows rows
EVALUATE_RELEASES = _declared("evaluate").releases  # declared in fedtab.federation.protocol.kinds


@handler("evaluate")
def _evaluate(site: Site, request: Message) -> Message:
    part = request.meta.get("part") or "test"
    X, y = prepared_matrix(site, part)
    setup = site.state["train_setup"]
    model = make_model(setup["model"])
    sums = evaluation_sums(model, params_from(request), X, y, len(setup["classes"]), requested_bins(request.meta),
                           pairs=not site_params(request).get("masked"))  # masked: set by the secure mod
    # the exact sums: under DP the site noises them at the sensitivities the kind declares
    # (``Releases.dp_noise`` in fedtab.federation.protocol.kinds), after this handler
    return Message("evaluate", sums, {"n": int(len(y))})


@handler("regression_evaluate")
def _regression_evaluate(site: Site, request: Message) -> Message:
    """A regression model's ``sse``, ``sae``, ``sum_y``, ``sum_y2`` ``(1,)`` each on a part (the test
    part by default; :func:`fedtab.learn.metrics.regression_sums`), and its rows ``n``."""
    setup = site.state.get("train_setup") or {}
    if setup.get("task") != "regression":
        raise ValueError("regression_evaluate scores a regression model; this site was set up for classes")
    X, y = prepared_matrix(site, str(request.meta.get("part") or "test"))
    model = make_model(setup["model"])
    pred = model.predict(params_from(request), X) if len(y) else np.zeros(0)
    sums = regression_sums(y, pred)
    return Message("regression_evaluate", {k: np.array([v]) for k, v in sums.items()}, {"n": int(len(y))})


# ----------------------------------------------------------------------------- evaluate
def _counts(value: Any, shape: tuple[int, int]) -> np.ndarray | None:
    """``value`` as int64 counts of ``shape``, or None when it is not (negative, fractional, NaN)."""
    a = np.asarray(value) if value is not None else np.zeros(0)
    if a.shape != shape or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        return None
    if not np.isfinite(a).all() or (a < 0).any() or (a != np.round(a)).any():
        return None
    return a.astype(np.int64)


def checked_sums(name: str, reply: Message, n_classes: int, bins: int | None) -> tuple[np.ndarray, Any, Any, Any]:
    """``(confusion, score_hist or None, brier_sum or None, rank_pairs or None)`` of a site's
    evaluation reply.

    Raises:
        FederationError: naming ``name``, when the confusion matrix is not ``(C, C)``
            non-negative integer counts, or a score histogram / Brier sum / rank pairs do not
            match it (shape, counts per class, range ``0 ≤ brier_sum ≤ 2·n``).
    """
    cm = _counts(reply.arrays.get("confusion"), (n_classes, n_classes))
    if cm is None:
        shape = np.shape(reply.arrays.get("confusion"))
        raise FederationError(f"site {name!r}: invalid confusion matrix of shape {shape}, expected "
                              f"({n_classes}, {n_classes}) non-negative counts")
    hist = brier = None
    if bins is not None and "score_hist" in reply.arrays:
        # counts spread evenly over runs of bins by the site's release gate: non-negative, not integers
        h = np.asarray(reply.arrays["score_hist"])
        totals = cm.sum(axis=1)
        ok = (n_classes == 2 and h.shape == (2, bins) and h.dtype.kind in "iuf" and bool(np.isfinite(h).all())
              and not (h < 0).any()
              # a secure sum rounds each bin to 2**-16: within 1e-3 over 1,000s of bins
              and bool(np.all(np.abs(h.sum(axis=1, dtype=np.float64) - totals) <= 1e-6 * np.maximum(totals, 1)
                              + bins * 2.0 ** -MOMENT_BITS)))
        if not ok:
            raise FederationError(f"site {name!r}: score histogram of shape {h.shape} does not match its confusion "
                                  f"matrix (expected (2, {bins}) non-negative counts with the same class totals)")
        hist = h.astype(np.float64)
    if bins is not None and "brier_sum" in reply.arrays:
        b = np.asarray(reply.arrays["brier_sum"], dtype=np.float64)
        if b.shape != (1,) or not np.isfinite(b).all() or not 0 <= b[0] <= 2 * cm.sum() + 1e-9:
            raise FederationError(f"site {name!r}: invalid Brier sum {b.tolist()} for {int(cm.sum())} rows")
        brier = float(b[0])
    pairs = None
    if hist is not None and "rank_pairs" in reply.arrays:
        r = np.asarray(reply.arrays["rank_pairs"], dtype=np.float64)
        most = float(cm[1].sum()) * float(cm[0].sum())
        if r.shape != (1,) or not np.isfinite(r).all() or not -1e-9 <= r[0] <= most * (1 + 1e-12) + 1e-9:
            raise FederationError(f"site {name!r}: invalid rank pairs for {int(cm[1].sum())} positives and "
                                  f"{int(cm[0].sum())} negatives")
        pairs = float(r[0])
    return cm, hist, brier, pairs


def pool_evaluations(sums: Mapping[str, tuple[Any, ...]], smoothed: bool | Collection[str] = False
                     ) -> dict[str, Any]:
    """``{"pooled", "per_site"}`` of :func:`~fedtab.learn.metrics.evaluation_scores` from the sites'
    checked sums ``(confusion, score_hist, brier_sum[, rank_pairs])``; a ranking or Brier metric is
    pooled only when every site sent its sum.

    The pooled AUROC / PR-AUC come with ``*_bounds`` ``[lo, hi]`` that hold
    (:func:`~fedtab.learn.metrics.pooled_ranking`): pairs of rows inside a site that sent its
    exact ``rank_pairs`` count exactly, every other pair from the histograms' bins, or — for a
    site whose release gate smoothed its histogram (:func:`fedtab.privacy.gate.smooth_histogram`)
    — from its runs of bins (a pair whose two runs overlap is unknown, between 0 and 1).

    ``smoothed``: the names of the sites whose histograms were smoothed (:func:`smoothed_sites`),
    or one flag for all (``True`` is always safe: runs are then inferred from every histogram,
    bounds are only wider).
    """
    flags = {name: (bool(smoothed) if isinstance(smoothed, bool) else name in smoothed) for name in sums}
    per_site = {name: evaluation_scores(*s[:4], smoothed=flags[name]) for name, s in sums.items()}
    parts = list(zip(*sums.values()))
    pooled = [sum(p[1:], p[0]) if all(v is not None for v in p) else None for p in parts]
    out = {"pooled": evaluation_scores(pooled[0], None, *pooled[2:3]), "per_site": per_site}
    if len(parts) > 1 and pooled[1] is not None:
        pairs = parts[3] if len(parts) > 3 else [None] * len(sums)
        out["pooled"].update(pooled_ranking(parts[1], pairs, [flags[n] for n in sums]))
    return out


def was_smoothed(replies: Mapping[str, Message]) -> bool:
    """Whether any reply says its release gate smoothed a histogram."""
    return any(r.meta.get(SMOOTHED) is True for r in replies.values())


def smoothed_sites(replies: Mapping[str, Message]) -> set[str]:
    """The sites whose reply says their release gate smoothed a histogram."""
    return {s for s, r in replies.items() if r.meta.get(SMOOTHED) is True}


def _tidy_total(message: Message) -> Message:
    """A summed evaluation as counts: the confusion matrix rounded (a secure sum's fixed point),
    the other sums floored at 0; a site's exact reply (validated counts) is unchanged."""
    return Message("evaluate", {k: np.rint(v) if k == "confusion" else np.maximum(v, 0.0)
                                for k, v in message.arrays.items()}, dict(message.meta))


def _noisy_confusion(message: Message) -> tuple[Message, int]:
    """Post-processing of a noisy confusion matrix: rounded, floored at 0 (``(message, cells floored)``)."""
    cm = np.rint(np.asarray(message.arrays["confusion"], dtype=np.float64))
    return Message("evaluate", {"confusion": np.maximum(cm, 0)}), int((cm < 0).sum())


def evaluate_step(federation: Federation, params: Params, n_classes: int, part: str = "test",
                  bins: int | None = None, *, has_proba: bool = False, kind: str = "evaluate") -> SumStep[dict[str, Any]]:
    """The evaluation's configure/aggregate pair (see :func:`evaluate`)."""

    def pair(bins: int | None, check_counts: bool) -> SumStep[dict[str, Any]]:
        meta: dict[str, Any] = {"part": part}
        if bins is not None:
            meta["score_bins"] = bins

        def check(site: str, reply: Message) -> None:
            assert federation.schema is not None
            n = federation.schema.rows(site, part)
            validate.integer(reply.meta.get("n"), "evaluated rows", equal=n)
            if "confusion" in reply.arrays:
                validate.confusion_matrix(reply, n_classes, n)  # sums to the rows the site declared
                checked_sums(site, reply, n_classes, bins)

        def check_shape(site: str, reply: Message) -> None:
            if "confusion" in reply.arrays:  # masked under secure aggregation: the sum is checked
                validate.array(reply, "confusion", (n_classes, n_classes))  # noisy: shape and finiteness only

        fields: dict[str, int | None] = {"confusion": 0 if check_counts else MOMENT_BITS}
        if bins is not None and has_proba:
            fields["brier_sum"] = MOMENT_BITS
            if n_classes == 2:  # smoothed by the sites' release gates: fractional counts
                fields["score_hist"] = MOMENT_BITS

        def aggregate(summed: Summed) -> dict[str, Any]:
            parts = {k: _tidy_total(m) if k not in summed.replies else m for k, m in summed.parts.items()}
            smoothed = {k for k in parts if any(summed.replies[s].meta.get(SMOOTHED) is True
                                                for s in ([k] if k in summed.replies else summed.sites)
                                                if s in summed.replies)}
            metrics = pool_evaluations({k: checked_sums(k, m, n_classes, bins) for k, m in parts.items()},
                                       smoothed=smoothed)
            metrics["per_site"] = {k: v for k, v in metrics["per_site"].items() if k in summed.replies}
            return metrics

        def robust(summed: Summed) -> tuple[dict[str, Any], dict[str, str]]:
            metrics = aggregate(summed)
            metrics["pooled"] = {**metrics["pooled"], **median_scores(metrics["per_site"])}
            return metrics, {}

        return SumStep(Message(kind, params_to(params), meta), SumSpec(fields),
                       check if check_counts else check_shape, aggregate, robust, kind=kind)

    exact = pair(bins, True)
    exact.noisy = NoisyRelease(pair(None, False), "training.evaluate", denoise=_noisy_confusion)  # no histograms
    return exact


def evaluate(federation: Federation, params: Params, n_classes: int, part: str = "test", bins: int | None = None,
             *, has_proba: bool = False, ledger: PrivacyLedger | None = None,
             on_error: Literal["raise", "skip"] | None = None, kind: str = "evaluate") -> dict[str, Any]:
    """The evaluation exchange on the run's strategy: ``{"pooled", "per_site"}`` metrics
    (:func:`pool_evaluations`).

    ``kind``: the request's kind (another workflow's handler that replies the same sums, e.g.
    ``"gbdt_evaluate"``).

    Plain: per site and pooled. Secure: the pooled sums only (``per_site`` is empty). DP: the
    confusion matrices are noisy releases (rounded and floored at 0 here); no histograms.
    Robust: every scalar pooled metric is the median over the sites (:func:`median_scores`).

    Raises:
        ValueError: DP without the run's accountant (``ledger``).
    """
    pair = evaluate_step(federation, params, n_classes, part, bins, has_proba=has_proba, kind=kind)
    return run_strategy(federation, ledger).run(federation, pair, on_error=on_error).result


def median_scores(per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Robust pooled scores: every scalar metric's median over the sites that scored rows
    (one vote per site; a metric some site lacks is left out); ``n`` is their total. The AUROC's
    and PR-AUC's ``*_bounds`` are the medians of the sites' bounds (they hold the median of the
    sites' exact values)."""
    scored = [m for m in per_site.values() if m["n"] > 0] or list(per_site.values())
    out: dict[str, Any] = {}
    for k in scored[0]:
        values = [m.get(k) for m in scored]
        if k != "n" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[k] = float(site_median(np.array(values, dtype=np.float64)))
    for k in ("auroc", "pr_auc"):  # the median is monotone: medians of the bounds bound the median
        bounds = [m.get(f"{k}_bounds") for m in scored]
        if k in out and all(isinstance(b, list) and len(b) == 2 for b in bounds):
            lo, hi = (float(site_median(np.array(v, dtype=np.float64))) for v in zip(*bounds))
            out[f"{k}_bounds"], out[f"{k}_error_bound"] = [lo, hi], max(out[k] - lo, hi - out[k])
    out["n"] = int(sum(m["n"] for m in scored))
    return out


# ----------------------------------------------------------------------------- regression
def pool_regression(sums: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """``{"pooled", "per_site"}`` RMSE / MAE / R² / n from per-site ``{sse, sae, sum_y, sum_y2, n}``
    (:func:`fedtab.learn.metrics.regression_scores`): pooled = the scores of the summed terms,
    i.e. exactly the metrics of every site's test rows together. A :data:`SECURE_SUM` entry
    is the total (no per-site scores); a site with no rows in the part has none either."""
    total = {k: float(sum(s[k] for s in sums.values())) for k in (*REGRESSION_SUMS, "n")}
    pooled = regression_scores(total["sse"], total["sae"], total["sum_y"], total["sum_y2"], total["n"])
    per_site = {site: regression_scores(s["sse"], s["sae"], s["sum_y"], s["sum_y2"], s["n"])
                for site, s in sums.items() if site != SECURE_SUM and s["n"] > 0}  # a site with no rows: no scores
    return {"pooled": pooled, "per_site": per_site}


def regression_checker(federation: Federation, part: str) -> Callable[[str, Message], None]:
    """Validator of regression sums: the rows the site declared for ``part``, and (sent in the
    clear) finite sums with ``sse, sae, sum_y2 >= 0``, ``sae² <= n·sse`` and ``sum_y² <= n·sum_y2``."""

    def check(site: str, reply: Message) -> None:
        assert federation.schema is not None
        n = validate.integer(reply.meta.get("n"), "evaluated rows", equal=federation.schema.rows(site, part))
        if not all(k in reply.arrays for k in REGRESSION_SUMS):
            return  # masked: the total is checked
        v = {k: validate.array(reply, k, (1,))[0] for k in REGRESSION_SUMS}
        _check_regression_sums(v, n)

    return check


def _check_regression_sums(v: Mapping[str, float], n: float) -> None:
    if not all(np.isfinite(float(x)) for x in v.values()):
        raise ValueError("regression sums must be finite")
    tol = 1e-9 * max(1.0, abs(float(v["sse"])), abs(float(v["sum_y2"])), float(v["sae"]) ** 2)
    if min(v["sse"], v["sae"], v["sum_y2"]) < -tol or v["sae"] ** 2 > n * v["sse"] + tol * max(n, 1) \
            or v["sum_y"] ** 2 > n * v["sum_y2"] + tol * max(n, 1):
        raise ValueError("regression sums are inconsistent (negative or impossible for the rows)")


def evaluate_regression_step(federation: Federation, params: Params, part: str = "test", *,
                             kind: str = "regression_evaluate", meta: Mapping[str, Any] | None = None
                             ) -> SumStep[dict[str, Any]]:
    """The regression evaluation's configure/aggregate pair (see :func:`evaluate_regression`);
    no DP release (the run's noisy strategy refuses it)."""
    assert federation.schema is not None
    schema = federation.schema

    def aggregate(summed: Summed) -> dict[str, Any]:
        sums: dict[str, dict[str, float]] = {}
        for key, reply in summed.parts.items():
            if key in summed.replies:  # one site's own sums
                sums[key] = {**{k: float(reply.arrays[k][0]) for k in REGRESSION_SUMS}, "n": float(reply.meta["n"])}
            else:  # the secure total over the sites that answered
                total = {k: float(np.asarray(reply.arrays[k]).ravel()[0]) for k in REGRESSION_SUMS}
                n = float(sum(schema.rows(s, part) for s in summed.replies))
                _check_regression_sums(total, n)
                sums[SECURE_SUM] = {**total, "n": n}
        return pool_regression(sums)

    def robust(summed: Summed) -> tuple[dict[str, Any], dict[str, str]]:
        return aggregate(summed), {}  # sums of a fixed part: no outlier-robust reduction here

    return SumStep(Message(kind, params_to(params), {"part": part, **dict(meta or {})}),
                   SumSpec({k: MOMENT_BITS for k in REGRESSION_SUMS}), regression_checker(federation, part),
                   aggregate, robust, kind=kind)


def evaluate_regression(federation: Federation, params: Params, part: str = "test", *,
                        kind: str = "regression_evaluate", meta: Mapping[str, Any] | None = None,
                        on_error: Literal["raise", "skip"] | None = None) -> dict[str, Any]:
    """The regression evaluation exchange on the run's strategy (``kind``:
    ``"regression_evaluate"`` or GBDT's ``"gbdt_score"``): ``{"pooled", "per_site"}`` RMSE /
    MAE / R² (:func:`pool_regression`).

    Plain: per site and pooled; secure: the pooled sums only (``per_site`` empty); robust: the
    pooled sums too (sums of squares of a fixed part have no outlier-robust reduction here).

    Raises:
        ValueError: under DP (the step has no noisy release: the run's noisy strategy refuses it
            before the request goes out).
        FederationError: as the exchange.
    """
    pair = evaluate_regression_step(federation, params, part, kind=kind, meta=meta)
    return run_strategy(federation, None).run(federation, pair, on_error=on_error).result
