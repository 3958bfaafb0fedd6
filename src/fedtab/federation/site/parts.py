"""A site's fixed row parts: drawn once by the site, from its own seed, with floors.

The server may *name* a part, never size or seed it (issue 20: a server that chose the
validation size and seed made one-row parts and read rows off their statistics). Every
statistic a site releases is computed over one of these parts. They form a laminar family
of *atoms* — ``test`` and the folds ``fold:0 … fold:K-1`` (or ``train`` without folds) —
and every part is a union of atoms, so any combination of replies (differences, sums over
folds, ``Σₖ fit:k − (K−1)·train``, ``train − Σₖ fold:k``, ``all − train − test``) is a
signed sum of atoms. Each atom holds, per class, either no row or at least ``min_rows``
rows (:func:`check_parts` verifies it where the parts are drawn), so no combination
isolates fewer than ``min_rows`` rows of a class (issue 28, item 2):

* a class with fewer than ``min_rows`` rows at the site is in **no** part (``all``
  included): it is left out of every release — unless the site has a single atom
  (``train`` = ``all``: no test part, no folds), which no other part can be differenced
  against (the gate's per-class floor refuses a per-class release over it);
* ``"test"`` — each class contributes ``round(n_c · test_size)`` rows (at least one and
  leaving one, as before), but only when that and the class's remaining training rows are
  both at least ``min_rows``; a class too rare for that stays wholly in training.
* ``"train"`` — the other rows; ``"all"`` — ``train`` and ``test``.
* ``"fold:k"`` (``k < K``) — a stratified partition (a tiling) of the training rows into
  ``K`` folds (``K`` = the site's ``folds`` setting, default 5), lowered until every class
  has at least ``min_rows`` rows in every fold. When no ``K ≥ 2`` fits every class, the
  classes with ``min_rows`` rows per fold at ``K`` = the setting are spread over all folds
  and each rarer class over ``n_c // min_rows`` of them (at least one), so every fold holds
  ``0`` or ``≥ min_rows`` rows of it. Folds of fewer than ``min_rows`` rows are not drawn
  (``K = 0``).
* ``"fit:k"`` — the training rows outside ``fold:k``; ``"validation"`` = ``"fold:0"`` and
  ``"fit"`` = ``"fit:0"`` (the tuning workflow's split). Without folds ``"fit"`` is the
  whole training part and ``"validation"`` is empty.

**A continuous target** (``values`` given, a regression site): the floors apply to the
whole atom (as for an unsupervised site: every atom holds 0 or ``>= min_rows`` rows), and
the draws are stratified by the target's quantiles instead of by class — the test part takes
``round(n_b · test_size)`` rows of each of up to 10 quantile bins, and each fold one row of
every run of ``K`` consecutive training rows in target order — so every part spans the
target's range (:func:`quantile_strata`).

The draws use the site's seed only; the test draw is the one fedtab has always made
(same generator and order), so a site with classes above the floors keeps its split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RowParts", "draw_parts", "fixed_parts", "check_parts", "canonical_part", "BASE_PARTS", "DEFAULT_FOLDS",
           "PartError", "quantile_strata"]

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
    #: rows in no part (a class with fewer than ``min_rows`` rows at the site)
    excluded: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
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
            if not len(self.excluded):
                return np.arange(self.n_rows)
            if "all" not in self._cache:
                self._cache["all"] = np.setdiff1d(np.arange(self.n_rows), self.excluded, assume_unique=True)
            return self._cache["all"]
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
        out = {"train": int(len(self.train)), "test": int(len(self.test)),
               "all": int(self.n_rows - len(self.excluded))}
        for k in range(len(self.folds)):
            out[f"fold:{k}"] = int(len(self.folds[k]))
            out[f"fit:{k}"] = int(len(self.train) - len(self.folds[k]))
        return out


def _rare_rows(idx: np.ndarray, labels: np.ndarray | None, min_rows: int) -> np.ndarray:
    """The rows of ``idx`` whose class has fewer than ``min_rows`` rows among ``idx`` (sorted)."""
    if labels is None or not len(idx):
        return idx[:0]
    keys, inverse, counts = np.unique(labels[idx], return_inverse=True, return_counts=True)
    return np.sort(idx[counts[inverse.ravel()] < min_rows])


def _test_split(labels: np.ndarray | None, idx: np.ndarray, test_size: float, min_rows: int,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    n = len(idx)
    if test_size == 0 or n < 2:
        return idx, idx[:0]
    if labels is None:
        perm = rng.permutation(idx)
        k = int(round(n * test_size))
        if k < min_rows or n - k < min_rows:
            k = 0
        return np.sort(perm[k:]), np.sort(perm[:k])
    import pandas as pd

    train, test = [], []
    for cls in pd.unique(labels[idx]):
        members = rng.permutation(idx[labels[idx] == cls])
        k = int(round(len(members) * test_size))
        k = min(max(k, 1), len(members) - 1) if len(members) >= 2 else 0
        if k < min_rows or len(members) - k < min_rows:  # too rare for two shares of min_rows: all in training
            k = 0
        test.append(members[:k])
        train.append(members[k:])
    tr, te = np.sort(np.concatenate(train)), np.sort(np.concatenate(test))
    if 0 < len(te) < min_rows:
        tr, te = np.sort(np.concatenate([tr, te])), te[:0]
    return tr, te


def quantile_strata(values: np.ndarray, idx: np.ndarray, n_bins: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``idx`` cut into ``n_bins`` (or fewer, at least 1) runs of near-equal size in the order of
    ``values[idx]`` (ties in a random order from ``rng``): the target's quantile bins."""
    if not len(idx):
        return []
    order = idx[np.lexsort((rng.permutation(len(idx)), np.asarray(values, dtype=np.float64)[idx]))]
    return [b for b in np.array_split(order, max(1, min(int(n_bins), len(idx)))) if len(b)]


