"""A site's fixed row parts: drawn once by the site, from its own seed, with floors.

The server may *name* a part, never size or seed it (issue 20: a server that chose the
validation size and seed made one-row parts and read rows off their statistics). Every
statistic a site releases is computed over one of these parts, so no two answers differ
by fewer than ``min_rows`` rows except where a part itself is that small — and none is:

* ``"test"`` — each class contributes ``round(n_c · test_size)`` rows (at least one and
  leaving one, as before), but only when that is at least ``min_rows``; a class too rare
  for that stays wholly in training. A test part of fewer than ``min_rows`` rows is empty.
* ``"train"`` — the other rows; ``"all"`` — every row.
* ``"fold:k"`` (``k < K``) — a stratified partition of the training rows into ``K`` folds
  (``K`` = the site's ``folds`` setting, default 5), lowered until every class has at
  least ``min_rows`` rows in every fold; a class too rare even for two folds is in no
  fold (its rows are in every ``fit:k``). Folds of fewer than ``min_rows`` rows are not
  drawn (``K = 0``).
* ``"fit:k"`` — the training rows outside ``fold:k``; ``"validation"`` = ``"fold:0"`` and
  ``"fit"`` = ``"fit:0"`` (the tuning workflow's split). Without folds ``"fit"`` is the
  whole training part and ``"validation"`` is empty.

The draws use the site's seed only; the test draw is the one fedtab has always made
(same generator and order), so a site with classes above the floors keeps its split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RowParts", "draw_parts", "canonical_part", "BASE_PARTS", "DEFAULT_FOLDS", "PartError"]

#: parts every site has (possibly empty).
BASE_PARTS = ("train", "test", "all")
#: folds a site draws unless its configuration says otherwise.
DEFAULT_FOLDS = 5
_INDEXED = re.compile(r"^(fold|fit):(\d{1,4})$")
_ALIASES = {"validation": "fold:0", "fit": "fit:0"}


class PartError(ValueError):
    """A request named a part that is not one of the site's parts."""


def canonical_part(name: Any) -> str:
    """The canonical name of a part (``"validation"`` -> ``"fold:0"``, ``"fit"`` -> ``"fit:0"``).

    Raises:
        PartError: not a part name (``train``, ``test``, ``all``, ``fold:k``, ``fit:k``,
            ``fit``, ``validation``).
    """
    if not isinstance(name, str):
        raise PartError(f"a row part is named by a string, got {type(name).__name__}")
    name = _ALIASES.get(name, name)
    if name in BASE_PARTS or _INDEXED.match(name):
        return name
    raise PartError(f"{name[:40]!r} is not a row part (train, test, all, fold:k, fit:k, fit, validation)")


