"""The model-selection workflow's site side: three handlers, each answering for every
candidate and fold at once (so selection costs a few exchanges, not a multiple).

* ``"select_prepare"`` — the site's ballots on each of its cross-validation fit parts
  (``fit:0`` … ``fit:K-1``) and on its training part, over the columns it *measures* in
  every one of those parts (imputed cells are no evidence, :mod:`fedtab.federation.site.observed`;
  a column unmeasured in one fold's fit rows is in none of the site's ballots); a part with one
  class gets no ballot (``voted`` false); per column of its
  table the measured and still-missing cells of its training rows; and the count / sum /
  sum of squares of every column on each of those parts (the standardisation of every
  chain). Arrays ``ballot_mask`` / ``ballot_scores`` ``(P, m)``, ``voted`` ``(P,)``,
  ``measured_count`` / ``missing_count`` ``(d,)``, ``moment_count`` / ``moment_sum`` /
  ``moment_sumsq`` ``(P, d)``; ``P = K + 1`` (the folds, then ``train``).
* ``"select_fit"`` — one FedAvg round of every *chain* (a mask, a fold, and optionally the
  site a leave-one-site-out chain trains without): the first request carries the setup.
  A chain trains on ``fit:k`` (``train`` for the refit chains ``k = -1`` and for folds the
  site does not have); a site that a chain leaves out, or that has no rows for it,
  returns zeros. Arrays ``param:coef`` ``(M, k, d)``, ``param:intercept`` ``(M, k)``, full
  width with zeros outside each chain's mask.
* ``"select_evaluate"`` — for each requested *slot* (a chain and a personalisation mode,
  :mod:`fedtab.learn.personalise`) the evaluation sums on the chain's held-out rows
  (``fold:k``; ``test`` for ``stage = "test"``): log-loss sum, confusion matrix, Brier sum,
  exact rank pairs and score histogram rows (:func:`histogram_slots`); a site without folds
  answers a cross-validation request with zeros (it abstains, :func:`_evaluate_part`). A personalisation is fitted on the chain's
  training rows of this site only. With ``send_personal`` the site also returns its
  personalised parameters of one slot (``param:site:*``), for the model file.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np

from fedtab.learn.metrics import brier_sum, confusion, rank_pairs, regression_sums, score_histogram
from fedtab.learn.models import LinearRegressionModel, LogisticRegressionModel, make_model
from fedtab.learn.personalise import check_mode, log_loss_sum, personalise, personalised_proba
from fedtab.federation.site.data import fill_with_column_means, numeric_matrix
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.observed import measured_frame, measured_matrix
from fedtab.federation.protocol.kinds import declared as _declared
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import class_indices, regression_targets, site_matrix

__all__ = ["PREPARE_RELEASES", "FIT_RELEASES", "EVALUATE_RELEASES", "chain_parts", "SETUP_KEY", "histogram_slots"]

#: ``Site.state`` key of the chains' setup (features, classes, masks, standardisations)
SETUP_KEY = "select_setup"
_CACHE = "_select_cache"  # process-local: raw matrices per part


def _fit_part(site: Site, fold: int) -> str:
    return f"fit:{fold}" if 0 <= fold < site.parts.n_folds else "train"


def chain_parts(site: Site, fold: int, stage: str = "cv") -> tuple[str, str | None]:
    """``(training part, held-out part or None)`` of a chain of ``fold`` at ``site``:
    ``fit:k``/``fold:k`` when the site has fold ``k``, else ``train``/none; the refit chains
    (``fold = -1``) train on ``train`` and (stage ``"test"``) are scored on ``test``."""
    if stage == "test":
        return "train", "test"
    if 0 <= fold < site.parts.n_folds:
        return f"fit:{fold}", f"fold:{fold}"
    return "train", None


# ----------------------------------------------------------------------------- prepare
#: ballots, measured counts and moments over the training rows and its folds
PREPARE_RELEASES = _declared("select_prepare").releases  # declared in fedtab.federation.protocol.kinds


@handler("select_prepare")
def _prepare(site: Site, request: Message) -> Message:
    from fedtab.federation.workflows.election.site import abstention_reason
    from fedtab.election.selectors import make_selector

    spec = request.meta.get("selector")
    selector = make_selector(spec if spec is not None else site.selector)
    columns = site.feature_names
    K = site.parts.n_folds
    parts = [f"fit:{k}" for k in range(K)] + ["train"]
    measured_train = measured_matrix(site, columns, "train")
    # the site votes, in every part, on the columns it measures in every part's rows: a column
    # unmeasured in one fold's fit rows is no candidate of that site's ballots at all (so each fold's
    # election is the final election's procedure on fewer rows, and every ballot has the same columns)
    measured_everywhere = measured_train.any(axis=0)
    for part in parts[:-1]:
        measured_everywhere &= measured_matrix(site, columns, part).any(axis=0)
    voting = [c for c, m in zip(columns, measured_everywhere) if m]
    P, m, d = len(parts), len(voting), len(columns)
    masks, scores, voted = np.zeros((P, m), bool), np.zeros((P, m)), np.zeros(P, bool)
    mcount, msum, msq = np.zeros((P, d), np.int64), np.zeros((P, d)), np.zeros((P, d))
    for p, part in enumerate(parts):
        frame, y = site.xy(part, columns)
        X = numeric_matrix(frame, site.name)
        obs = ~np.isnan(X)
        Xz = np.where(obs, X, 0.0)
        mcount[p], msum[p], msq[p] = obs.sum(axis=0), Xz.sum(axis=0), (Xz * Xz).sum(axis=0)
        if m and abstention_reason(y) is None:
            Xv = fill_with_column_means(numeric_matrix(measured_frame(site, frame[voting], part), site.name))
            if Xv.shape[1] != m:  # pragma: no cover - every voting column is measured in every part
                raise ValueError("select_prepare: a voting column is unmeasured in a part")
            sel = selector.select(Xv, y)
            masks[p], scores[p], voted[p] = np.asarray(sel.mask, bool), np.asarray(sel.scores, np.float64), True
    X_train = numeric_matrix(site.xy("train", columns)[0], site.name)
    return Message("select_prepare",
                   {"ballot_mask": masks, "ballot_scores": scores, "voted": voted,
                    "measured_count": measured_train.sum(axis=0).astype(np.int64),
                    "missing_count": np.isnan(X_train).sum(axis=0).astype(np.int64),
                    "moment_count": mcount, "moment_sum": msum, "moment_sumsq": msq},
                   {"feature_names": voting, "columns": columns, "n_folds": K, "selector": selector.name})


# ----------------------------------------------------------------------------- setup and fit
def _store_setup(site: Site, meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    features, classes = list(meta["features"]), [str(c) for c in meta["classes"]]
    masks = np.asarray(arrays["setup:masks"], dtype=bool)
    chain_mask = np.asarray(arrays["setup:chain_mask"], dtype=np.int64)
    chain_fold = np.asarray(arrays["setup:chain_fold"], dtype=np.int64)
    mean, std = np.asarray(arrays["setup:mean"], np.float64), np.asarray(arrays["setup:std"], np.float64)
    l2 = np.asarray(arrays["setup:chain_l2"], np.float64)
    without = list(meta["without"])
    M, d = len(chain_mask), len(features)
    if masks.ndim != 2 or masks.shape[1] != d or chain_fold.shape != (M,) or mean.shape != (M, d) \
            or std.shape != (M, d) or l2.shape != (M,) or len(without) != M or (M and (chain_mask.min() < 0
                                                                  or chain_mask.max() >= len(masks))):
        raise ValueError("select setup: the chain arrays do not fit the features")
    if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
        raise ValueError("select setup: the standardisation must be finite with positive std")
    if not (np.isfinite(l2).all() and (l2 >= 0).all()):
        raise ValueError("select setup: the L2 strengths must be finite and non-negative")
    model = make_model(meta["model"])
    regression = isinstance(model, LinearRegressionModel)
    if not (isinstance(model, LogisticRegressionModel) or regression and not classes):
        raise ValueError("model selection trains logistic regression (classes) or linear regression (no classes)")
    setup = {"task": "regression" if regression else "classes","features": features, "classes": classes, "masks": masks, "chain_mask": chain_mask,
             "chain_fold": chain_fold, "mean": mean, "std": std, "l2": l2, "without": without,
             "model": meta["model"]}
    site.state[SETUP_KEY] = setup
    site.state.pop(_CACHE, None)
    return setup


def _setup(site: Site) -> dict[str, Any]:
    setup = site.state.get(SETUP_KEY)
    if setup is None:
        raise ValueError("model selection is not set up on this site (no setup received)")
    return setup


def _raw(site: Site, setup: Mapping[str, Any], part: str) -> tuple[np.ndarray, np.ndarray]:
    cache = site.state.setdefault(_CACHE, {})
    if part not in cache:
        X, y_raw = site_matrix(site, setup["features"], part)
        cache[part] = (X, regression_targets(y_raw) if setup["task"] == "regression"
                       else class_indices(y_raw, setup["classes"]))
    return cache[part]


def _chain_matrix(site: Site, setup: Mapping[str, Any], m: int, part: str) -> tuple[np.ndarray, np.ndarray]:
    """Standardised rows of ``part`` over chain ``m``'s mask, and their class indices."""
    X, y = _raw(site, setup, part)
    mask = setup["masks"][setup["chain_mask"][m]]
    Z = (X[:, mask] - setup["mean"][m, mask]) / setup["std"][m, mask]
    Z[np.isnan(Z)] = 0.0
    return Z, y


