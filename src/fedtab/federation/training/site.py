"""The training workflow's site side: the site's matrices and the handlers that answer it.

Handlers (each registered with the release it makes, :mod:`fedtab.privacy.gate`):

* ``"describe"`` — per feature, the count, sum and sum of squares of the observed values of
  a row part, and the site's class labels (:func:`describe_site`);
* ``"fit"`` — the local update from the global parameters; the first one carries the setup
  (features, classes, standardisation, model spec, part) that the site stores; a stand-alone
  ``"setup"`` request has the same effect;
* ``"evaluate"`` — the evaluation sums of a model on a part (:func:`evaluation_sums`).

Features a site does not hold, and missing cells, are filled with the global mean (0 after
standardisation). Nothing here knows which engine, strategy or mode the server runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from ...learn.metrics import brier_sum, confusion, rank_pairs, regression_sums, score_histogram
from ...learn.models import FederatedModel, LogisticRegressionModel, Params, make_model
from ...privacy.dp import (DP_GD_LR, DP_META, add_noise, clip_update, clip_values, column_bounds, dp_logistic_update,
                           noise_rng, release_moments)
from ...privacy.secagg import SECAGG_META
from ..local_data import numeric_matrix
from ..messages import Message
from ..kinds import declared as _declared
from ..parts import canonical_part
from ..site import Site, handler

if TYPE_CHECKING:  # pandas only where a table is read: a step answered from cached arrays
    import pandas as pd  # (a Flower ClientApp's later rounds) never imports it

__all__ = ["label_key", "label_keys", "part_rows", "check_part", "PARTS", "MATRIX_KEY", "MATRIX_CACHE_CELLS", "store_part_matrices",
           "held_features", "site_matrix", "class_indices", "describe_site",
           "requested_bins", "evaluation_sums", "params_from", "params_to", "PARAM", "SETUP", "DESCRIBE_RELEASES",
           "EVALUATE_RELEASES", "regression_targets"]

#: row parts a request may name besides ``fold:k`` / ``fit:k`` (see :mod:`fedtab.federation.parts`).
PARTS = ("train", "test", "fit", "validation", "all")

#: prefix of model-parameter arrays; prefix of the setup's arrays (the first fit carries them)
PARAM = "param:"
SETUP = "setup:"
_PARAM, _SETUP = PARAM, SETUP


def label_key(value: Any) -> str:
    """The string under which a class label is agreed across sites (``1`` and ``1.0`` agree)."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def label_keys(values: Any) -> np.ndarray:
    """``(n,)`` str array: :func:`label_key` of every value, computed once per distinct value.

    Numeric and boolean arrays are reduced to their distinct values first (``np.unique``); an
    array of strings is its own keys; anything else (mixed objects, where ``1``, ``1.0`` and
    ``True`` compare equal but have different keys) and anything not a numpy array (a list
    mixing ``1.0`` and ``"a"`` would become the strings ``"1.0"``, ``"a"``) go value by value.
    """
    if not isinstance(values, np.ndarray):
        return np.asarray([label_key(v) for v in values], dtype=str) if len(values) else np.zeros(0, dtype=str)
    y = values
    if y.ndim != 1:
        y = y.reshape(-1)
    if y.dtype.kind in "biuf" and y.size:
        uniq, inv = np.unique(y, return_inverse=True)
        return np.asarray([label_key(v) for v in uniq], dtype=str)[inv.reshape(-1)]
    if y.dtype.kind == "U":
        return y.astype(str)
    if y.dtype.kind == "O" and all(type(v) is str for v in y.tolist()):
        return y.astype(str) if y.size else np.zeros(0, dtype=str)
    return np.asarray([label_key(v) for v in y.tolist()], dtype=str) if y.size else np.zeros(0, dtype=str)


def _features(site: Site, request: Message) -> list[str]:
    feats = request.meta.get("features", site.state.get("features"))
    if feats is None:
        return site.feature_names
    if not isinstance(feats, list):
        raise ValueError("features must be a list of names")
    return feats


