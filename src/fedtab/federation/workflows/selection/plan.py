"""The selection's server-side plan: candidates, chains and their standardisations (no traffic).

A *candidate* is a way to choose the columns: the election at one freedom degree, or all
columns (no election — always a candidate). Elected inside the cross-validation, a
candidate's mask may differ per fold (each fold's ballots were cast on that fold's fit
rows), and its refit mask comes from the ballots on the whole training rows.

A *chain* is one model the sites train by FedAvg: a mask, a fold (``-1`` = the refit on
all training rows) and optionally a site it trains without (leave-one-site-out). Chains
that coincide are trained once; every chain of a round travels in the same exchange.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from fedtab.election.ballot import Ballot
from fedtab.federation.steps.describe import pooled_standardisation

__all__ = ["Candidate", "Chain", "Plan", "fold_ballots", "build_plan", "chain_standardisation"]

ALL = "all columns"


@dataclass
class Candidate:
    """One candidate: ``name`` (``"fd=0.3"`` or ``"all columns"``, with ``", l2=…"`` when
    several strengths are compared), its ``freedom_degree`` (``None`` for all columns), the
    fold masks ``(K, d)`` and refit mask ``(d,)`` over the plan's features, the model's L2
    strength ``l2``, and (filled by :func:`build_plan`) its chains."""

    name: str
    freedom_degree: float | None
    fold_masks: np.ndarray
    refit_mask: np.ndarray
    l2: float = 1e-3
    cv_chains: list[int] = field(default_factory=list)
    refit_chain: int = -1
    loso_chains: dict[str, list[int]] = field(default_factory=dict)

    @property
    def kept(self) -> int:
        return int(self.refit_mask.sum())


@dataclass(frozen=True)
class Chain:
    """A model to train: ``mask`` (index into :attr:`Plan.masks`), ``fold`` (``-1``: refit),
    ``without`` (the site it leaves out, or ``""``), ``l2`` (the model's L2 strength)."""

    mask: int
    fold: int
    without: str = ""
    l2: float = 1e-3


@dataclass
class Plan:
    """Features ``(d,)`` names, distinct ``masks`` ``(U, d)``, ``chains``, ``candidates``, folds ``K``."""

    features: list[str]
    masks: np.ndarray
    chains: list[Chain]
    candidates: list[Candidate]
    n_folds: int


def fold_ballots(per_site: Mapping[str, Sequence[Ballot | None]], n_folds: Mapping[str, int], fold: int
                 ) -> list[Ballot]:
    """The ballots that elect fold ``fold``'s mask (``-1``: the refit): each site's ballot on
    its ``fit:fold`` rows, or on its training rows when it has no such fold (it trains on
    them there); sites that abstained on that part are left out."""
    out = []
    for site, ballots in per_site.items():
        b = ballots[fold] if 0 <= fold < n_folds[site] else ballots[-1]
        if b is not None:
            out.append(b)
    return out


def build_plan(features: list[str], candidates: list[Candidate], sites: Sequence[str], *, loso: bool) -> Plan:
    """Deduplicate the candidates' masks into chains: one per (mask, fold) of the folds,
    one refit per candidate, and (``loso``) one per (mask, fold, left-out site)."""
    K = candidates[0].fold_masks.shape[0]
    masks: dict[bytes, int] = {}
    mask_list: list[np.ndarray] = []
    chains: dict[Chain, int] = {}

    def mask_id(mask: np.ndarray) -> int:
        key = np.asarray(mask, bool).tobytes()
        if key not in masks:
            masks[key] = len(mask_list)
            mask_list.append(np.asarray(mask, bool))
        return masks[key]

    def chain_id(chain: Chain) -> int:
        return chains.setdefault(chain, len(chains))

    for c in candidates:
        c.cv_chains = [chain_id(Chain(mask_id(c.fold_masks[k]), k, "", c.l2)) for k in range(K)]
        c.refit_chain = chain_id(Chain(mask_id(c.refit_mask), -1, "", c.l2))
        if loso:
            c.loso_chains = {s: [chain_id(Chain(mask_id(c.fold_masks[k]), k, s, c.l2)) for k in range(K)]
                             for s in sites}
    return Plan(list(features), np.array(mask_list, dtype=bool).reshape(len(mask_list), len(features)),
                list(chains), candidates, K)


def chain_standardisation(plan: Plan, moments: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
                          n_folds: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` ``(M, d)`` of every chain: the pooled moments of the sites that train it
    on the part they train it on (``moments[site]`` = ``(count, sum, sumsq)`` ``(P, d)`` over
    the site's parts ``fit:0 … fit:K-1, train``); std not above 1e-12 becomes 1."""
    d = len(plan.features)
    mean, std = np.zeros((len(plan.chains), d)), np.ones((len(plan.chains), d))
    for m, ch in enumerate(plan.chains):
        tot = [np.zeros(d), np.zeros(d), np.zeros(d)]
        for site, (cnt, s1, s2) in moments.items():
            if site == ch.without:
                continue
            p = ch.fold if 0 <= ch.fold < n_folds[site] else -1
            for acc, a in zip(tot, (cnt, s1, s2)):
                acc += a[p]
        mu, sd = pooled_standardisation(*tot, floor=True)
        mean[m], std[m] = mu, sd
    return mean, std
