"""The training workflow: FedAvg (or a model's exact aggregation) on the elected columns.

Steps, each a request built on the server, a site handler, and a validated reduction:

1. ``"describe"`` — each site reports its class labels and, per feature, the count,
   sum and sum of squares of its observed training values. The server agrees the
   class list (sorted union) and the exact global mean/std. No rows move.
   Skipped when the caller already holds these replies (``run_training(described=...)``,
   e.g. from the election's ``"set_mask"`` step, which can answer them in the same
   exchange — see :func:`~fedtab.federation.election_flow.broadcast_mask`).
2. ``"fit"`` × rounds — sites train from the global parameters for ``local_epochs``
   and reply with parameters and their training row count; the server aggregates.
   The first ``"fit"`` request also carries the setup (features, classes, mean/std,
   model spec, row part; meta ``"setup"`` + arrays ``"setup:mean"``/``"setup:std"``),
   which the site stores before fitting — there is no separate setup exchange. A
   stand-alone ``"setup"`` request is still answered (same effect) for older servers.
3. ``"evaluate"`` — sites reply with the confusion matrix on their test split; the
   server scores each site and the pooled sum (weighted F1, macro F1, accuracy). When
   the request sets ``score_bins`` (the final evaluation does), sites add the sum of
   squared probability errors (``brier_sum``) and, for two classes, a ``(2, bins)``
   histogram of their predicted positive-class probabilities per true class
   (``score_hist``); the server pools them into the Brier score, AUROC and PR-AUC
   (:mod:`fedtab.learn.metrics`) — sums only, no prediction leaves a site.

So training costs ``rounds + 2`` exchanges (``rounds + 1`` with ``described``).

Every reply is validated against the agreed schema (:mod:`fedtab.federation.schema`)
before anything is reduced (:mod:`fedtab.federation.validate`): described counts are
integers no larger than the rows the site declared for that part, zero for features it
did not declare, and its sums of squares imply no negative variance; class labels are
within the ones it declared; ``n_samples`` of every fit equals those rows; parameters
have the model's names and shapes, are finite and of plausible magnitude (exact-
aggregation statistics: consistent counts and moments); confusion matrices are
non-negative integers summing to the declared test rows. A rejected site is named;
with a quorum (``min_sites``) it is dropped and the others go on.

Features a site does not hold, and missing cells, are filled with the global mean
(0 after standardisation).

Row parts: ``"train"``/``"test"`` are the site's own split; ``"fit"``/``"validation"``
split the training rows further (set up by the tuning workflow's ``"split_validation"``
step, stored in ``site.state["fit_validation"]``) so that choices such as the freedom
degree never look at the test rows. Models with exact aggregation (``model.exact``,
e.g. GaussianNB) receive no parameters, reply with statistics, and run one round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

import numpy as np

from ..learn.metrics import SCORE_BINS, brier_sum, confusion, evaluation_scores, score_histogram
from ..learn.models import FederatedModel, LogisticRegressionModel, Params, make_model, model_cost
from ..privacy.accountant import PrivacyLedger
from ..privacy.dp import (DP_GD_LR, DP_GD_NOISE_SCALE, DP_GD_STEPS_PER_EPOCH, DP_META, add_noise, clip_update, clip_values,
                          column_bounds, dp_logistic_update, dp_request, noise_rng, parse_dp, release_moments)
from ..privacy.policy import DisclosurePolicy
from ..privacy.secagg import MOMENT_BITS, SecureAggregator
from . import validate
from .local_data import numeric_matrix
from .messages import Message
from .protocol import Federation, FederationError, collect, exchange, set_quorum
from .schema import sort_labels
from .reduce import DEFAULT_MAX_SITE_SHARE, cap_weights, check_max_site_share, moment_summaries, robust_params, \
    screen_sites, site_median, usable_counts
from .site import Site, handler

if TYPE_CHECKING:  # pandas only where a table is read: a step answered from cached arrays
    import pandas as pd  # (a Flower ClientApp's later rounds) never imports it

__all__ = ["TrainingOutcome", "run_training", "describe_site", "describe_checker", "site_matrix", "label_key",
           "part_rows", "PARTS", "pooled_standardisation", "evaluation_sums", "checked_sums", "pool_evaluations",
           "requested_bins", "class_indices"]

#: row parts a request may name.
PARTS = ("train", "test", "fit", "validation", "all")

_PARAM = "param:"
_SETUP = "setup:"


def label_key(value: Any) -> str:
    """The string under which a class label is agreed across sites (``1`` and ``1.0`` agree)."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        return str(int(value))
    return str(value)


def _features(site: Site, request: Message) -> list[str]:
    feats = request.meta.get("features", site.state.get("features"))
    if feats is None:
        return site.feature_names
    if not isinstance(feats, list):
        raise ValueError("features must be a list of names")
    return feats


def part_rows(site: Site, part: str) -> "pd.DataFrame":
    """The rows of ``part`` (see :data:`PARTS`); ``fit``/``validation`` need a prior split.

    Raises:
        ValueError: unknown part, or ``fit``/``validation`` before ``"split_validation"``.
    """
    if part in ("fit", "validation"):
        split = site.state.get("fit_validation")
        if split is None:
            raise ValueError(f"part {part!r} needs a fit/validation split first ('split_validation' request)")
        train = site.rows("train")
        return train.iloc[split[0] if part == "fit" else split[1]]
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
    return site.rows(part)


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
        entry[part] = {"X": X, "y": np.asarray([label_key(v) for v in rows[site.target].to_numpy()], dtype=str)}
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
    return Z, class_indices(y_raw, setup["classes"])