def part_rows(site: Site, part: str) -> "pd.DataFrame":
    """The rows of ``part``: one of the site's fixed parts (:mod:`fedtab.federation.parts`).

    Raises:
        ValueError: not a part of the site.
    """
    return site.rows(part)


def check_part(part: str) -> str:
    """``part`` if it names a row part (``train``, ``test``, ``all``, ``fold:k``, ``fit:k``,
    ``fit``, ``validation``); ``ValueError`` otherwise."""
    from ..parts import canonical_part

    canonical_part(part)
    return part


#: ``Site.state`` key of the numeric matrices a site that answers each message in a fresh
#: process (:class:`~fedtab.federation.lazy_site.LazySite`) stores when it reads its table
#: for the ballot: ``{"steps", "features", "train": {"X", "y"}, "test": {"X", "y"}}`` —
#: every feature column it holds, labels as :func:`label_key` strings, ``steps`` = table
#: steps applied. ``set_mask`` (the training description) and the first FedAvg round then
#: read neither the file nor import pandas. Not stored beyond :data:`MATRIX_CACHE_CELLS`.
MATRIX_KEY = "part_matrix"
#: the most cells (train + test) kept in :data:`MATRIX_KEY` (8 MB of float64); larger
#: tables are read again by the steps that need them
MATRIX_CACHE_CELLS = 1_000_000


def store_part_matrices(site: Site) -> bool:
    """Store the train/test matrices of every feature column in ``site.state[MATRIX_KEY]``.

    Returns whether they were stored: not for a table over :data:`MATRIX_CACHE_CELLS`
    cells, with non-numeric feature columns or without a target (those steps read the
    table as before).
    """
    features = list(site.feature_names)
    if site.target is None or site.n_rows("all") * len(features) > MATRIX_CACHE_CELLS:
        site.state.pop(MATRIX_KEY, None)
        return False
    entry: dict[str, Any] = {"steps": len(site.state.get("table_steps") or []), "features": features}
    for part in ("train", "test"):
        rows = site.rows(part)
        try:
            X = numeric_matrix(rows[features], site.name)
        except ValueError:  # a column still to encode: the steps that need the matrix will say so
            site.state.pop(MATRIX_KEY, None)
            return False
        entry[part] = {"X": X, "y": label_keys(rows[site.target].to_numpy())}
    site.state[MATRIX_KEY] = entry
    return True


def _current_matrices(site: Site) -> dict[str, Any] | None:
    """``site.state[MATRIX_KEY]`` if no table step was applied since it was stored, else ``None``."""
    entry = site.state.get(MATRIX_KEY)
    if isinstance(entry, dict) and entry.get("steps") == len(site.state.get("table_steps") or []):
        return entry
    return None


def held_features(site: Site) -> frozenset[str] | set[str]:
    """The feature columns ``site`` holds: from :data:`MATRIX_KEY` when it is current
    (no table read), else :attr:`Site.feature_set`."""
    entry = _current_matrices(site)
    return set(entry["features"]) if entry is not None else site.feature_set