@dataclass(frozen=True)
class RowParts:
    """Index arrays (into the site's table) of its parts; see the module docstring."""

    n_rows: int
    train: np.ndarray
    test: np.ndarray
    folds: tuple[np.ndarray, ...] = ()
    _cache: dict[str, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_folds(self) -> int:
        return len(self.folds)

    def indices(self, part: str) -> np.ndarray:
        """Sorted row indices of ``part``.

        Raises:
            PartError: an unknown part, or a fold index the site does not have.
        """
        name = canonical_part(part)
        if name == "all":
            return np.arange(self.n_rows)
        if name == "train":
            return self.train
        if name == "test":
            return self.test
        kind, k = name.split(":")
        k = int(k)
        if not self.folds:
            if k == 0:  # no folds: "validation" is empty, "fit" the whole training part
                return self.train[:0] if kind == "fold" else self.train
            raise PartError(f"part {name!r}: this site draws no folds")
        if k >= len(self.folds):
            raise PartError(f"part {name!r}: this site has {len(self.folds)} folds")
        if kind == "fold":
            return self.folds[k]
        if name not in self._cache:
            self._cache[name] = np.setdiff1d(self.train, self.folds[k], assume_unique=True)
        return self._cache[name]

    def sizes(self) -> dict[str, int]:
        """``{part: rows}`` of every part the site has (``train``, ``test``, ``all``, folds, fits)."""
        out = {"train": int(len(self.train)), "test": int(len(self.test)), "all": int(self.n_rows)}
        for k in range(len(self.folds)):
            out[f"fold:{k}"] = int(len(self.folds[k]))
            out[f"fit:{k}"] = int(len(self.train) - len(self.folds[k]))
        return out


def _test_split(labels: np.ndarray | None, n: int, test_size: float, min_rows: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    idx = np.arange(n)
    if test_size == 0 or n < 2:
        return idx, idx[:0]
    if labels is None:
        perm = rng.permutation(idx)
        k = int(round(n * test_size))
        if k < min_rows:
            k = 0
        return np.sort(perm[k:]), np.sort(perm[:k])
    import pandas as pd

    train, test = [], []
    for cls in pd.unique(labels):
        members = rng.permutation(idx[labels == cls])
        k = int(round(len(members) * test_size))
        k = min(max(k, 1), len(members) - 1) if len(members) >= 2 else 0
        if k < min_rows:  # too rare for a test share of min_rows rows: all in training
            k = 0
        test.append(members[:k])
        train.append(members[k:])
    tr, te = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
    if 0 < len(te) < min_rows:
        tr, te = np.sort(np.concatenate([tr, te])), te[:0]
    return tr, te


def _folds(train: np.ndarray, labels: np.ndarray | None, k_max: int, min_rows: int,
           rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    if k_max < 2 or len(train) < 2:
        return ()
    if labels is None:
        groups = [train]
    else:
        import pandas as pd

        y = labels[train]
        groups = [train[y == c] for c in pd.unique(y)]
    sizes = [len(g) for g in groups]
    # the most folds in which every class has min_rows rows; else k_max folds of the classes that can
    k = next((k for k in range(k_max, 1, -1) if all(s // k >= min_rows for s in sizes)), None)
    included = groups if k is not None else [g for g in groups if len(g) // k_max >= min_rows]
    k = k or k_max
    if not included:
        return ()
    folds: list[list[np.ndarray]] = [[] for _ in range(k)]
    for g in included:
        perm = rng.permutation(g)
        for j in range(k):
            folds[j].append(perm[j::k])
    out = tuple(np.sort(np.concatenate(f)) for f in folds)
    if min(len(f) for f in out) < max(min_rows, 1):
        return ()
    return out


def draw_parts(n_rows: int, labels: np.ndarray | None, *, test_size: float, folds: int, min_rows: int,
               seed: int) -> RowParts:
    """The site's parts (see the module docstring).

    Args:
        n_rows: rows of the site's table. labels: ``(n_rows,)`` class labels to stratify
            by (``None`` for an unsupervised site). test_size: share held out, in [0, 1).
        folds: the most folds to draw (0 = none). min_rows: the site's floor.
        seed: the site's own seed (never the server's).

    Raises:
        ValueError: ``test_size`` outside [0, 1), negative ``folds`` or ``min_rows``.
    """
    if not 0 <= test_size < 1:
        raise ValueError(f"test_size must be in [0, 1), got {test_size}")
    if folds < 0 or min_rows < 0:
        raise ValueError("folds and min_rows must be non-negative")
    labels = None if labels is None else np.asarray(labels)
    train, test = _test_split(labels, n_rows, float(test_size), int(min_rows), np.random.default_rng(seed))
    fold_rng = np.random.default_rng([int(seed), 0x666f6c64])  # "fold": a stream apart from the test draw
    return RowParts(n_rows, train, test, _folds(train, labels, int(folds), int(min_rows), fold_rng))


def fixed_parts(n_train: int, n_test: int, labels: np.ndarray | None, *, folds: int, min_rows: int,
                seed: int) -> RowParts:
    """Parts of a site whose training and test rows are given (the first ``n_train`` rows
    train, the rest test); only the folds are drawn."""
    idx = np.arange(n_train + n_test)
    train, test = idx[:n_train], idx[n_train:]
    labels = None if labels is None else np.asarray(labels)
    fold_rng = np.random.default_rng([int(seed), 0x666f6c64])
    return RowParts(n_train + n_test, train, test, _folds(train, labels, int(folds), int(min_rows), fold_rng))