def _chain_model(setup: Mapping[str, Any], m: int) -> LogisticRegressionModel:
    """Chain ``m``'s model: the agreed logistic regression with the chain's L2 strength."""
    base = make_model(setup["model"])
    return LogisticRegressionModel(l2=float(setup["l2"][m]), mu=getattr(base, "mu", 0.0))


def _chain_params(arrays: Mapping[str, np.ndarray], m: int, mask: np.ndarray) -> dict[str, np.ndarray]:
    return {"coef": np.asarray(arrays["param:coef"][m], np.float64)[:, mask],
            "intercept": np.asarray(arrays["param:intercept"][m], np.float64)}


#: one round's updates of every chain (model parameters over the training rows)
FIT_RELEASES = _declared("select_fit").releases  # declared in fedtab.federation.protocol.kinds


@handler("select_fit")
def _fit(site: Site, request: Message) -> Message:
    setup = _store_setup(site, request.meta["setup"], request.arrays) if "setup" in request.meta else _setup(site)
    coef = np.asarray(request.arrays["param:coef"], np.float64)
    intercept = np.asarray(request.arrays["param:intercept"], np.float64)
    M, d = len(setup["chain_mask"]), len(setup["features"])
    if coef.ndim != 3 or coef.shape[0] != M or coef.shape[2] != d or intercept.shape != coef.shape[:2]:
        raise ValueError("select_fit: the parameters do not have the chains' shapes")
    if setup["task"] == "regression":
        return _fit_statistics(site, setup)
    out_coef, out_b = np.zeros_like(coef), np.zeros_like(intercept)
    epochs = int(request.meta.get("epochs", 1))
    for m, Z, y in _trained_chains(site, setup):
        mask = setup["masks"][setup["chain_mask"][m]]
        p = _chain_model(setup, m).local_update(_chain_params(request.arrays, m, mask), Z, y, epochs=epochs)
        out_coef[m][:, mask], out_b[m] = p["coef"], p["intercept"]
    return Message("select_fit", {"param:coef": out_coef, "param:intercept": out_b})


