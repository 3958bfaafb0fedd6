"""Peer profiles: the server rules of NVIDIA FLARE, FLASH and the Flower example, exactly.

fedtab's own rule (:mod:`fedtab.election.rule`) differs from the peers' server code in
small ways that change masks on real ballots. ``compat=`` reproduces a peer's rule
bit for bit (same float operations in the same order), so a consortium that moves
from a peer to fedtab, or runs both, gets the same mask.

=====================  ==============  ===================  ===================  =======================
step                   fedtab (None)   ``"nvflare"``        ``"flash"``          ``"flower"``
=====================  ==============  ===================  ===================  =======================
scores                 ``|score|``     signed               signed               signed
normalised over        all features    selected only        selected only        selected only
constant scores        0 everywhere    0.5 (selected)       1.0 (selected)       1.0 (selected)
all-False site         votes           dropped before all   votes                votes
intersection / union   fd = 0 / 1      fd ≤ 0.01 / ≥ 0.99   fd = 0 / 1           fd = 0 / 1
admitted               ceil(fd·|D|)    ``np.ceil(fd·|D|)``  ``np.ceil(fd·|D|)``  ``np.ceil(fd·|D|)``
ties at the cut        lower index     higher index         all tied admitted    unspecified (see below)
uniform weights        1/holders       1/K                  1 (no division)      1 (no division)
sites hold             any subset      all features         all features         all features
=====================  ==============  ===================  ===================  =======================

``D`` = disputed features (union minus intersection). fedtab's ``ceil`` rounds
``fd·|D|`` to 9 decimals first, so ``0.3 × 10`` admits 3; the peers' ``np.ceil`` admits
4 there. Where the peers compute ``votes`` only when a vote takes place, the profiles
still report them (for :meth:`~fedtab.election.rule.ElectionResult.explain`).

Flower: the example keeps ``np.argpartition(scores, -k)[-k:]``, whose choice among
scores tied with the k-th is whatever numpy's introselect leaves there (not part of
numpy's contract). The ``"flower"`` profile admits exactly ``k`` and breaks such ties
toward the lower index; every election without a tie across the cut equals Flower's.

The peers assume every site sends a ballot over one shared column list; so do the
profiles (a ballot missing a feature raises ``ValueError`` naming the site).
Sources read: NVIDIA FLARE 2.9 ``nvflare/app_opt/feature_election/controller.py``
(``_extract_client_data``, ``aggregate_selections``, ``_weighted_election``);
FLASH ``src/server.py`` ``ServerAggregator.feature_election`` (commit ac3b291);
Flower PR #6182 ``examples/feature-election/feature_election/strategy.py``
``_aggregate_selections`` (commit ce44180d99).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .ballot import Ballot, check_freedom_degree
from .rule import COMPATS, ElectionResult, PositionalNames, check_aggregation, check_compat, election_stats

__all__ = ["COMPATS", "check_compat", "elect_compat"]


def _matrices(ballots: Sequence[Ballot], names: Sequence[str] | None, compat: str
              ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """K×d masks and scores in the global order, and the K sample counts."""
    d = len(names) if names is not None else ballots[0].n_features
    masks = np.zeros((len(ballots), d), dtype=bool)
    scores = np.zeros((len(ballots), d))
    index = {n: i for i, n in enumerate(names)} if names is not None and not isinstance(names, PositionalNames) \
        else None
    for k, b in enumerate(ballots):
        if index is None or b.feature_names is None:
            if b.n_features != d:
                raise ValueError(f"site {b.site!r}: ballot covers {b.n_features} features, the election {d}")
            masks[k], scores[k] = b.mask, b.scores
            continue
        if b.n_features != d or set(b.feature_names) != set(index):
            missing = [n for n in names if n not in set(b.feature_names)]
            raise ValueError(f"site {b.site!r}: compat={compat!r} needs every site to vote on every feature "
                             f"(the peer assumes one shared column list); missing {missing[:5]}")
        cols = np.fromiter((index[n] for n in b.feature_names), dtype=np.int64, count=d)
        masks[k, cols], scores[k, cols] = b.mask, b.scores
    return masks, scores, [b.n_samples for b in ballots]


def _normalised(mask: np.ndarray, score: np.ndarray, constant: float) -> np.ndarray:
    """Min-max of the signed scores over the selected entries; unselected 0; a constant
    selection gets ``constant``. Same operations as the peers: ``(s - lo) / (hi - lo)``."""
    out = np.zeros_like(score)
    if mask.any():
        sel = score[mask]
        lo, hi = sel.min(), sel.max()
        out[mask] = (sel - lo) / (hi - lo) if hi > lo else constant
    return out


def _nvflare_votes(masks: np.ndarray, scores: np.ndarray, n: list[int], aggregation: str) -> np.ndarray:
    k = len(n)
    total = sum(n)
    weights = np.array(n) / total if aggregation == "weighted" else np.ones(k) / k
    votes = np.zeros(masks.shape[1])
    for i in range(k):  # accumulated site by site, as FLARE's controller does
        votes += _normalised(masks[i], scores[i], 0.5) * weights[i]
    return votes


def _flash_votes(masks: np.ndarray, scores: np.ndarray, n: list[int], aggregation: str,
                 intersection: np.ndarray) -> np.ndarray:
    total = sum(n)
    rows = []
    for i in range(len(n)):
        row = _normalised(masks[i], scores[i], 1.0)
        row[intersection] = 0.0
        rows.append(row * (n[i] / total) if aggregation == "weighted" else row)
    return np.stack(rows).sum(axis=0)


def elect_compat(
    ballots: Sequence[Ballot],
    feature_names: Sequence[str] | None,
    freedom_degree: float,
    aggregation: str,
    compat: str,
) -> ElectionResult:
    """Elect with a peer's server rule (see the module docstring for the differences).

    Args:
        ballots: validated ballots, each over every feature of the election.
        feature_names: the global order (``None``: positional, every ballot in one order).
        freedom_degree, aggregation: as :func:`~fedtab.election.tally.elect`.
        compat: ``"nvflare"``, ``"flash"`` or ``"flower"``.

    Raises:
        ValueError: no ballots, an unknown profile/aggregation, ``fd`` outside [0, 1], or a
            ballot that does not cover every feature (naming the site).
    """
    compat = check_compat(compat)
    if compat is None:
        raise ValueError("elect_compat needs a compat profile; use elect() for fedtab's rule")
    fd = check_freedom_degree(freedom_degree)
    check_aggregation(aggregation)
    if not ballots:
        raise ValueError("no ballots: at least one site must vote")
    masks, scores, n = _matrices(ballots, feature_names, compat)
    d = masks.shape[1]
    dropped: tuple[str, ...] = ()
    if compat == "nvflare":  # FLARE drops all-False ballots before anything else
        voting = [i for i in range(len(ballots)) if masks[i].any()]
        dropped = tuple(ballots[i].site for i in range(len(ballots)) if i not in set(voting))
        masks, scores, n = masks[voting], scores[voting], [n[i] for i in voting]
    held_by = np.full(d, masks.shape[0], dtype=np.int64)
    selected_by = masks.sum(axis=0).astype(np.int64)
    intersection = masks.all(axis=0) if masks.shape[0] else np.zeros(d, dtype=bool)
    union = masks.any(axis=0)
    disputed = union & ~intersection
    idx = np.flatnonzero(disputed)
    if compat == "nvflare":
        votes = _nvflare_votes(masks, scores, n, aggregation) if n else np.zeros(d)
        lo, hi = fd <= 0.01, fd >= 0.99
        # FLARE keeps the tail of a stable ascending argsort: among equal votes, the higher index
        order = idx[np.argsort(votes[idx], kind="stable")[::-1]]
    else:
        votes = _flash_votes(masks, scores, n, aggregation, intersection)
        lo, hi = fd == 0, fd == 1
        order = idx[np.lexsort((idx, -votes[idx]))]  # highest first, lower index on ties
    mask = intersection.copy()
    rank = np.zeros(d, dtype=np.int64)
    if hi:
        mask |= union
    elif not lo and idx.size:
        k = int(np.ceil(idx.size * fd))
        if compat == "flash":  # every disputed feature tied with the k-th is admitted
            threshold = np.sort(votes[idx])[-min(k, idx.size)]
            mask |= disputed & (votes >= threshold)
        else:
            mask[order[:k]] = True
        rank[order] = np.arange(1, order.size + 1)
    stats = election_stats(masks.shape[0], intersection, union, idx.size, mask)
    if compat == "nvflare":
        stats["dropped_sites"] = len(dropped)
    names = feature_names if feature_names is not None else PositionalNames(d)
    return ElectionResult(
        feature_names=names if isinstance(names, PositionalNames) else tuple(names),
        mask=mask,
        votes=votes,
        stats=stats,
        selected_by=selected_by,
        held_by=held_by,
        freedom_degree=fd,
        aggregation=aggregation,
        normalization="selected",
        rank=rank,
        compat=compat,
        dropped_sites=dropped,
    )
