"""A site's rows as model-ready matrices: parts, label keys, class indices, the cached matrices.

Every step that computes over a site's rows reads them here: :func:`part_rows` (one of the
site's fixed parts, :mod:`.parts`), :func:`site_matrix` (the numeric matrix of a part over the
requested features, from the cached matrices when they are current, so a Flower ClientApp's
later messages read no table), :func:`prepared_matrix` (standardised with the stored training
setup), :func:`label_key` (the string under which a class label is agreed across sites) and
:func:`class_indices`. Features a site does not hold, and missing cells, are NaN here; the
steps fill them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.data import numeric_matrix

if TYPE_CHECKING:  # pandas only where a table is read: a step answered from cached arrays
    import pandas as pd  # (a Flower ClientApp's later rounds) never imports it

    from fedtab.federation.site.core import Site



__all__ = ["label_key", "label_keys", "requested_features", "part_rows", "check_part", "PARTS", "MATRIX_KEY", "MATRIX_CACHE_CELLS", "store_part_matrices", "held_features", "site_matrix", "prepared_matrix", "regression_targets", "class_indices", "requested_bins"]


#: row parts a request may name besides ``fold:k`` / ``fit:k`` (see :mod:`fedtab.federation.site.parts`).
PARTS = ("train", "test", "fit", "validation", "all")


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


def requested_features(site: Site, request: Message) -> list[str]:
    feats = request.meta.get("features", site.state.get("features"))
    if feats is None:
        return site.feature_names
    if not isinstance(feats, list):
        raise ValueError("features must be a list of names")
    return feats


def part_rows(site: Site, part: str) -> "pd.DataFrame":
    """The rows of ``part``: one of the site's fixed parts (:mod:`fedtab.federation.site.parts`).

    Raises:
        ValueError: not a part of the site.
    """
    return site.rows(part)


def check_part(part: str) -> str:
    """``part`` if it names a row part (``train``, ``test``, ``all``, ``fold:k``, ``fit:k``,
    ``fit``, ``validation``); ``ValueError`` otherwise."""
    from fedtab.federation.site.parts import canonical_part

    canonical_part(part)
    return part


#: ``Site.state`` key of the numeric matrices a site that answers each message in a fresh
#: process (:class:`~fedtab.federation.site.lazy.LazySite`) stores when it reads its table
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


def prepared_matrix(site: Site, part: str) -> tuple[np.ndarray, np.ndarray]:
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