def class_indices(y_raw: Any, classes: list[str]) -> np.ndarray:
    """``(n,)`` int64 positions of raw labels in the agreed class list (by :func:`label_key`).

    Raises:
        ValueError: a label is not in ``classes``.
    """
    index = {c: i for i, c in enumerate(classes)}
    keys = [label_key(v) for v in y_raw]
    unknown = sorted(set(keys) - set(index))
    if unknown:
        raise ValueError(f"labels {unknown[:5]} are not in the agreed class list")
    return np.fromiter((index[k] for k in keys), dtype=np.int64, count=len(keys))


def _params_from(msg: Message) -> Params:
    return {k[len(_PARAM):]: v for k, v in msg.arrays.items() if k.startswith(_PARAM)}


def _params_to(params: Params) -> dict[str, np.ndarray]:
    return {_PARAM + k: np.asarray(v) for k, v in params.items()}


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
    labels = sorted({label_key(v) for v in y})
    count, total, sumsq = release_moments(obs.sum(axis=0).astype(np.int64), Xz.sum(axis=0), (Xz * Xz).sum(axis=0),
                                          min_rows=site.policy.min_rows, dp=dp, lo=lo, hi=hi)
    return Message(
        "describe",
        {"count": count, "sum": total, "sumsq": sumsq},
        {"classes": labels, "n_train": int(len(y)), "n_test": site.n_rows("test"), "features": feats},
    )


