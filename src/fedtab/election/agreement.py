"""How close is a federated election to the same selector on the pooled table?

In simulation (one table split into sites) the pooled table exists, so the elected
mask can be compared with what the sites' selector picks on all rows at once. This
module holds that comparison as pure functions:

* :func:`jaccard` — ``|A ∩ B| / |A ∪ B|`` of two boolean masks (1.0 when both are empty);
* :func:`pooled_mask` — the selector run on the pooled rows, aligned to given names;
* :func:`pooled_agreement` — the Jaccard agreement with the pooled mask for each
  freedom degree, from one count of the ballots.

Never used in a real deployment: there, no party holds the pooled table.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .ballot import Ballot, check_freedom_degree
from .rule import RuleSettings, check_aggregation, check_normalization

__all__ = ["jaccard", "pooled_mask", "pooled_agreement", "DEFAULT_FREEDOM_DEGREES"]

#: the freedom degrees :func:`pooled_agreement` reports by default.
DEFAULT_FREEDOM_DEGREES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def jaccard(a: Any, b: Any) -> float:
    """Jaccard index of two ``(d,)`` boolean masks; 1.0 when both select nothing.

    Raises:
        ValueError: the masks are not 1-D or differ in length.
    """
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"masks must be 1-D of the same length, got shapes {a.shape} and {b.shape}")
    union = int(np.count_nonzero(a | b))
    return 1.0 if union == 0 else int(np.count_nonzero(a & b)) / union


def pooled_mask(tables: Sequence[Any], target: str, selector: Any, feature_names: Sequence[str]) -> np.ndarray:
    """``(d,)`` mask of ``selector`` run on the rows of all ``tables`` stacked.

    Args:
        tables: pandas DataFrames (the sites' training rows), each with ``target``.
        target: the label column.
        selector: a selector name/spec/object (see :func:`~fedtab.election.selectors.make_selector`).
        feature_names: the election's global feature order; the pooled table has these
            columns (a column missing at a site is NaN there), missing cells are filled
            with the pooled column mean, as each site does for its ballot.

    Raises:
        ValueError: no tables, a table without ``target``, a non-numeric column.
    """
    import pandas as pd

    from .selectors import make_selector

    if not tables:
        raise ValueError("pooled_mask needs at least one table")
    for i, t in enumerate(tables):
        if target not in t.columns:
            raise ValueError(f"table {i}: no target column {target!r}")
    names = [str(f) for f in feature_names]
    pooled = pd.concat([t.set_axis([str(c) for c in t.columns], axis=1) for t in tables], ignore_index=True)
    X = pooled.reindex(columns=names).to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isnan(X).any():
        with np.errstate(invalid="ignore"):
            means = np.nan_to_num(np.nanmean(np.where(np.isnan(X).all(axis=0), 0.0, X), axis=0))
        X = np.where(np.isnan(X), means, X)
    return np.asarray(make_selector(selector).select(X, pooled[target].to_numpy()).mask, dtype=bool)


def pooled_agreement(
    ballots: Sequence[Ballot],
    pooled: Any,
    *,
    feature_names: Sequence[str] | None = None,
    freedom_degrees: Sequence[float] = DEFAULT_FREEDOM_DEGREES,
    rule: RuleSettings = RuleSettings(),
) -> list[dict[str, float]]:
    """Per freedom degree, the Jaccard agreement of the elected mask with ``pooled``.

    The ballots are counted once (:class:`~fedtab.election.tally.ElectionTally`); each
    freedom degree is then one cheap decision over the running sums.

    Args:
        ballots: the sites' ballots (named or positional, as for an election).
        pooled: ``(d,)`` bool mask of the same selector on the pooled table, in the
            order of ``feature_names`` (default: the ballots' ordered union of names).
        rule: the election's settings (aggregation, normalization, compat, consensus,
            consensus_alpha, min_holders; see :class:`~fedtab.election.tally.ElectionTally`);
            ``min_holders=None`` is 1 (the plain rule).

    Returns:
        ``[{"freedom_degree", "jaccard", "kept", "pooled_kept"}]`` in the order given.

    Raises:
        ValueError: no ballots, a mask of the wrong length, ``fd`` outside [0, 1].
    """
    from .tally import ElectionTally

    check_aggregation(rule.aggregation)
    check_normalization(rule.normalization)
    fds = [check_freedom_degree(fd) for fd in freedom_degrees]
    if not ballots:
        raise ValueError("no ballots: at least one site must vote")
    if feature_names is None and ballots[0].feature_names is None:
        tally = ElectionTally(ballots[0].n_features, normalization=rule.normalization, compat=rule.compat)
    else:
        tally = ElectionTally(feature_names=feature_names, normalization=rule.normalization, compat=rule.compat)
    for b in ballots:
        tally.add_ballot(b)
    ref = np.asarray(pooled, dtype=bool)
    if ref.shape != (tally.n_features,):
        raise ValueError(f"pooled mask has shape {ref.shape}, the election covers {tally.n_features} features")
    min_holders = 1 if rule.min_holders is None else rule.min_holders
    out = []
    for fd in fds:
        mask = tally.result(fd, rule.aggregation, min_holders=min_holders, consensus=rule.consensus,
                            consensus_alpha=rule.consensus_alpha).mask
        out.append({"freedom_degree": fd, "jaccard": jaccard(mask, ref), "kept": int(mask.sum()),
                    "pooled_kept": int(ref.sum())})
    return out
