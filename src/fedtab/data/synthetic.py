"""Synthetic tables and row partitions for demos, tests and benchmarks."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

__all__ = ["classification_table", "split_rows"]


def classification_table(
    n_samples: int = 3000,
    n_features: int = 100,
    n_informative: int = 12,
    n_redundant: int = 8,
    n_repeated: int = 0,
    *,
    n_classes: int = 2,
    class_sep: float = 1.0,
    flip_y: float = 0.01,
    shuffle: bool = False,
    seed: int = 0,
    target: str = "target",
) -> pd.DataFrame:
    """``make_classification`` as a DataFrame with columns ``f00…`` and ``target``.

    With ``shuffle=False`` the signal (informative, redundant, repeated) columns are
    the first ``n_informative + n_redundant + n_repeated``.
    """
    from sklearn.datasets import make_classification  # lazy: keeps `import fedtab` cheap

    X, y = make_classification(
        n_samples=n_samples,
        n_features=n_features,
        n_informative=n_informative,
        n_redundant=n_redundant,
        n_repeated=n_repeated,
        n_classes=n_classes,
        class_sep=class_sep,
        flip_y=flip_y,
        shuffle=shuffle,
        random_state=seed,
    )
    width = len(str(n_features - 1))
    frame = pd.DataFrame(X, columns=[f"f{i:0{width}d}" for i in range(n_features)])
    frame[target] = y
    return frame


def split_rows(
    table: pd.DataFrame,
    fractions: Sequence[float],
    *,
    stratify: str | None = None,
    seed: int = 0,
) -> list[pd.DataFrame]:
    """Split rows into ``len(fractions)`` parts of those shares (stratified by a column if given).

    Raises:
        ValueError: fractions not positive or not summing to 1.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.size == 0 or (fr <= 0).any() or not np.isclose(fr.sum(), 1.0):
        raise ValueError(f"fractions must be positive and sum to 1, got {list(fractions)}")
    rng = np.random.default_rng(seed)
    groups = [np.arange(len(table))] if stratify is None else [
        np.flatnonzero(table[stratify].to_numpy() == v) for v in pd.unique(table[stratify])
    ]
    parts: list[list[np.ndarray]] = [[] for _ in fr]
    for g in groups:
        g = rng.permutation(g)
        cuts = np.round(np.cumsum(fr)[:-1] * len(g)).astype(int)
        for i, chunk in enumerate(np.split(g, cuts)):
            parts[i].append(chunk)
    return [table.iloc[np.sort(np.concatenate(p))].reset_index(drop=True) for p in parts]
