"""The Feature Election rule.

For K sites and d features with masks ``M`` (K×d bool), scores ``S`` (K×d) and sample
counts ``n``:

1. scores are taken as absolute values and min-max normalised per site over all the
   features that site holds (a site whose scores are all equal contributes zeros);
2. site weights are ``n_i / Σn`` (``"weighted"``) or ``1/K`` (``"uniform"``);
3. the vote of feature j is ``V_j = Σ_i w_i · norm_ij`` over every site holding j,
   whether or not it selected j (weights renormalised over the holders);
4. features selected by every holder (the intersection) are kept, features selected
   by none are dropped, the rest are *disputed*; with ``min_holders = m`` a feature
   held by fewer than ``m`` sites is never in the intersection ("consensus") -- if
   selected it is disputed, so one site's word alone cannot keep it at ``fd = 0``;
5. the ``ceil(fd · |disputed|)`` disputed features with the highest vote are kept,
   ties broken by the lower feature index.

``consensus="stouffer"`` replaces the intersection of step 4 by the features whose
combined p-value (Stouffer's weighted Z over the holders' test p-values) passes
Benjamini-Hochberg; the union's other features are disputed (see
:mod:`fedtab.election.evidence`, robust to label-skewed sites).

``normalization="selected"`` uses NVIDIA FLARE 2.9's normalisation instead of step 1:
min-max over the site's *selected* features only, unselected features count 0, and a
site whose selected scores are all equal gives them 0.5. That alone does not make the
mask FLARE's (FLARE also changes steps 4-5); ``compat="nvflare"`` reproduces FLARE's
whole server rule, ``compat="flash"`` / ``compat="flower"`` those of FLASH and the
Flower example (:mod:`fedtab.election.compat` tabulates every difference).

The batch functions :func:`~fedtab.election.tally.elect` / :func:`~fedtab.election.tally.elect_ballots`
and the streaming :class:`~fedtab.election.tally.ElectionTally` (all in :mod:`fedtab.election.tally`,
which builds on this module) share one implementation (:func:`decide`), so they always agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

if TYPE_CHECKING:  # pandas only for explain(): a site answering set_mask never imports it
    import pandas as pd

from .ballot import check_freedom_degree

__all__ = ["ElectionResult", "decide", "FeatureCounts", "RuleSettings", "AGGREGATIONS", "NORMALIZATIONS", "COMPATS",
           "check_compat", "check_profile"]

AGGREGATIONS = ("weighted", "uniform")
NORMALIZATIONS = ("all", "selected")

Aggregation = Literal["weighted", "uniform"]
Normalization = Literal["all", "selected"]


def check_aggregation(aggregation: Any) -> str:
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
    return str(aggregation)


def check_normalization(normalization: Any) -> str:
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r}; expected one of {NORMALIZATIONS}")
    return str(normalization)


#: the peer profiles ``elect(..., compat=...)`` accepts (``None`` = fedtab's rule).
COMPATS = ("nvflare", "flash", "flower")


def check_compat(compat: Any) -> str | None:
    """``compat`` if it is ``None`` or a known profile; ``ValueError`` otherwise."""
    if compat is None:
        return None
    if compat not in COMPATS:
        raise ValueError(f"unknown compat profile {compat!r}; expected None or one of {COMPATS}")
    return str(compat)


def check_profile(compat: Any, normalization: Any = "all") -> str | None:
    """``compat`` checked (see :mod:`fedtab.election.compat`); a profile fixes its own
    normalisation, so ``normalization`` must stay ``"all"`` (the default) with it."""
    profile = check_compat(compat)
    if profile is not None and normalization != "all":
        raise ValueError(f"compat={profile!r} fixes the normalisation; leave normalization at its default")
    return profile


class PositionalNames(Sequence[str]):
    """``f0 … f{d-1}``, generated on access (positional elections over many features)."""

    def __init__(self, n: int) -> None:
        self._n = int(n)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [f"f{j}" for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return f"f{i % self._n}"

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented

    def __repr__(self) -> str:
        return f"PositionalNames({self._n})"


def n_admitted(freedom_degree: float, n_disputed: int) -> int:
    """``ceil(fd · n_disputed)``, immune to float noise such as ``0.3 * 10 = 3.0000000000000004``."""
    return min(n_disputed, math.ceil(round(freedom_degree * n_disputed, 9)))


@dataclass(frozen=True)
class ElectionResult:
    """Outcome of an election over d features.

    Attributes:
        feature_names: the d features, in the global order.
        mask: ``(d,)`` bool, the elected features.
        votes: ``(d,)`` float, the weighted normalised score ``V`` of each feature.
        stats: counts ``intersection``, ``union``, ``disputed``, ``kept``, ``sites``.
        reasons: per feature, why it was kept or dropped (``"consensus"``,
            ``"won the vote at rank r"``, ``"lost the vote at rank r"``,
            ``"selected by no site"``, ``"held by no site"``).
        selected_by / held_by: ``(d,)`` int, how many sites selected / hold the feature.
        freedom_degree, aggregation, normalization: the settings used.
        compat: the peer profile used (``None`` = fedtab's rule).
        dropped_sites: sites whose ballot the profile dropped before voting
            (``compat="nvflare"`` drops all-False ballots, as FLARE does).
    """

    feature_names: Sequence[str]
    mask: np.ndarray
    votes: np.ndarray
    stats: dict[str, int]
    selected_by: np.ndarray
    held_by: np.ndarray
    freedom_degree: float
    aggregation: str
    normalization: str
    rank: np.ndarray = field(repr=False)  # 1-based rank among disputed, 0 elsewhere
    compat: str | None = None
    dropped_sites: tuple[str, ...] = ()
    min_holders: int = 1  # holders a feature needs to be consensus
    #: ``"intersection"`` or ``"stouffer"`` (see :mod:`fedtab.election.evidence`).
    consensus: str = "intersection"
    #: with ``"stouffer"``: the Benjamini-Hochberg level and the ``(d,)`` combined p-values.
    consensus_alpha: float | None = None
    evidence: np.ndarray | None = field(default=None, repr=False)

    @cached_property
    def reasons(self) -> tuple[str, ...]:
        """Per feature, why it was kept or dropped (built on first access)."""
        out = np.empty(self.votes.size, dtype=object)
        out[:] = "selected by no site"
        out[self.held_by == 0] = "held by no site"
        consensus = self.consensus_mask
        if self.evidence is None:
            out[consensus] = "consensus"
        else:
            for j in np.flatnonzero(consensus):
                out[j] = f"consensus (combined p = {self.evidence[j]:.2g})"
        for j in np.flatnonzero(self.rank):
            out[j] = f"{'won' if self.mask[j] else 'lost'} the vote at rank {self.rank[j]}"
        no_vote = (self.selected_by > 0) & ~consensus & (self.rank == 0)  # a profile's fd cut-off
        out[no_vote & self.mask] = "in the union (no vote at this freedom degree)"
        out[no_vote & ~self.mask] = "outside the intersection (no vote at this freedom degree)"
        return tuple(out.tolist())

    @property
    def consensus_mask(self) -> np.ndarray:
        """``(d,)`` bool: the features kept as consensus (step 4, or combined evidence)."""
        held = self.held_by >= max(self.min_holders, 1)
        if self.evidence is not None and self.consensus_alpha is not None:
            from .evidence import benjamini_hochberg

            return benjamini_hochberg(self.evidence, self.consensus_alpha, held)
        return held & (self.selected_by == self.held_by)

    @property
    def selected_names(self) -> list[str]:
        """Names of the elected features, in the global order."""
        return [n for n, keep in zip(self.feature_names, self.mask) if keep]

    def explain(self) -> "pd.DataFrame":
        """One row per feature: held_by, selected_by, vote, disputed rank, kept, reason
        (and ``combined_p`` with ``consensus="stouffer"``)."""
        import pandas as pd

        table = pd.DataFrame(
            {
                "feature": list(self.feature_names),
                "held_by": self.held_by,
                "selected_by": self.selected_by,
                "vote": self.votes,
                "rank": self.rank,
                "kept": self.mask,
                "reason": list(self.reasons),
            }
        )
        if self.evidence is not None:
            table.insert(4, "combined_p", self.evidence)
        return table

    def explain_records(self) -> list[dict[str, Any]]:
        """:meth:`explain` as JSON-able dicts: ``feature``, ``held_by``, ``selected_by``, ``vote``,
        ``rank`` (``None`` when not disputed), ``kept``, ``reason``."""
        return [{"feature": str(f), "held_by": int(h), "selected_by": int(s), "vote": float(v),
                 "rank": int(r) if r else None,
                 "kept": bool(k), "reason": str(why)}
                for f, h, s, v, r, k, why in zip(self.feature_names, self.held_by, self.selected_by, self.votes,
                                                 self.rank, self.mask, self.reasons)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (settings, stats and the elected names)."""
        out = {
            "freedom_degree": self.freedom_degree,
            "aggregation": self.aggregation,
            "normalization": self.normalization,
            "stats": dict(self.stats),
            "selected": self.selected_names,
        }
        if self.compat is not None:
            out["compat"] = self.compat
            out["dropped_sites"] = list(self.dropped_sites)
        if self.consensus != "intersection":
            out["consensus"] = self.consensus
            out["consensus_alpha"] = self.consensus_alpha
        return out


def election_stats(n_sites: int, intersection: np.ndarray, union: np.ndarray, n_disputed: int,
                   mask: np.ndarray) -> dict[str, int]:
    """The ``stats`` of an :class:`ElectionResult`."""
    return {
        "sites": int(n_sites),
        "features": int(mask.size),
        "intersection": int(intersection.sum()),
        "union": int(union.sum()),
        "disputed": int(n_disputed),
        "kept": int(mask.sum()),
    }


@dataclass(frozen=True)
class FeatureCounts:
    """The per-feature counts and votes :func:`decide` elects from, all ``(d,)`` in the
    election's feature order: ``held_by`` / ``selected_by`` (int: sites holding / selecting
    each feature) and ``votes`` (float: the aggregated normalised score of each feature).
    :func:`decide` keeps the arrays it is given in its result (pass copies of running sums)."""

    held_by: np.ndarray
    selected_by: np.ndarray
    votes: np.ndarray


@dataclass(frozen=True)
class RuleSettings:
    """The election rule's settings besides the freedom degree, as one value (checked where an
    election uses them, not here):

    ``aggregation`` (``"weighted"`` / ``"uniform"``), ``normalization`` (``"all"`` /
    ``"selected"``), ``compat`` (a peer's rule, :mod:`fedtab.election.compat`, or ``None``),
    ``consensus`` (``"intersection"`` / ``"stouffer"``) with its false discovery rate
    ``consensus_alpha``, and ``min_holders`` (holders a feature needs to count as consensus;
    ``None``: the caller's default, see each function taking a ``RuleSettings``)."""

    aggregation: str = "weighted"
    normalization: str = "all"
    compat: str | None = None
    consensus: str = "intersection"
    consensus_alpha: float = 0.05
    min_holders: int | None = None


def decide(
    feature_names: Sequence[str],
    counts: FeatureCounts,
    freedom_degree: float,
    aggregation: str,
    normalization: str,
    n_sites: int,
    *,
    min_holders: int = 1,
    evidence: np.ndarray | None = None,
    consensus_alpha: float = 0.05,
) -> ElectionResult:
    """Steps 4-5 of the rule, from per-feature counts and votes (shared by batch and tally).

    ``min_holders``: a feature held by fewer sites is never consensus (it is disputed if
    selected). ``1`` is the plain rule. ``evidence``: ``(d,)`` combined p-values; when
    given, the consensus is the held features passing Benjamini-Hochberg at
    ``consensus_alpha`` instead of the intersection (``consensus="stouffer"``).
    """
    fd = check_freedom_degree(freedom_degree)
    held_by, selected_by, votes = counts.held_by, counts.selected_by, counts.votes
    if isinstance(min_holders, bool) or not isinstance(min_holders, (int, np.integer)) or min_holders < 1:
        raise ValueError(f"min_holders must be a positive integer, got {min_holders!r}")
    held = held_by >= min_holders
    if evidence is None:
        intersection = held & (selected_by == held_by)
    else:
        from .evidence import benjamini_hochberg

        intersection = benjamini_hochberg(evidence, consensus_alpha, held)
    union = (selected_by > 0) | intersection
    disputed = union & ~intersection
    idx = np.flatnonzero(disputed)
    order = idx[np.lexsort((idx, -votes[idx]))]  # highest vote first, lower index on ties
    k = n_admitted(fd, idx.size)
    mask = intersection.copy()
    mask[order[:k]] = True
    rank = np.zeros(votes.size, dtype=np.int64)
    rank[order] = np.arange(1, order.size + 1)

    stats = election_stats(n_sites, intersection, union, idx.size, mask)
    return ElectionResult(
        feature_names=feature_names if isinstance(feature_names, PositionalNames) else tuple(feature_names),
        mask=mask,
        votes=votes,
        stats=stats,
        selected_by=selected_by,
        held_by=held_by,
        freedom_degree=fd,
        aggregation=aggregation,
        normalization=normalization,
        rank=rank,
        min_holders=int(min_holders),
        consensus="intersection" if evidence is None else "stouffer",
        consensus_alpha=None if evidence is None else float(consensus_alpha),
        evidence=evidence,
    )