def _stored_matrix(site: Site, features: list[str], part: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(X, labels)`` of ``part`` over ``features`` from :data:`MATRIX_KEY`, if it is current."""
    entry = _current_matrices(site)
    if entry is None or part not in ("train", "test") or part not in entry:
        return None
    pos = {f: i for i, f in enumerate(entry["features"])}
    X_all, y = entry[part]["X"], entry[part]["y"]
    idx = [pos.get(f, -1) for f in features]
    if all(i >= 0 for i in idx):
        return X_all[:, idx], y
    X = np.full((X_all.shape[0], len(features)), np.nan)
    held = [k for k, i in enumerate(idx) if i >= 0]
    X[:, held] = X_all[:, [idx[k] for k in held]]
    return X, y


def site_matrix(site: Site, features: list[str], part: str) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y_raw)`` over ``features`` (absent columns all-NaN), raw labels (or their
    :func:`label_key` strings when answered from :data:`MATRIX_KEY`: every caller maps
    labels through :func:`label_key`)."""
    stored = _stored_matrix(site, features, part)
    if stored is not None:
        return stored
    rows = part_rows(site, part)
    held = site.feature_set  # a set: `f in rows.columns` costs ~6 µs per name on a pandas index
    present = [f for f in features if f in held]
    if len(present) == len(features):  # the site holds every feature (the usual case): no scatter
        X = numeric_matrix(rows[present], site.name)
        return X, rows[site.target].to_numpy() if site.target is not None else np.zeros(len(rows))
    X = np.full((len(rows), len(features)), np.nan)
    if present:
        pos = {f: i for i, f in enumerate(features)}  # not features.index: O(d²) on wide tables
        idx = [pos[f] for f in present]
        X[:, idx] = numeric_matrix(rows[present], site.name)
    y = rows[site.target].to_numpy() if site.target is not None else np.zeros(len(rows))
    return X, y


def _prepared(site: Site, part: str) -> tuple[np.ndarray, np.ndarray]:
    setup = site.state.get("train_setup")
    if setup is None:
        raise ValueError("training is not set up on this site (no 'setup' request received)")
    cache = setup.setdefault("_cache", {})  # a new 'setup' request starts a new cache
    if part not in cache:
        cache[part] = _standardised(site, setup, part)
    return cache[part]


def _standardised(site: Site, setup: dict[str, Any], part: str) -> tuple[np.ndarray, np.ndarray]:
    X, y_raw = site_matrix(site, setup["features"], part)
    Z = (X - setup["mean"]) / setup["std"]
    Z[np.isnan(Z)] = 0.0
    if setup.get("task") == "regression":
        return Z, regression_targets(y_raw)
    return Z, class_indices(y_raw, setup["classes"])


def regression_targets(y_raw: Any) -> np.ndarray:
    """``(n,)`` float64 targets of a regression model.

    Raises:
        ValueError: a value that is not a finite number (the value is not named).
    """
    try:
        y = np.asarray(y_raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("the target holds values that are not numbers: this site reads it as classes") from None
    if not np.isfinite(y).all():
        raise ValueError("the target holds values that are not finite numbers")
    return y


def class_indices(y_raw: Any, classes: list[str]) -> np.ndarray:
    """``(n,)`` int64 positions of raw labels in the agreed class list (by :func:`label_key`).

    Raises:
        ValueError: a label is not in ``classes``.
    """
    index = {c: i for i, c in enumerate(classes)}
    keys = label_keys(y_raw)
    if not keys.size:
        return np.zeros(0, dtype=np.int64)
    uniq, inv = np.unique(keys, return_inverse=True)  # one dictionary look-up per distinct label
    unknown = sorted(set(uniq.tolist()) - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} are not in the agreed class list")
    return np.asarray([index[k] for k in uniq.tolist()], dtype=np.int64)[inv.reshape(-1)]


def params_from(msg: Message) -> Params:
    return {k[len(_PARAM):]: v for k, v in msg.arrays.items() if k.startswith(_PARAM)}


def params_to(params: Params) -> dict[str, np.ndarray]:
    return {_PARAM + k: np.asarray(v) for k, v in params.items()}


def _suppress_rare_ones(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, X: np.ndarray, min_rows: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The moments with every 0/1 column whose ones number ``1 .. min_rows - 1`` zeroed: its sum
    counts rows. The test part is one-hot encoded as the model file encodes it, so a category
    this site holds in fewer than ``min_rows`` rows has an indicator of its own there
    (:func:`fedtab.federation.encoding_flow._one_hot_table`); a description over rows that
    include the test part must not count them."""
    obs = ~np.isnan(X)
    binary = ~(obs & (X != 0) & (X != 1)).any(axis=0)
    ones = (obs & (X == 1)).sum(axis=0)
    small = binary & (ones > 0) & (ones < min_rows)
    if not small.any():
        return count, total, sumsq
    return tuple(np.where(small, 0, a).astype(np.asarray(a).dtype) for a in (count, total, sumsq))  # type: ignore


def describe_site(site: Site, feats: list[str], part: str = "train", dp: Mapping[str, Any] | None = None) -> Message:
    """The ``"describe"`` reply of ``site`` over ``feats`` on row part ``part``.

    Arrays ``count``/``sum``/``sumsq`` (per feature, observed cells only; a feature the
    site lacks has count 0); meta ``classes`` (label keys), ``n_train`` (rows of
    ``part``), ``n_test`` and ``features``.

    With ``dp`` (a request's ``meta["dp"]``) values are clipped into the public bounds and
    each of the three arrays is a Gaussian release (:mod:`fedtab.privacy.dp`).
    """
    X, y = site_matrix(site, feats, part)
    lo = hi = None  # public bounds, under dp
    if dp is not None:
        lo, hi = column_bounds(dp, feats, held=[f for f in feats if f in site.table.columns])
        X = clip_values(X, lo, hi)
    obs = ~np.isnan(X)
    Xz = np.where(obs, X, 0.0)
    labels = [] if getattr(site, "target_kind", "classes") == "regression" else sorted(set(np.unique(label_keys(y)).tolist()))
    count, total, sumsq = release_moments(obs.sum(axis=0).astype(np.int64), Xz.sum(axis=0), (Xz * Xz).sum(axis=0),
                                          min_rows=site.policy.min_rows, dp=dp, lo=lo, hi=hi)
    if dp is None and canonical_part(part) in ("test", "all"):
        count, total, sumsq = _suppress_rare_ones(count, total, sumsq, X, site.policy.min_rows)
    return Message(
        "describe",
        {"count": count, "sum": total, "sumsq": sumsq},
        {"classes": labels, "n_train": int(len(y)), "n_test": site.n_rows("test"), "features": feats},
    )


#: the description: per-feature moments over a part (counts suppressed below min_rows)
DESCRIBE_RELEASES = _declared("describe").releases  # declared in fedtab.federation.kinds


@handler("describe")
def _describe(site: Site, request: Message) -> Message:
    return describe_site(site, _features(site, request), str(request.meta.get("part") or "train"),
                         request.meta.get(DP_META))


def _store_setup(site: Site, meta: Mapping[str, Any], mean: Any, std: Any) -> None:
    site.state["train_setup"] = {
        "features": list(meta["features"]),
        "classes": list(meta["classes"]),
        "mean": np.asarray(mean, dtype=np.float64),
        "std": np.asarray(std, dtype=np.float64),
        "model": meta["model"],
        "part": str(meta.get("part", "train")),
        "task": "regression" if meta.get("task") == "regression" else "classes",
    }


@handler("setup")
def _setup(site: Site, request: Message) -> Message:
    _store_setup(site, request.meta, request.arrays["mean"], request.arrays["std"])
    return Message("setup", meta={"ok": True})


def _fit_part(site: Site, request: Message) -> str:
    carried = request.meta.get("setup")
    if isinstance(carried, dict):
        return str(carried.get("part", "train"))
    return str((site.state.get("train_setup") or {}).get("part", "train"))


def _fit_releases(request: Message) -> int:
    """Gaussian releases of one fit under DP: its gradient steps (DP gradient descent) or 1 (DP-FedAvg)."""
    steps = (request.meta.get(DP_META) or {}).get("steps", 1)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else 1


@handler("fit")
def _fit(site: Site, request: Message) -> Message:
    carried = request.meta.get("setup")
    if carried is not None:  # the first round carries the setup (no separate exchange)
        if not isinstance(carried, dict):
            raise ValueError("fit: 'setup' must be a JSON object")
        _store_setup(site, carried, request.arrays[_SETUP + "mean"], request.arrays[_SETUP + "std"])
        if carried.get("part", "train") == "train":  # read the table once: the test rows' matrix rides in the
            try:  # state, so later fits and the evaluation need neither the file nor pandas
                _prepared(site, "test")
            except ValueError:  # e.g. a test label outside the class list: the evaluation reports it
                pass
    setup = site.state.get("train_setup") or {}
    X, y = _prepared(site, setup.get("part", "train"))
    model = make_model(site.state["train_setup"]["model"])
    params = params_from(request)
    dp = request.meta.get(DP_META)
    if dp is not None and model.exact:
        raise ValueError(f"differential privacy is not available for the exact-aggregation model {model.name!r}")
    if model.exact and not params:
        params = model.init(X.shape[1], len(site.state["train_setup"]["classes"]))
    if dp is not None and isinstance(model, LogisticRegressionModel):  # DP gradient descent
        params = dp_logistic_update(params, X, y, steps=int(dp.get("steps", 1)), lr=float(dp.get("lr", DP_GD_LR)),
                                    l2=model.l2, spec=dp, rng=noise_rng())
    else:
        received = params
        params = model.local_update(params, X, y, epochs=int(request.meta.get("epochs", 1)),
                                    seed=int(request.meta.get("seed", 0)))
        if dp is not None:  # DP-FedAvg: clip the update, add noise, before any masking
            params = clip_update(params, received, dp, noise_rng())
    if model.exact and "count" in params:  # per-class statistics: suppress small classes
        counts = np.asarray(params["count"])
        small = (counts > 0) & (counts < site.policy.min_rows)
        params = {k: np.where(small.reshape((-1,) + (1,) * (np.ndim(v) - 1)), 0, v) for k, v in params.items()}
    return Message("fit", params_to(params), {"n_samples": int(len(y))})


def requested_bins(meta: Mapping[str, Any]) -> int | None:
    """The ``"score_bins"`` a request asks for (None = no score sums).

    Raises:
        ValueError: not an integer in ``2..100000``.
    """
    bins = meta.get("score_bins")
    if bins is None:
        return None
    if not isinstance(bins, int) or isinstance(bins, bool) or not 2 <= bins <= 100_000:
        raise ValueError(f"score_bins must be an integer in 2..100000, got {bins!r}")
    return bins


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
EVALUATE_RELEASES = _declared("evaluate").releases  # declared in fedtab.federation.kinds


@handler("evaluate")
def _evaluate(site: Site, request: Message) -> Message:
    part = request.meta.get("part") or "test"
    X, y = _prepared(site, part)
    setup = site.state["train_setup"]
    model = make_model(setup["model"])
    sums = evaluation_sums(model, params_from(request), X, y, len(setup["classes"]), requested_bins(request.meta),
                           pairs=SECAGG_META not in request.meta)
    dp = request.meta.get(DP_META)
    if dp is not None:  # a replaced row moves one count between cells (Δ = √2) and its Brier term by ≤ 2
        rng = noise_rng()
        sums = {k: add_noise(v, 2.0 if k == "brier_sum" else np.sqrt(2.0), dp, rng) for k, v in sums.items()}
    return Message("evaluate", sums, {"n": int(len(y))})


@handler("regression_evaluate")
def _regression_evaluate(site: Site, request: Message) -> Message:
    """A regression model's ``sse``, ``sae``, ``sum_y``, ``sum_y2`` ``(1,)`` each on a part (the test
    part by default; :func:`fedtab.learn.metrics.regression_sums`), and its rows ``n``."""
    setup = site.state.get("train_setup") or {}
    if setup.get("task") != "regression":
        raise ValueError("regression_evaluate scores a regression model; this site was set up for classes")
    if request.meta.get(DP_META) is not None:
        raise ValueError("differential privacy is not available for a regression evaluation")
    X, y = _prepared(site, str(request.meta.get("part") or "test"))
    model = make_model(setup["model"])
    pred = model.predict(params_from(request), X) if len(y) else np.zeros(0)
    sums = regression_sums(y, pred)
    return Message("regression_evaluate", {k: np.array([v]) for k, v in sums.items()}, {"n": int(len(y))})