def _quantile_test_split(values: np.ndarray, idx: np.ndarray, test_size: float, min_rows: int,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A test part of ``round(n_b · test_size)`` rows from each of up to 10 quantile bins of ``idx``,
    or none when it or the rest would hold fewer than ``min_rows`` rows."""
    if test_size == 0 or len(idx) < 2:
        return idx, idx[:0]
    test = [rng.permutation(b)[:int(round(len(b) * test_size))] for b in quantile_strata(values, idx, 10, rng)]
    te = np.sort(np.concatenate(test)) if test else idx[:0]
    if len(te) < max(min_rows, 1) or len(idx) - len(te) < max(min_rows, 1):
        return idx, idx[:0]
    return np.setdiff1d(idx, te, assume_unique=True), te


def _quantile_folds(train: np.ndarray, values: np.ndarray, k_max: int, min_rows: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A tiling of ``train`` into the most folds (``<= k_max``) of ``>= min_rows`` rows each, every fold
    taking one row of each run of ``K`` consecutive rows in target order, or ``()``."""
    floor = max(min_rows, 1)
    k = next((k for k in range(k_max, 1, -1) if len(train) // k >= floor), None)
    if k is None:
        return ()
    order = quantile_strata(values, train, len(train), rng)  # one row per bin: the rows in target order
    flat = np.concatenate(order)
    fold_of = np.concatenate([rng.permutation(k) for _ in range(-(-len(flat) // k))])[:len(flat)]
    return tuple(np.sort(flat[fold_of == j]) for j in range(k))


def _folds(train: np.ndarray, labels: np.ndarray | None, k_max: int, min_rows: int,
           rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """A tiling of ``train`` into folds with 0 or ``>= min_rows`` rows of every class each
    (``train`` holds no class of fewer than ``min_rows`` rows), or ``()``."""
    if k_max < 2 or len(train) < 2:
        return ()
    if labels is None:
        groups = [train]
    else:
        import pandas as pd

        y = labels[train]
        groups = [train[y == c] for c in pd.unique(y)]
    sizes = [len(g) for g in groups]
    floor = max(min_rows, 1)
    # the most folds in which every class has min_rows rows; else k_max folds, rarer classes in fewer of them
    k = next((k for k in range(k_max, 1, -1) if all(s // k >= floor for s in sizes)), None)
    k = k or k_max
    if not any(s // k >= floor for s in sizes):
        return ()
    folds: list[list[np.ndarray]] = [[] for _ in range(k)]
    for g in groups:
        perm = rng.permutation(g)
        spread = min(k, len(g) // floor)  # every chosen fold gets >= min_rows rows of this class
        chosen = np.arange(k) if spread == k else np.sort(rng.choice(k, size=spread, replace=False))
        for j, fold in enumerate(chosen):
            folds[int(fold)].append(perm[j::spread])
    out = tuple(np.sort(np.concatenate(f)) if f else train[:0] for f in folds)
    if min(len(f) for f in out) < floor:
        return ()
    return out


def check_parts(parts: RowParts, labels: np.ndarray | None, min_rows: int) -> list[str]:
    """What breaks the laminar-family rule in ``parts`` (empty when nothing does).

    The rule (module docstring): ``train``, ``test`` and ``excluded`` are disjoint and cover
    every row; the folds are disjoint and tile ``train``; every atom (``test``, each fold,
    ``train`` without folds) holds per class (the whole atom for ``labels=None``) either no
    row or at least ``min_rows`` rows. Any two parts then differ by 0 or ``>= min_rows`` rows
    of every class, and so does any signed sum of parts.
    """
    problems = []
    train, test, excluded = (np.asarray(a, dtype=np.int64) for a in (parts.train, parts.test, parts.excluded))
    every = np.concatenate([train, test, excluded])
    if len(every) != parts.n_rows or not np.array_equal(np.sort(every), np.arange(parts.n_rows)):
        problems.append("train, test and the excluded rows do not partition the rows")
    atoms = {"test": test}
    if parts.folds:
        tiled = np.concatenate(parts.folds)
        if len(tiled) != len(train) or not np.array_equal(np.sort(tiled), np.sort(train)):
            problems.append("the folds do not tile the training rows")
        atoms.update({f"fold:{k}": f for k, f in enumerate(parts.folds)})
    elif len(train) + len(test) < parts.n_rows or len(test):  # alone, train is "all": nothing to difference it by
        atoms["train"] = train
    for name, rows in atoms.items():
        keys = [""] * len(rows) if labels is None else np.asarray(labels)[rows]
        _, counts = np.unique(np.asarray(keys), return_counts=True)
        small = counts[(counts > 0) & (counts < min_rows)]
        if len(small):
            problems.append(f"part {name!r} holds {int(small.min())} row(s) of a class, below min_rows={min_rows}")
    return problems


def _verified(parts: RowParts, labels: np.ndarray | None, min_rows: int) -> RowParts:
    if len(parts.excluded) and not parts.folds and not len(parts.test):
        # one atom (train = all): nothing to difference it by, so the rare rows need not be left
        # out; a per-class release over it is refused by the gate's per-class floor
        parts = RowParts(parts.n_rows, np.sort(np.concatenate([parts.train, parts.excluded])), parts.test)
    problems = check_parts(parts, labels, min_rows)
    if problems:  # the draws above never do this; a site refuses to release over such parts
        raise PartError("the site's parts break the differencing rule: " + "; ".join(problems))
    return parts


def draw_parts(n_rows: int, labels: np.ndarray | None, *, test_size: float, folds: int, min_rows: int,
               seed: int, values: np.ndarray | None = None) -> RowParts:
    """The site's parts (see the module docstring), verified by :func:`check_parts`.

    Args:
        n_rows: rows of the site's table. labels: ``(n_rows,)`` class labels to stratify
            by (``None`` for an unsupervised site). test_size: share held out, in [0, 1).
        folds: the most folds to draw (0 = none). min_rows: the site's floor.
        seed: the site's own seed (never the server's).
        values: ``(n_rows,)`` finite numbers of a continuous target to stratify by quantile
            (``labels`` must then be ``None``: the floors apply to whole atoms).

    Raises:
        ValueError: ``test_size`` outside [0, 1), negative ``folds`` or ``min_rows``, ``values``
            with ``labels`` or of the wrong length.
    """
    if not 0 <= test_size < 1:
        raise ValueError(f"test_size must be in [0, 1), got {test_size}")
    if folds < 0 or min_rows < 0:
        raise ValueError("folds and min_rows must be non-negative")
    if values is not None:
        return _regression_parts(n_rows, np.asarray(values, dtype=np.float64), labels, float(test_size), int(folds),
                                 int(min_rows), int(seed))
    labels = None if labels is None else np.asarray(labels)
    idx = np.arange(n_rows)
    excluded = _rare_rows(idx, labels, int(min_rows))
    kept = np.setdiff1d(idx, excluded, assume_unique=True)
    train, test = _test_split(labels, kept, float(test_size), int(min_rows), np.random.default_rng(seed))
    fold_rng = np.random.default_rng([int(seed), 0x666f6c64])  # "fold": a stream apart from the test draw
    parts = RowParts(n_rows, train, test, _folds(train, labels, int(folds), int(min_rows), fold_rng), excluded)
    return _verified(parts, labels, int(min_rows))


def _regression_parts(n_rows: int, values: np.ndarray, labels: Any, test_size: float, folds: int, min_rows: int,
                      seed: int) -> RowParts:
    if labels is not None:
        raise ValueError("stratify by class labels or by a continuous target's values, not both")
    if values.shape != (n_rows,) or not np.isfinite(values).all():
        raise ValueError(f"values must be {n_rows} finite numbers")
    idx = np.arange(n_rows)
    train, test = _quantile_test_split(values, idx, test_size, min_rows, np.random.default_rng(seed))
    fold_rng = np.random.default_rng([seed, 0x666f6c64])
    parts = RowParts(n_rows, train, test, _quantile_folds(train, values, folds, min_rows, fold_rng) if folds >= 2
                     else ())
    return _verified(parts, None, min_rows)


def fixed_parts(n_train: int, n_test: int, labels: np.ndarray | None, *, folds: int, min_rows: int,
                seed: int) -> RowParts:
    """Parts of a site whose training and test rows are given (the first ``n_train`` rows
    train, the rest test); only the folds are drawn. A class with fewer than ``min_rows``
    rows in the given training (or test) rows is left out of that part and of ``all``."""
    idx = np.arange(n_train + n_test)
    labels = None if labels is None else np.asarray(labels)
    train, test = idx[:n_train], idx[n_train:]
    excluded = np.concatenate([_rare_rows(train, labels, int(min_rows)), _rare_rows(test, labels, int(min_rows))])
    train = np.setdiff1d(train, excluded, assume_unique=True)
    test = np.setdiff1d(test, excluded, assume_unique=True)
    if labels is None and 0 < len(test) < min_rows:
        excluded, test = np.concatenate([excluded, test]), test[:0]
    if labels is None and 0 < len(train) < min_rows and len(test):
        excluded, train = np.concatenate([excluded, train]), train[:0]
    fold_rng = np.random.default_rng([int(seed), 0x666f6c64])
    parts = RowParts(n_train + n_test, train, test, _folds(train, labels, int(folds), int(min_rows), fold_rng),
                     np.sort(excluded).astype(np.int64))
    return _verified(parts, labels, int(min_rows))