def pooled_standardisation(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, *, floor: bool = True
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` ``(d,)`` of each column from summed per-column ``count``/``sum``/``sumsq``
    (observed cells): 0 where nothing was observed; with ``floor`` a std that is not above
    1e-12 becomes 1 (a constant column stays 0 after standardising)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), 0.0)
        var = np.where(count > 0, sumsq / np.maximum(count, 1) - mean**2, 0.0)
    std = np.sqrt(np.maximum(var, 0.0))
    if floor:
        std[~(std > 1e-12)] = 1.0
    return mean, std


@handler("describe")
def _describe(site: Site, request: Message) -> Message:
    return describe_site(site, _features(site, request), str(request.meta.get("part", "train")),
                         request.meta.get(DP_META))


def _store_setup(site: Site, meta: Mapping[str, Any], mean: Any, std: Any) -> None:
    site.state["train_setup"] = {
        "features": list(meta["features"]),
        "classes": list(meta["classes"]),
        "mean": np.asarray(mean, dtype=np.float64),
        "std": np.asarray(std, dtype=np.float64),
        "model": meta["model"],
        "part": str(meta.get("part", "train")),
    }


@handler("setup")
def _setup(site: Site, request: Message) -> Message:
    _store_setup(site, request.meta, request.arrays["mean"], request.arrays["std"])
    return Message("setup", meta={"ok": True})


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
    params = _params_from(request)
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
    return Message("fit", _params_to(params), {"n_samples": int(len(y))})


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
                    bins: int | None) -> dict[str, np.ndarray]:
    """A site's evaluation sums on ``(X, y)``: ``confusion`` and, when ``bins`` is set and the
    model has ``predict_proba``, ``brier_sum`` (shape ``(1,)``) and, for two classes,
    ``score_hist`` ``(2, bins)`` (:func:`fedtab.learn.metrics.score_histogram`)."""
    pred = model.predict(params, X) if len(y) else np.zeros(0, dtype=np.int64)
    out = {"confusion": confusion(y, pred, n_classes)}
    proba_of = getattr(model, "predict_proba", None)
    if bins is not None and proba_of is not None:
        proba = proba_of(params, X) if len(y) else np.zeros((0, n_classes))
        out["brier_sum"] = np.array([brier_sum(y, proba)])
        if n_classes == 2:
            out["score_hist"] = score_histogram(y, np.clip(proba[:, 1], 0.0, 1.0), bins)
    return out


@handler("evaluate")
def _evaluate(site: Site, request: Message) -> Message:
    part = request.meta.get("part", "test")
    X, y = _prepared(site, part)
    setup = site.state["train_setup"]
    model = make_model(setup["model"])
    sums = evaluation_sums(model, _params_from(request), X, y, len(setup["classes"]), requested_bins(request.meta))
    dp = request.meta.get(DP_META)
    if dp is not None:  # a replaced row moves one count between cells (Δ = √2) and its Brier term by ≤ 2
        rng = noise_rng()
        sums = {k: add_noise(v, 2.0 if k == "brier_sum" else np.sqrt(2.0), dp, rng) for k, v in sums.items()}
    return Message("evaluate", sums, {"n": int(len(y))})


def describe_checker(federation: Federation, features: list[str] | None, part: str, noisy: bool = False,
                     ) -> Callable[[str, Message], None]:
    """Validator of ``"describe"`` replies over ``features`` (``None``: the site's choice) on ``part``.

    With ``noisy`` (DP releases: counts are not integers, moments need not be consistent)
    only the names, rows, shapes, finiteness and the magnitude of the sums are checked."""

    expected = None if features is None else list(features)
    checked_for: list[Any] = []  # the schema the expected list was validated against (once, not per site)

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        feats = reply.meta.get("features")
        if expected is not None and feats != expected:
            raise ValueError("described other features than the ones to train on")
        if expected is None or not (checked_for and checked_for[0] is schema):
            feats = schema.check_features(site, feats, within="federation", what="described features")
            if expected is not None:
                checked_for[:] = [schema]  # equal to ``expected`` and valid: later equal lists are too
        d = len(feats)
        n = validate.integer(reply.meta.get("n_train"), f"{part} rows", equal=schema.rows(site, part))
        validate.integer(reply.meta.get("n_test"), "test rows", equal=schema.rows(site, "test"))
        count, total, sumsq = (validate.array(reply, k, (d,)) for k in ("count", "sum", "sumsq"))
        if noisy:
            for k, a in (("counts", count), ("sums", total), ("sums of squares", sumsq)):
                validate.bounded(a, f"noisy feature {k}")
            return
        validate.counts(count, n, "feature counts")
        held = schema.column_set(site)
        if not held.issuperset(feats) and [f for f, c in zip(feats, count) if c > 0 and f not in held]:
            raise ValueError("counts values of features it did not declare")
        validate.moments(count, total, sumsq, "feature moments")
        schema.check_classes(site, reply.meta.get("classes"))

    return check


def exact_statistics_checker(n_classes: int, n_features: int) -> Callable[[Params, int], None]:
    """Validator of exact-aggregation updates ``{"count": (C,), "sum": (C, d), "sumsq": (C, d)}``."""

    def check(p: Params, n: int) -> None:
        count = validate.counts(p["count"], n, "class counts")
        if count.sum() != n:
            raise ValueError(f"class counts sum to {count.sum():g}, not the {n} rows declared")
        for c in range(n_classes):
            validate.moments(np.full(n_features, count[c]), p["sum"][c], p["sumsq"][c], "class moments")

    return check


@dataclass
class TrainingOutcome:
    """Result of :func:`run_training`.

    Attributes:
        params: final global parameters.
        features / classes: the columns and agreed class labels the model uses.
        mean / std: the global standardisation the sites applied.
        pooled: weighted_f1, macro_f1, accuracy over all sites' test rows.
        per_site: the same per site.
        history: per evaluated round, ``{"round", **pooled metrics}``.
        n_params: trainable parameters; bytes_down / bytes_up: traffic of the fit rounds
            (round 1's requests include the setup they carry: features, classes, mean/std).
        traffic: per round and site ``{"round", "site", "bytes_down", "bytes_up",
            "params_down", "params_up"}`` (bytes measured on the wire when the engine
            logs traffic, params counted from the messages).
        rounds: rounds actually run (1 for exact-aggregation models).
        metrics: ``{"pooled", "per_site"}`` of the final evaluation with every metric of
            :func:`fedtab.learn.metrics.evaluation_scores` (F1, accuracy, confusion matrix,
            Brier score and, for two classes, AUROC / PR-AUC with their error bounds).
        local_epochs / seed / model_spec: the settings used (``model_spec`` is the
            ``{"name", "params"}`` the sites built the model from; baselines repeat them).
        participation: per exchange ``{"step", "sites"}``: the sites whose reply was used.
        dropped: ``{site: reason}`` of sites left out during this run.
        robust: whether the robust reducers were used (see :func:`run_training`).
        left_out: ``{site: reason}`` of the sites whose statistics robust mode left out
            of a pooled sum (``"describe: ..."``, ``"fit round r: ..."``).
        privacy: with ``dp``, the privacy bill: ``{"epsilon", "delta", "noise_multiplier",
            "steps": {step: ε}, "total", "releases"}``.
    """

    model: str
    params: Params
    features: list[str]
    classes: list[str]
    mean: np.ndarray
    std: np.ndarray
    pooled: dict[str, float]
    per_site: dict[str, dict[str, float]]
    history: list[dict[str, float]] = field(default_factory=list)
    n_params: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    traffic: list[dict[str, Any]] = field(default_factory=list)
    rounds: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)
    local_epochs: int = 0
    seed: int = 0
    model_spec: dict[str, Any] = field(default_factory=dict)
    participation: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    robust: bool = False
    left_out: dict[str, str] = field(default_factory=dict)
    privacy: dict[str, Any] | None = None


def _counts(value: Any, shape: tuple[int, int]) -> np.ndarray | None:
    """``value`` as int64 counts of ``shape``, or None when it is not (negative, fractional, NaN)."""
    a = np.asarray(value) if value is not None else np.zeros(0)
    if a.shape != shape or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        return None
    if not np.isfinite(a).all() or (a < 0).any() or (a != np.round(a)).any():
        return None
    return a.astype(np.int64)


def checked_sums(name: str, reply: Message, n_classes: int, bins: int | None) -> tuple[np.ndarray, Any, Any]:
    """``(confusion, score_hist or None, brier_sum or None)`` of a site's evaluation reply.

    Raises:
        FederationError: naming ``name``, when the confusion matrix is not ``(C, C)``
            non-negative integer counts, or a score histogram / Brier sum does not match it
            (shape, counts per class, range ``0 ≤ brier_sum ≤ 2·n``).
    """
    cm = _counts(reply.arrays.get("confusion"), (n_classes, n_classes))
    if cm is None:
        shape = np.shape(reply.arrays.get("confusion"))
        raise FederationError(f"site {name!r}: invalid confusion matrix of shape {shape}, expected "
                              f"({n_classes}, {n_classes}) non-negative counts")
    hist = brier = None
    if bins is not None and "score_hist" in reply.arrays:
        hist = _counts(reply.arrays["score_hist"], (2, bins))
        if n_classes != 2 or hist is None or not np.array_equal(hist.sum(axis=1), cm.sum(axis=1)):
            got = np.shape(reply.arrays["score_hist"])
            raise FederationError(f"site {name!r}: score histogram of shape {got} does not match its confusion "
                                  f"matrix (expected (2, {bins}) counts with the same class totals)")
    if bins is not None and "brier_sum" in reply.arrays:
        b = np.asarray(reply.arrays["brier_sum"], dtype=np.float64)
        if b.shape != (1,) or not np.isfinite(b).all() or not 0 <= b[0] <= 2 * cm.sum() + 1e-9:
            raise FederationError(f"site {name!r}: invalid Brier sum {b.tolist()} for {int(cm.sum())} rows")
        brier = float(b[0])
    return cm, hist, brier


def pool_evaluations(sums: Mapping[str, tuple[np.ndarray, Any, Any]]) -> dict[str, Any]:
    """``{"pooled", "per_site"}`` of :func:`~fedtab.learn.metrics.evaluation_scores` from the sites'
    checked sums; a ranking or Brier metric is pooled only when every site sent its sum."""
    per_site = {name: evaluation_scores(*s) for name, s in sums.items()}
    parts = list(zip(*sums.values()))
    pooled = [sum(p[1:], p[0]) if all(v is not None for v in p) else None for p in parts]
    return {"pooled": evaluation_scores(*pooled), "per_site": per_site}


def _evaluate_detail(federation: Federation, params: Params, n_classes: int, part: str = "test",
                     bins: int | None = None, on_error: Literal["raise", "skip"] | None = None,
                     secure: SecureAggregator | None = None, dp_meta: Mapping[str, Any] | None = None,
                     has_proba: bool = False) -> dict[str, Any]:
    """Pooled and per-site evaluation metrics.

    With ``secure`` the sums travel masked and only the pooled metrics are learned
    (``per_site`` is empty); ``has_proba`` tells which score sums every site sends. With
    ``dp_meta`` the sites noise their sums and no score histograms are asked for; the
    noisy counts are rounded and floored at 0 here (post-processing).
    """
    if dp_meta is not None:
        bins = None
    meta: dict[str, Any] = {"part": part}
    if bins is not None:
        meta["score_bins"] = bins
    if dp_meta is not None:
        meta[DP_META] = dict(dp_meta)
    request = Message("evaluate", _params_to(params), meta)
    if secure is not None or dp_meta is not None:
        if secure is not None:
            fields: dict[str, int | None] = {"confusion": 0 if dp_meta is None else MOMENT_BITS}
            if bins is not None and has_proba:
                fields["brier_sum"] = MOMENT_BITS
                if n_classes == 2:
                    fields["score_hist"] = 0
            summed = secure.ask({s: request for s in secure.peers}, "evaluate", fields, on_error=on_error or "raise")
            replies = {SECURE_SUM: Message("evaluate", {k: np.rint(v) if k != "brier_sum" else v
                                                        for k, v in summed.sums.items()})}
        else:
            replies = collect(federation.broadcast(request), "evaluate", on_error or "raise")
        if dp_meta is not None:
            replies = {name: Message("evaluate", {"confusion": np.maximum(np.rint(r.arrays["confusion"]), 0)})
                       for name, r in replies.items() if "confusion" in r.arrays}
        metrics = pool_evaluations({name: checked_sums(name, reply, n_classes, bins)
                                    for name, reply in replies.items()})
        if secure is not None:
            metrics["per_site"] = {}
        return metrics
    sums: dict[str, tuple[np.ndarray, Any, Any]] = {}

    def check(site: str, reply: Message) -> None:
        assert federation.schema is not None
        n = federation.schema.rows(site, part)
        validate.confusion_matrix(reply, n_classes, n)  # sums to the rows the site declared
        validate.integer(reply.meta.get("n"), "evaluated rows", equal=n)
        sums[site] = checked_sums(site, reply, n_classes, bins)

    replies = exchange(federation, request, check, on_error=on_error)
    return pool_evaluations({name: sums[name] for name in replies})


def _evaluate_all(federation: Federation, params: Params, n_classes: int, part: str = "test",
                  bins: int | None = None, on_error: Literal["raise", "skip"] | None = None,
                  robust: bool = False, **privacy: Any) -> tuple[dict, dict, dict]:
    """``(pooled, per_site, metrics)``: the historic F1/accuracy dicts and the full metrics.

    With ``robust`` every scalar pooled metric is its median over the sites that scored
    rows (:func:`_median_scores`), not the score of the summed counts. ``privacy``: the
    ``secure``/``dp_meta``/``has_proba`` of :func:`_evaluate_detail`."""
    metrics = _evaluate_detail(federation, params, n_classes, part, bins, on_error, **privacy)
    if robust:
        metrics["pooled"] = {**metrics["pooled"], **_median_scores(metrics["per_site"])}
    keep = ("weighted_f1", "macro_f1", "accuracy", "n")
    pooled = {k: metrics["pooled"][k] for k in keep}
    return pooled, {s: {k: m[k] for k in keep} for s, m in metrics["per_site"].items()}, metrics


def _median_scores(per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Robust pooled scores: every scalar metric's median over the sites that scored rows
    (one vote per site; a metric some site lacks is left out); ``n`` is their total."""
    scored = [m for m in per_site.values() if m["n"] > 0] or list(per_site.values())
    out: dict[str, Any] = {}
    for k in scored[0]:
        values = [m.get(k) for m in scored]
        if k != "n" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[k] = float(site_median(np.array(values, dtype=np.float64)))
    out["n"] = int(sum(m["n"] for m in scored))
    return out


def _robust_moments(moments: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], feats: list[str],
                    max_site_share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, str]]:
    """(count, mean, var, left out) from per-site (count, sum, sumsq): screened, then capped shares."""
    summary = {name: moment_summaries(*m) for name, m in moments.items()}
    left_out = screen_sites({n: v[0] for n, v in summary.items()}, {n: v[1] for n, v in summary.items()},
                            columns=feats, what="describe")
    kept = [n for n in moments if n not in left_out]
    counts = np.stack([usable_counts(moments[n][0]) for n in kept])  # noisy (DP) counts below 1: none
    w = cap_weights(counts, max_site_share)
    m = np.nan_to_num(np.stack([summary[n][0] for n in kept]))
    sd = np.nan_to_num(np.stack([summary[n][1] for n in kept]))
    mean = (w * m).sum(axis=0)
    var = (w * (sd**2 + m**2)).sum(axis=0) - mean**2
    return counts.sum(axis=0), mean, var, {n: f"describe: {why}" for n, why in left_out.items()}


def _robust_exact(fm: FederatedModel, updates: list[tuple[Params, int]], names: list[str], max_site_share: float,
                  ) -> tuple[Params, dict[str, str]]:
    """An exact model's statistics (sums over rows), screened per class and with capped site shares."""
    per = {}
    for name, (p, _) in zip(names, updates):
        c = np.asarray(p["count"], dtype=np.float64)[:, None]
        per[name] = moment_summaries(np.broadcast_to(c, p["sum"].shape).ravel(), np.ravel(p["sum"]),
                                     np.ravel(p["sumsq"]))
    left_out = screen_sites({n: v[0] for n, v in per.items()}, {n: v[1] for n, v in per.items()}, what="fit")
    kept = [(p, n) for name, (p, n) in zip(names, updates) if name not in left_out]
    rows = np.array([float(usable_counts(p["count"]).sum()) for p, _ in kept])
    share = cap_weights(rows, max_site_share)
    scale = share * rows.sum() / np.maximum(rows, 1e-300)
    scaled = [({k: np.asarray(v, dtype=np.float64) * f for k, v in p.items()}, n) for (p, n), f in zip(kept, scale)]
    return fm.aggregate(scaled), left_out
#: the key under which a securely summed description stands in for the per-site replies.
SECURE_SUM = "(secure sum)"


def secure_describe(secure: SecureAggregator, requests: Mapping[str, Message], kind: str = "describe",
                    on_error: Literal["raise", "skip"] = "raise",
                    unpack: Callable[[Message], Message] | None = None) -> dict[str, Message]:
    """The sites' ``"describe"`` answers summed securely: ``{SECURE_SUM: Message("describe", ...)}``
    with the summed ``count``/``sum``/``sumsq`` and the union of the class labels.

    ``unpack`` turns a stripped reply of ``kind`` into its ``"describe"`` meta holder
    (the election's ``"set_mask"`` carries the description in ``meta["describe"]``).

    Raises:
        FederationError: sites disagree on the features, or the secure sum failed.
    """
    summed = secure.ask(requests, kind, {"count": 0, "sum": MOMENT_BITS, "sumsq": MOMENT_BITS}, on_error=on_error)
    feats, classes = None, set()
    for name, reply in summed.replies.items():
        meta = (unpack(reply) if unpack else reply).meta
        if feats is None:
            feats = meta.get("features")
        elif meta.get("features") != feats:
            raise FederationError(f"site {name!r} describes different features than the others")
        classes |= {str(c) for c in meta.get("classes", [])}
    arrays = {k: summed.sums[k] for k in ("count", "sum", "sumsq")}
    return {SECURE_SUM: Message("describe", arrays, {"features": feats, "classes": sort_labels(classes),
                                                     "sites": summed.survivors})}


def _spent(ledger: PrivacyLedger | None, dp_meta: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Record one DP evaluation and return the request's DP settings (``None`` without DP)."""
    if ledger is not None:
        ledger.spend("evaluate")
    return dp_meta


def _secure_round(secure: SecureAggregator, fm: FederatedModel, request: Message,
                  template: Mapping[str, tuple[int, ...]], on_error: Literal["raise", "skip"]) -> Params:
    """One fit round through a secure sum: sample-weighted updates (or, for an exact
    model, its plain summed statistics); returns the aggregated parameters.

    Raises:
        FederationError: the summed update does not fit the model's template.
    """
    names = [_PARAM + k for k in template]
    if fm.exact:
        summed = secure.ask({s: request for s in secure.peers}, "fit",
                            {n: (0 if n == _PARAM + "count" else MOMENT_BITS) for n in names},
                            drop_meta=["n_samples"], on_error=on_error)
        update = {k[len(_PARAM):]: v for k, v in summed.sums.items()}
    else:
        summed = secure.ask({s: request for s in secure.peers}, "fit", names, weighted=names, weight="n_samples",
                            on_error=on_error)
        n = summed.weight
        if n is None or not n > 0:
            raise FederationError("the summed sample count of the fit round is not positive")
        update = {k[len(_PARAM):]: summed.sums[k] / n for k in names}
    if any(tuple(update[k].shape) != tuple(shape) for k, shape in template.items()):
        raise FederationError("the summed model update does not have the model's shapes")
    return fm.aggregate([(update, 1)])


def _log_traffic(traffic: list[dict[str, Any]], records: list, r: int, down_params: Mapping[str, np.ndarray],
                 n_up: int) -> None:
    """Per-site traffic of one secure round: every exchange of the round (fit + unmask)."""
    per_site: dict[str, list[int]] = {}
    for t in records:
        if t.kind in ("fit", "secagg_unmask", "secagg_keys"):
            acc = per_site.setdefault(t.site, [0, 0])
            acc[0] += t.bytes_down
            acc[1] += t.bytes_up
    n_down = int(sum(v.size for v in down_params.values()))
    for site, (down, up) in per_site.items():
        traffic.append({"round": r, "site": site, "bytes_down": down, "bytes_up": up,
                        "params_down": n_down, "params_up": n_up})


def run_training(
    federation: Federation,
    features: list[str] | None = None,
    *,
    model: Any = "logistic",
    rounds: int = 10,
    local_epochs: int = 5,
    seed: int = 0,
    eval_every: int = 0,
    on_round: Callable[[int, dict[str, float] | None], None] | None = None,
    on_error: Literal["raise", "skip"] | None = None,
    train_part: str = "train",
    eval_part: str = "test",
    described: Mapping[str, Message] | None = None,
    score_bins: int | None = SCORE_BINS,
    min_sites: int | None = None,
    max_param_abs: float = validate.MAX_PARAM_ABS,
    robust: bool = False,
    max_site_share: float = DEFAULT_MAX_SITE_SHARE,
    secure_aggregation: bool = False,
    dp: Mapping[str, Any] | None = None,
) -> TrainingOutcome:
    """Train ``model`` by federated rounds on ``features`` (default: each site's elected mask).

    Args:
        features: column names to train on; ``None`` uses the mask the sites were told
            by the election (``site.state["features"]``), or all their columns.
        model: a name from :data:`fedtab.learn.MODELS`, a ``{"name", "params"}`` dict
            or a :class:`~fedtab.learn.FederatedModel`.
        rounds: federated rounds; local_epochs: local passes per round.
        eval_every: also evaluate on the test splits every that many rounds (0 = only
            at the end) to fill ``history``.
        on_round: progress callback ``(round, metrics or None)``.
        train_part / eval_part: row parts to train on and to score (``"fit"`` and
            ``"validation"`` for tuning, after a fit/validation split).
        described: the sites' ``"describe"`` replies over these features and
            ``train_part``, already gathered (``ElectionOutcome.described``); skips the
            describe exchange. Each must list ``features`` (when given) as its features.
            The result is the same as without it.
        score_bins: grid of the score histograms the final evaluation asks for (AUROC,
            PR-AUC; see :func:`fedtab.learn.metrics.ranking_scores`); None skips the
            histograms and the Brier sums.
        on_error: ``"skip"`` leaves failing sites out of each step; ``None``/``"raise"``
            follow the federation's quorum policy.
        min_sites: quorum (sets ``federation.min_sites``): sites that fail, time out or
            are rejected are dropped while this many remain. ``None`` keeps the
            federation's policy (by default every site must answer).
        max_param_abs: largest ``|entry|`` accepted in a site's parameters.
        robust: use the robust reducers of :mod:`fedtab.federation.reduce`: the
            standardisation moments leave out sites whose column means/spreads disagree
            with the median site and cap every site's share at ``max_site_share``; the
            FedAvg step takes the coordinate-wise median of the sites' parameters (one
            vote per site; an exact model's statistics are screened and capped like the
            moments); the pooled scores are each metric's median over the sites. Left-out
            sites are logged and listed in ``TrainingOutcome.left_out``. ``False`` (default)
            is the plain FedAvg / exact sums, bit for bit.
        max_site_share: robust mode's ceiling on one site's share of a pooled sum, in (0, 1].
        secure_aggregation: every per-site quantity the server only needs summed goes
            through :class:`~fedtab.privacy.secagg.SecureAggregator`: the feature moments
            of ``describe``, the sample-weighted model updates (or exact statistics) of
            every round, the evaluation sums. The server then learns no single site's
            update or scores (``per_site`` is empty); the result equals the plain run's up
            to fixed-point rounding. Costs one key exchange plus one unmasking exchange
            per summed step.
        dp: ``{"epsilon": ε, "delta": δ, "bounds": [lo, hi] or {feature: [lo, hi]},
            "clip": C}`` — differential privacy at every site: the description's three
            arrays (values clipped into the public bounds), the model updates and the
            confusion matrices are Gaussian releases with one noise multiplier calibrated
            for the whole run (``.privacy`` reports ε per step and in total). Logistic
            regression trains by DP gradient descent (per-example gradients clipped to
            ``C``, default 1; ``4 × local_epochs`` full-batch steps per round, each a
            release); other FedAvg models by DP-FedAvg (the update clipped to L2 norm
            ``C``). Noise is added at the site, before masking. Not for exact-aggregation
            models; no score histograms (AUROC) under DP. A given ``described`` is not
            re-noised here.

    Exchanges: ``describe`` (unless ``described``), ``fit`` × rounds (the first also
    carries the setup), ``evaluate`` (plus one per ``eval_every`` evaluation).

    Raises:
        FederationError: a site failed or replied inconsistently (naming it).
        ValueError: bad arguments, or sites that disagree on the feature list.
    """
    if rounds < 1 or local_epochs < 1:
        raise ValueError("rounds and local_epochs must be at least 1")
    max_site_share = check_max_site_share(max_site_share)
    fm: FederatedModel = make_model(model)
    spec = {"name": fm.name, "params": fm.get_params()}
    if train_part not in PARTS or eval_part not in PARTS:
        raise ValueError(f"train_part and eval_part must be in {PARTS}")
    set_quorum(federation, min_sites)
    p0 = len(federation.participation)
    dropped0 = set(federation.dropped)
    if robust and secure_aggregation:
        raise ValueError("robust=True cannot be combined with secure_aggregation=True: the robust reducers need "
                         "each site's values, secure aggregation shows the server only their sum")
    secure = SecureAggregator(federation) if secure_aggregation else None
    dp_spec = parse_dp(dp)
    ledger, dp_meta = None, None
    if dp_spec is not None:
        if fm.exact:
            raise ValueError(f"dp is not available for the exact-aggregation model {fm.name!r}")
        n_evals = 1 + (sum(1 for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds) if eval_every else 0)
        # logistic regression: DP gradient descent, one release per step; other models: one per round
        steps = DP_GD_STEPS_PER_EPOCH * int(local_epochs) if isinstance(fm, LogisticRegressionModel) else 1
        ledger = PrivacyLedger.for_plan(dp_spec, {"describe": 3 if described is None else 0, "fit": rounds * steps,
                                                  "evaluate": n_evals}, {"fit": DP_GD_NOISE_SCALE if steps > 1 else 1.0})
        dp_meta = dp_request(dp_spec, ledger.noise_multiplier)
        fit_dp = {**dp_request(dp_spec, ledger.multiplier("fit")), "steps": steps, "lr": DP_GD_LR}
    if described is None:
        meta: dict[str, Any] = {"features": list(features)} if features is not None else {}
        meta["part"] = train_part
        if dp_meta is not None:
            meta[DP_META] = dp_meta
            ledger.spend("describe", 3)
        if secure is not None:
            described = secure_describe(secure, {s: Message("describe", meta=meta) for s in secure.peers},
                                        on_error=on_error or "raise")
        else:  # noisy (DP) moments are not integer counts: only their names, shapes and magnitude are checked
            check = describe_checker(federation, features, train_part, noisy=dp_meta is not None)
            described = exchange(federation, Message("describe", meta=meta), check, on_error=on_error)
    else:
        if not described:
            raise ValueError("described holds no site replies")
        described = {s: r for s, r in described.items() if s in federation.active or s == SECURE_SUM}
        for name, reply in described.items():
            if features is not None and reply.meta.get("features") != list(features):
                raise FederationError(f"site {name!r} described other features than the ones to train on")
    feats: list[str] | None = None
    count = total = sumsq = None
    classes: set[str] = set()
    moments: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for name, reply in described.items():
        f = reply.meta.get("features")
        if feats is None:
            feats = f
        elif f != feats:
            federation.drop(name, "trains on different features than the others")
            continue
        c, s, q = (np.asarray(reply.arrays[k], dtype=np.float64) for k in ("count", "sum", "sumsq"))
        count, total, sumsq = (c, s, q) if count is None else (count + c, total + s, sumsq + q)
        moments[name] = (c, s, q)
        classes |= set(reply.meta.get("classes", []))
    assert feats is not None and count is not None
    if len(classes) < 2:
        raise ValueError(f"training needs at least 2 classes across the sites, found {sorted(classes)}")
    class_list = sort_labels(classes)
    left_out: dict[str, str] = {}
    if dp_spec is not None:  # post-processing of noisy moments: counts below 1 are noise
        count = np.where(count >= 1, count, 0.0)
    if robust:
        count, mean, var, left_out = _robust_moments(moments, feats, max_site_share)
        mean = np.where(count > 0, mean, 0.0)
        var = np.where(count > 0, var, 0.0)
        std = np.sqrt(np.maximum(var, 0.0))
    else:
        mean, std = pooled_standardisation(count, total, sumsq, floor=False)
    if dp_spec is not None and dp_spec.get("bounds") is not None:  # keep noisy moments within the bounds
        lo, hi = column_bounds(dp_spec, feats)
        mean, std = np.clip(mean, lo, hi), np.minimum(std, hi - lo)
    std[~(std > 1e-12)] = 1.0
    setup_meta = {"features": feats, "classes": class_list, "model": spec, "part": train_part}
    setup_arrays = {_SETUP + "mean": mean, _SETUP + "std": std}

    size = model_cost(fm, len(feats), len(class_list)).size  # before the server allocates it
    if not size <= DisclosurePolicy().max_size:
        raise ValueError(f"model {fm.name!r} would hold ~{size:.1e} parameters, more than a site accepts by default "
                         f"(max_size={DisclosurePolicy().max_size:g})")
    params = fm.init(len(feats), len(class_list), seed)
    template = fm.update_template(len(feats), len(class_list))
    exact_check = exact_statistics_checker(len(class_list), len(feats)) if fm.exact else None

    def privacy() -> dict[str, Any]:
        """The evaluation's privacy settings (records one DP release)."""
        return {"secure": secure, "dp_meta": _spent(ledger, dp_meta),
                "has_proba": getattr(fm, "predict_proba", None) is not None}

    n_rounds = 1 if fm.exact else rounds
    history: list[dict[str, float]] = []
    traffic: list[dict[str, Any]] = []
    bd0, bu0 = federation.traffic.total("fit")
    for r in range(1, n_rounds + 1):
        down_params = {} if fm.exact else _params_to(params)
        fit_meta: dict[str, Any] = {"epochs": int(local_epochs), "round": r, "seed": seed + r}
        if dp_meta is not None:
            fit_meta[DP_META] = fit_dp
            ledger.spend("fit", fit_dp["steps"])
        if r == 1:
            req = Message("fit", {**down_params, **setup_arrays}, {**fit_meta, "setup": setup_meta})
        else:
            req = Message("fit", down_params, fit_meta)
        n_log = len(federation.traffic.records)
        if secure is not None:
            params = _secure_round(secure, fm, req, template, on_error or "raise")
            _log_traffic(traffic, federation.traffic.records[n_log:], r, down_params,
                         int(sum(np.prod(v) for v in template.values())))
            metrics = None
            if eval_every and (r % eval_every == 0 or r == n_rounds):
                metrics, _, _ = _evaluate_all(federation, params, len(class_list), eval_part, on_error=on_error, **privacy())
                history.append({"round": r, **metrics})
            if on_round:
                on_round(r, metrics)
            continue
        accepted: dict[str, tuple[Params, int]] = {}

        def check_fit(site: str, reply: Message) -> None:
            assert federation.schema is not None
            n = validate.integer(reply.meta.get("n_samples"), "n_samples",
                                 equal=federation.schema.rows(site, train_part))
            if n == 0:
                raise ValueError(f"has no {train_part} rows to train on")
            p = validate.parameters(_params_from(reply), template, what="parameter",
                                    max_abs=np.inf if fm.exact else max_param_abs)
            if exact_check is not None:
                exact_check(p, n)
            accepted[site] = (p, n)

        replies = exchange(federation, req, check_fit, on_error=on_error)
        measured = {t.site: t for t in federation.traffic.records[n_log:] if t.kind == "fit"}
        updates, senders = [], []
        for name, reply in replies.items():
            p, n = accepted[name]
            t = measured.get(name)
            traffic.append({"round": r, "site": name,
                            "bytes_down": t.bytes_down if t else Message("fit", down_params).nbytes(),
                            "bytes_up": t.bytes_up if t else reply.nbytes(),
                            "params_down": int(sum(v.size for v in down_params.values())),
                            "params_up": int(sum(np.asarray(v).size for v in p.values()))})
            updates.append((p, n))
            senders.append(name)
        if not updates:
            raise FederationError(f"round {r}: no valid update")
        if not robust:
            params = fm.aggregate(updates)
        elif fm.exact:
            params, dropped = _robust_exact(fm, updates, senders, max_site_share)
            left_out.update({n: f"fit round {r}: {why}" for n, why in dropped.items()})
        else:
            params = robust_params([p for p, _ in updates])
        metrics = None
        if eval_every and (r % eval_every == 0 or r == n_rounds):
            metrics, _, _ = _evaluate_all(federation, params, len(class_list), eval_part, on_error=on_error,
                                          robust=robust, **privacy())
            history.append({"round": r, **metrics})
        if on_round:
            on_round(r, metrics)
    bd1, bu1 = federation.traffic.total("fit")
    if secure is not None:  # the unmasking exchanges belong to the rounds' traffic too
        bd0 = bu0 = 0
        bd1, bu1 = sum(t["bytes_down"] for t in traffic), sum(t["bytes_up"] for t in traffic)
    pooled, per_site, detail = _evaluate_all(federation, params, len(class_list), eval_part, score_bins, on_error,
                                             robust, **privacy())
    return TrainingOutcome(
        model=fm.name,
        params=params,
        features=list(feats),
        classes=class_list,
        mean=mean,
        std=std,
        pooled=pooled,
        per_site=per_site,
        history=history,
        n_params=fm.n_params(len(feats), len(class_list)),
        bytes_down=bd1 - bd0,
        bytes_up=bu1 - bu0,
        traffic=traffic,
        rounds=n_rounds,
        metrics=detail,
        local_epochs=int(local_epochs),
        seed=seed,
        model_spec=spec,
        participation=federation.participation[p0:],
        dropped={s: r for s, r in federation.dropped.items() if s not in dropped0},
        robust=bool(robust),
        left_out=left_out,
        privacy=ledger.report() if ledger is not None else None,
    )