def _trained_chains(site: Site, setup: Mapping[str, Any]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """``(m, Z, y)`` of every chain ``site`` trains: not one that leaves the site out, nor one whose
    training part holds no row here (:func:`chain_parts`, :func:`_chain_matrix`)."""
    for m in range(len(setup["chain_mask"])):
        if setup["without"][m] == site.name:
            continue
        part, _ = chain_parts(site, int(setup["chain_fold"][m]))
        Z, y = _chain_matrix(site, setup, m, part)
        if len(y):
            yield m, Z, y


def _fit_statistics(site: Site, setup: Mapping[str, Any]) -> Message:
    """A regression selection's one fit exchange: every chain's normal-equation statistics
    (:meth:`~fedtab.learn.models.LinearRegressionModel.local_update`) over its training part,
    full width (index 0 the intercept, zeros outside the chain's mask; zeros for a chain the site
    does not train): ``param:count`` ``(M,)``, ``param:xtx`` ``(M, d+1, d+1)``, ``param:xty`` ``(M, d+1)``."""
    M, d = len(setup["chain_mask"]), len(setup["features"])
    count, xtx, xty = np.zeros(M), np.zeros((M, d + 1, d + 1)), np.zeros((M, d + 1))
    for m, Z, y in _trained_chains(site, setup):
        idx = np.concatenate([[0], 1 + np.flatnonzero(setup["masks"][setup["chain_mask"][m]])])
        st = LinearRegressionModel().local_update({}, Z, y)
        count[m] = st["count"][0]
        xtx[m][np.ix_(idx, idx)], xty[m][idx] = st["xtx"], st["xty"]
    return Message("select_fit", {"param:count": count, "param:xtx": xtx, "param:xty": xty})


# ----------------------------------------------------------------------------- evaluate
def _evaluate_part(site: Site, request: Message) -> str | None:
    """The part the release gate checks a ``select_evaluate`` reply against: the test rows, or
    the training rows (the union of the folds it scores on); ``None`` for a cross-validation
    request at a site without folds — it scores no slot (every slot's sums are zeros) and
    sends no model, so it releases nothing computed over rows and abstains instead of refusing."""
    if request.meta.get("stage") == "test":
        return "test"
    if site.parts.n_folds == 0 and request.meta.get("send_personal") is None:
        return None
    return "train"


#: per slot: evaluation sums over a held-out part (a fold of the training rows, or the test rows)
EVALUATE_RELEASES = _declared("select_evaluate").releases  # declared in fedtab.federation.protocol.kinds


def histogram_slots(slots: list[tuple[int, str]], stage: str) -> list[int]:
    """The slots whose reply carries score histogram rows: in the cross-validation the
    unpersonalised ones (mode ``"none"``: the candidates' and the leave-one-site-out AUROCs;
    a personalised slot's AUROC is per site, from its exact rank pairs), on the test rows all."""
    return [e for e, (_, mode) in enumerate(slots) if stage == "test" or mode == "none"]


def _slots(meta: Mapping[str, Any], M: int) -> list[tuple[int, str]]:
    slots = meta.get("slots")
    if not isinstance(slots, list):
        raise ValueError("select_evaluate needs a list of [chain, mode] slots")
    out = []
    for s in slots:
        if not (isinstance(s, list) and len(s) == 2 and isinstance(s[0], int) and 0 <= s[0] < M):
            raise ValueError("a slot is [chain index, personalisation mode]")
        out.append((int(s[0]), check_mode(s[1])))
    return out


@handler("select_evaluate")
def _evaluate(site: Site, request: Message) -> Message:
    setup = _setup(site)
    meta = request.meta
    stage = "test" if meta.get("stage") == "test" else "cv"
    if setup["task"] == "regression":
        return _evaluate_regression(site, setup, request, stage)
    C = len(setup["classes"])
    M = len(setup["chain_mask"])
    bins = meta.get("score_bins")
    slots = _slots(meta, M)
    pers = meta.get("personal") or {}
    epochs = int(pers.get("epochs", 50))
    local_epochs = int(pers.get("local_epochs", epochs))
    E = len(slots)
    logloss, brier, pairs = np.zeros(E), np.zeros(E), np.zeros(E)
    cms = np.zeros((E, C, C), np.int64)
    with_hist = {e: h for h, e in enumerate(histogram_slots(slots, stage))}
    hist = np.zeros((2 * len(with_hist), bins)) if (bins and C == 2) else None
    fitted: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    send = meta.get("send_personal")
    for e, (m, mode) in enumerate(slots):
        fold = int(setup["chain_fold"][m])
        if stage == "test" and fold != -1:
            raise ValueError("the test stage scores refit chains only")
        fit_part, held = chain_parts(site, fold, stage)
        if held is None:
            continue
        mask = setup["masks"][setup["chain_mask"][m]]
        params = _chain_params(request.arrays, m, mask)
        Zt, yt = _chain_matrix(site, setup, m, held)
        if not len(yt):
            continue
        if (m, mode) not in fitted:
            Zf, yf = _chain_matrix(site, setup, m, fit_part) if mode != "none" else (None, None)
            fitted[(m, mode)] = {} if mode == "none" else personalise(
                mode, params, Zf, yf, l2=float(setup["l2"][m]), epochs=local_epochs if mode == "local" else epochs)
        proba = personalised_proba(mode, params, fitted[(m, mode)] if mode != "none" else None, Zt)
        logloss[e] = log_loss_sum(yt, proba)
        cms[e] = confusion(yt, np.argmax(proba, axis=1), C)
        brier[e] = brier_sum(yt, proba)
        if C == 2:
            p1 = np.clip(proba[:, 1], 0.0, 1.0)
            pairs[e] = rank_pairs(yt, p1)
            if hist is not None and e in with_hist:
                h = with_hist[e]
                hist[2 * h:2 * h + 2] = score_histogram(yt, p1, bins)
    arrays: dict[str, np.ndarray] = {"logloss_sum": logloss, "confusion": cms, "brier_sum": brier,
                                     "rank_pairs": pairs}
    if hist is not None:
        arrays["score_hist"] = hist
    if isinstance(send, list) and len(send) == 2:
        key = (int(send[0]), check_mode(send[1]))
        if not 0 <= key[0] < M:
            raise ValueError("send_personal names no chain")
        if key not in fitted:  # a site without test rows still adapts the model for its predictions
            m, mode = key
            mask = setup["masks"][setup["chain_mask"][m]]
            Zf, yf = _chain_matrix(site, setup, m, "train")
            fitted[key] = {} if mode == "none" else personalise(
                mode, _chain_params(request.arrays, m, mask), Zf, yf, l2=float(setup["l2"][m]),
                epochs=local_epochs if mode == "local" else epochs)
        arrays.update({f"param:site:{k}": np.asarray(v, np.float64) for k, v in fitted[key].items()})
    return Message("select_evaluate", arrays)



def _evaluate_regression(site: Site, setup: Mapping[str, Any], request: Message, stage: str) -> Message:
    """A regression selection's evaluation: per slot (mode ``"none"`` only: no personalisation
    of a regression), :func:`~fedtab.learn.metrics.regression_sums` of the chain's linear model
    on its held-out rows — ``sse``, ``sae``, ``sum_y``, ``sum_y2``, each ``(E,)`` (zeros where
    the site has no such rows)."""
    M = len(setup["chain_mask"])
    slots = _slots(request.meta, M)
    if any(mode != "none" for _, mode in slots) or request.meta.get("send_personal") is not None:
        raise ValueError("a regression selection scores unpersonalised models only (mode 'none')")
    E = len(slots)
    out = {k: np.zeros(E) for k in ("sse", "sae", "sum_y", "sum_y2")}
    for e, (m, _) in enumerate(slots):
        fold = int(setup["chain_fold"][m])
        if stage == "test" and fold != -1:
            raise ValueError("the test stage scores refit chains only")
        _, held = chain_parts(site, fold, stage)
        if held is None:
            continue
        Z, y = _chain_matrix(site, setup, m, held)
        if not len(y):
            continue
        mask = setup["masks"][setup["chain_mask"][m]]
        coef = np.asarray(request.arrays["param:coef"][m], np.float64)[0, mask]
        b = float(np.asarray(request.arrays["param:intercept"][m], np.float64)[0])
        for k, v in regression_sums(y, Z @ coef + b).items():
            out[k][e] = v
    return Message("select_evaluate", out)
