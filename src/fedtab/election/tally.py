"""Streaming election: O(d) memory however many sites vote, and the batch front doors
:func:`elect` (K×d masks and scores) and :func:`elect_ballots` (:class:`~fedtab.election.ballot.Ballot`
objects aligned by name), which feed an :class:`ElectionTally`."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .ballot import Ballot, check_freedom_degree
from .evidence import check_consensus, check_consensus_alpha, combined_pvalues, z_scores
from .rule import (Aggregation, ElectionResult, FeatureCounts, Normalization, PositionalNames, check_aggregation,
                   check_normalization, check_profile, decide)

__all__ = ["ElectionTally", "elect", "elect_ballots", "normalise_scores"]


def normalise_scores(mask: np.ndarray, scores: np.ndarray, normalization: str = "all") -> np.ndarray:
    """Per-site min-max normalisation of ``|scores|`` (see :mod:`fedtab.election.rule`).

    ``"all"``: over every entry, constant scores give zeros. ``"selected"``: over the
    selected entries only, unselected = 0, constant selected scores give 0.5 (FLARE).
    """
    s = np.abs(scores)
    if normalization == "all":
        lo, hi = s.min(initial=np.inf), s.max(initial=-np.inf)
        if not hi > lo:
            return np.zeros_like(s)
        out = s - lo
        with np.errstate(over="ignore"):
            inverse = 1.0 / (hi - lo)
        if np.isfinite(inverse):
            out *= inverse
        else:  # a subnormal range (a hostile or degenerate ballot): its reciprocal overflows, divide instead
            out /= hi - lo
        return out
    out = np.zeros_like(s)
    if not mask.any():
        return out
    sel = s[mask]
    lo, hi = sel.min(), sel.max()
    out[mask] = (sel - lo) / (hi - lo) if hi > lo else 0.5
    return out


class ElectionTally:
    """Accumulates ballots one at a time and elects from running sums.

    Holds nine length-d arrays (holders, selectors, weight sum, two vote sums, and for
    ``consensus="stouffer"`` ``Σ √m_i z_ij``, ``Σ m_i`` and the largest term with its weight
    for the robust leave-the-top-site-out test),
    never the ballots, so a server with 1,000 sites uses the memory of one.

    Args:
        n_features: d, when every ballot covers the same d features in the same order.
        feature_names: the global feature order. Ballots then carry names and may cover
            any subset (the site abstains on the rest). If neither argument is given,
            the schema grows as named ballots arrive (ordered union).
        normalization: ``"all"`` or ``"selected"`` (see :mod:`fedtab.election.rule`).
        compat: ``None`` or a peer profile (``"nvflare"``, ``"flash"``, ``"flower"``, see
            :mod:`fedtab.election.compat`). A profile reproduces the peer's float operations
            in the peer's order, so the tally then also keeps the validated ballots
            (O(K·d) memory, as the peers' servers do).

    Raises:
        ValueError: bad arguments; from :meth:`add`, any invalid ballot (naming the site).
    """

    def __init__(
        self,
        n_features: int | None = None,
        *,
        feature_names: Sequence[str] | None = None,
        normalization: str = "all",
        compat: str | None = None,
    ) -> None:
        self.normalization = check_normalization(normalization)
        self.compat = check_profile(compat, normalization)
        self._ballots: list[Ballot] = []
        if feature_names is not None:
            names = [str(x) for x in feature_names]
            if len(set(names)) != len(names):
                raise ValueError("feature_names contains duplicates")
            if n_features is not None and n_features != len(names):
                raise ValueError(f"n_features={n_features} but {len(names)} feature names given")
            self._names: list[str] | None = names
            self._fixed = True
            d = len(names)
        elif n_features is not None:
            if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 0:
                raise ValueError(f"n_features must be a non-negative integer, got {n_features!r}")
            self._names = None
            self._fixed = True
            d = int(n_features)
        else:
            self._names = []
            self._fixed = False
            d = 0
        self._index = {n: i for i, n in enumerate(self._names)} if self._names is not None else None
        # (names, column positions) of the last named ballot: ballots over the same columns
        # skip the per-name lookups. ``None`` positions = the schema's own order.
        self._last_cols: tuple[tuple[str, ...], np.ndarray | None] | None = None
        self._alloc(d)
        self.n_sites = 0
        self.total_samples = 0

    def _alloc(self, d: int) -> None:
        self.held_by = np.zeros(d, dtype=np.int64)
        self.selected_by = np.zeros(d, dtype=np.int64)
        self._weight_n = np.zeros(d)  # Σ n_i over holders
        self._vote_n = np.zeros(d)  # Σ n_i · norm_ij
        self._vote_1 = np.zeros(d)  # Σ norm_ij
        self._evidence = np.zeros(d)  # Σ √m_i · z_ij over ballots with p-values (Stouffer, m = n_effective)
        self._evidence_w = np.zeros(d)  # Σ m_i over the same ballots
        self._evidence_top = np.zeros(d)  # the largest positive √m_i · z_ij (0 if none): left out of the test
        self._evidence_top_w = np.zeros(d)  # m_i of that site
        self._without_pvalues: list[str] = []  # the first sites whose ballot carried no p-values (at most 5)

    def _grow(self, new: list[str]) -> None:
        assert self._names is not None and self._index is not None
        self._last_cols = None  # cached positions of "all columns" no longer cover the schema
        for n in new:
            self._index[n] = len(self._names)
            self._names.append(n)
        extra = len(new)
        for attr in ("held_by", "selected_by", "_weight_n", "_vote_n", "_vote_1", "_evidence", "_evidence_w",
                     "_evidence_top", "_evidence_top_w"):
            arr = getattr(self, attr)
            setattr(self, attr, np.concatenate([arr, np.zeros(extra, dtype=arr.dtype)]))

    @property
    def n_features(self) -> int:
        return int(self.held_by.size)

    @property
    def feature_names(self) -> list[str]:
        return list(self._names) if self._names is not None else PositionalNames(self.n_features)

    def add(
        self,
        mask: Any,
        scores: Any,
        n_samples: Any,
        *,
        feature_names: Sequence[str] | None = None,
        site: str | None = None,
    ) -> None:
        """Count one site's ballot. Validates it first; an invalid ballot changes nothing."""
        site = site if site is not None else f"site-{self.n_sites + 1}"
        b = Ballot.build(mask, scores, n_samples, feature_names, site)
        self.add_ballot(b)

    def add_ballot(self, b: Ballot) -> None:
        """Count a validated :class:`Ballot`."""
        label = f"site {b.site!r}"
        if b.feature_names is None:
            if not self._fixed:
                raise ValueError(f"{label}: ballot has no feature names but the election is over named features")
            if b.n_features != self.n_features:
                raise ValueError(f"{label}: ballot covers {b.n_features} features, the election {self.n_features}")
            cols = None
        else:
            if self._names is None:
                if b.n_features != self.n_features:
                    raise ValueError(f"{label}: ballot covers {b.n_features} features, the election {self.n_features}")
                cols = None  # positional election: names are informational
            elif self._last_cols is not None and b.feature_names == self._last_cols[0]:
                cols = self._last_cols[1]  # same columns as the previous ballot (the usual case)
            else:
                assert self._index is not None
                unknown = [n for n in b.feature_names if n not in self._index]
                if unknown:
                    if self._fixed:
                        raise ValueError(f"{label}: features {unknown[:5]} are not in the election's schema")
                    self._grow(unknown)
                cols = np.fromiter((self._index[n] for n in b.feature_names), dtype=np.int64, count=b.n_features)
                if cols.size == self.n_features and np.array_equal(cols, np.arange(cols.size)):
                    cols = None
                self._last_cols = (b.feature_names, cols)
        n = b.n_samples
        if self.compat is not None:  # the profile elects from the kept ballots, not from sums
            if cols is None:
                self.held_by += 1
                self.selected_by += b.mask
            else:
                self.held_by[cols] += 1
                self.selected_by[cols] += b.mask
            self._ballots.append(b)
            self.n_sites += 1
            self.total_samples += n
            return
        if b.pvalues is None:
            if len(self._without_pvalues) < 5:
                self._without_pvalues.append(b.site)
        else:
            m = float(n if b.n_effective is None else b.n_effective)
            z = z_scores(b.pvalues)
            z *= np.sqrt(m)
            if cols is None:
                self._evidence += z
                self._evidence_w += m
                top = z > self._evidence_top
                self._evidence_top[top] = z[top]
                self._evidence_top_w[top] = m
            else:
                self._evidence[cols] += z
                self._evidence_w[cols] += m
                top = z > self._evidence_top[cols]
                self._evidence_top[cols[top]] = z[top]
                self._evidence_top_w[cols[top]] = m
        norm = normalise_scores(b.mask, b.scores, self.normalization)
        if cols is None:
            self.held_by += 1
            self.selected_by += b.mask
            self._weight_n += n
            self._vote_1 += norm
            norm *= n
            self._vote_n += norm
        else:
            self.held_by[cols] += 1
            self.selected_by[cols] += b.mask
            self._weight_n[cols] += n
            self._vote_1[cols] += norm
            self._vote_n[cols] += n * norm
        self.n_sites += 1
        self.total_samples += n

    def votes(self, aggregation: str = "weighted") -> np.ndarray:
        """``(d,)`` vote per feature (0 where no site holds it; a profile's votes with ``compat``)."""
        check_aggregation(aggregation)
        if self.compat is not None:
            return self.result(0.5, aggregation).votes
        num, den = (self._vote_n, self._weight_n) if aggregation == "weighted" else (self._vote_1, self.held_by)
        out = np.zeros(self.n_features)
        np.divide(num, den, out=out, where=den > 0)
        return out

    def combined_pvalues(self, *, leave_top_out: bool = False) -> np.ndarray:
        """``(d,)`` Stouffer p-value per feature from the ballots' p-values (1.0 where no
        site holds it; see :mod:`fedtab.election.evidence`). ``leave_top_out``: each
        feature's test leaves out the site with the largest positive term, so no single
        site can make it pass (robust mode; 1.0 where only that site holds evidence).

        Raises:
            ValueError: a counted ballot carried no p-values (naming the sites).
        """
        if self._without_pvalues:
            raise ValueError(f"consensus='stouffer' needs every ballot's p-values; sites {self._without_pvalues} (and maybe more) "
                             "sent none (use a selector built on a test: anova, chi2, or a scikit-learn SelectKBest/"
                             "SelectFdr over one)")
        if not leave_top_out:
            return combined_pvalues(self._evidence, self._evidence_w)
        return combined_pvalues(self._evidence - self._evidence_top, self._evidence_w - self._evidence_top_w)

    def result(self, freedom_degree: float, aggregation: str = "weighted", *, min_holders: int = 1,
               consensus: str = "intersection", consensus_alpha: float = 0.05) -> ElectionResult:
        """Elect with the ballots counted so far.

        ``min_holders``: holders a feature needs to count as consensus (see
        :func:`~fedtab.election.rule.decide`). ``consensus``: ``"intersection"`` (the
        rule) or ``"stouffer"``: the consensus is the features whose combined p-value
        (:meth:`combined_pvalues`) passes Benjamini-Hochberg at ``consensus_alpha``
        (see :mod:`fedtab.election.evidence`).

        Raises:
            ValueError: no ballot counted yet, ``fd`` outside [0, 1], unknown aggregation
                or consensus, ``consensus_alpha`` outside (0, 1), ``"stouffer"`` with a
                peer profile or with a ballot that carried no p-values.
        """
        check_aggregation(aggregation)
        check_consensus(consensus)
        alpha = check_consensus_alpha(consensus_alpha)
        if self.n_sites == 0:
            raise ValueError("no ballots: at least one site must vote")
        if self.compat is not None:
            if consensus != "intersection":
                raise ValueError(f"compat={self.compat!r} reproduces a peer's rule; it has no {consensus!r} consensus")
            from .compat import elect_compat

            return elect_compat(self._ballots, self.feature_names, freedom_degree, aggregation, self.compat)
        evidence = None
        if consensus == "stouffer":
            evidence = self.combined_pvalues()
        return decide(
            self.feature_names,
            FeatureCounts(self.held_by.copy(), self.selected_by.copy(), self.votes(aggregation)),
            freedom_degree,
            aggregation,
            self.normalization,
            self.n_sites,
            min_holders=min_holders,
            evidence=evidence,
            consensus_alpha=alpha,
        )


def elect(
    masks: Any,
    scores: Any,
    n_samples: Sequence[int],
    freedom_degree: float,
    aggregation: Aggregation = "weighted",
    *,
    normalization: Normalization = "all",
    feature_names: Sequence[str] | None = None,
    site_names: Sequence[str] | None = None,
    compat: str | None = None,
) -> ElectionResult:
    """Run the election on K ballots over the same d features.

    Args:
        masks: K×d bool (array or K sequences of length d).
        scores: K×d float.
        n_samples: K positive integers.
        freedom_degree: ``fd`` in [0, 1]; 0 gives the intersection, 1 the union.
        aggregation: ``"weighted"`` (by ``n_samples``) or ``"uniform"``.
        normalization: ``"all"`` (the rule) or ``"selected"`` (NVIDIA FLARE's normalisation only).
        feature_names: d names (default ``f0 … f{d-1}``).
        site_names: K names used in error messages (default ``site-1 …``).
        compat: ``None`` (fedtab's rule) or a peer's server rule reproduced exactly:
            ``"nvflare"``, ``"flash"``, ``"flower"`` (see :mod:`fedtab.election.compat`).

    Raises:
        ValueError: naming the site: no ballots, ragged or mismatched shapes,
            non-finite scores, a bad ``n_samples``; also ``fd`` outside [0, 1], an
            unknown aggregation/normalization/compat, or ``compat`` together with
            ``normalization="selected"`` (a profile fixes its normalisation).
    """
    check_freedom_degree(freedom_degree)
    check_aggregation(aggregation)
    check_normalization(normalization)
    check_profile(compat, normalization)
    mask_rows = _rows(masks, "masks")
    score_rows = _rows(scores, "scores")
    counts = list(n_samples) if not np.isscalar(n_samples) else [n_samples]
    if len(mask_rows) == 0:
        raise ValueError("no ballots: at least one site must vote")
    if not (len(mask_rows) == len(score_rows) == len(counts)):
        raise ValueError(
            f"got {len(mask_rows)} masks, {len(score_rows)} score rows and {len(counts)} sample counts; "
            "need one of each per site"
        )
    names = list(site_names) if site_names is not None else [f"site-{i + 1}" for i in range(len(mask_rows))]
    if len(names) != len(mask_rows):
        raise ValueError(f"{len(names)} site names for {len(mask_rows)} ballots")
    d = np.asarray(mask_rows[0]).size if np.ndim(mask_rows[0]) == 1 else -1
    tally = ElectionTally(d if feature_names is None and d >= 0 else None, feature_names=feature_names,
                          normalization=normalization, compat=compat)
    for m, s, n, site in zip(mask_rows, score_rows, counts, names):
        tally.add(m, s, n, site=site)
    return tally.result(freedom_degree, aggregation)


def elect_ballots(
    ballots: Sequence[Ballot],
    freedom_degree: float,
    aggregation: Aggregation = "weighted",
    *,
    normalization: Normalization = "all",
    feature_names: Sequence[str] | None = None,
    compat: str | None = None,
) -> ElectionResult:
    """Elect from :class:`Ballot` objects, aligning them by feature name.

    Ballots over different column sets are allowed: a site abstains on features it
    does not hold. The global order is ``feature_names`` if given, else the ordered
    union of the ballots' names (first appearance wins). ``compat``: as :func:`elect`
    (a peer profile needs every ballot to cover every feature).

    Raises:
        ValueError: no ballots; a ballot without names while others have them (or
            whose length differs when none have names); names outside ``feature_names``.
    """
    check_freedom_degree(freedom_degree)
    check_aggregation(aggregation)
    check_profile(compat, normalization)
    if not ballots:
        raise ValueError("no ballots: at least one site must vote")
    named = [b.feature_names is not None for b in ballots]
    if any(named) and not all(named):
        unnamed = [b.site for b in ballots if b.feature_names is None]
        raise ValueError(f"sites {unnamed} sent ballots without feature names while others named theirs")
    if not any(named) and feature_names is None:
        tally = ElectionTally(ballots[0].n_features, normalization=normalization, compat=compat)
    else:
        tally = ElectionTally(feature_names=feature_names, normalization=normalization, compat=compat)
    for b in ballots:
        tally.add(b.mask, b.scores, b.n_samples, feature_names=b.feature_names, site=b.site)
    return tally.result(freedom_degree, aggregation)


def _rows(values: Any, what: str) -> list[Any]:
    if isinstance(values, np.ndarray):
        if values.ndim != 2:
            raise ValueError(f"{what} must be 2-D (sites × features), got shape {values.shape}")
        return list(values)
    try:
        return list(values)
    except TypeError:
        raise ValueError(f"{what} must be a sequence of per-site arrays") from None
