"""A site's ballot: which features it keeps, how strongly it rates each, how many rows it saw."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Sequence

import numpy as np

__all__ = ["Ballot", "check_n_samples", "check_freedom_degree", "check_pvalues"]


def check_n_samples(n: Any, site: str) -> int:
    """``n`` as a positive ``int``; ``ValueError`` naming ``site`` otherwise."""
    if isinstance(n, (bool, np.bool_)):
        raise ValueError(f"{site}: n_samples must be a positive integer, got {n!r}")
    if isinstance(n, Integral):
        value = int(n)
    elif isinstance(n, Real) and float(n).is_integer():
        value = int(n)
    else:
        raise ValueError(f"{site}: n_samples must be a positive integer, got {n!r}")
    if value <= 0:
        raise ValueError(f"{site}: n_samples must be a positive integer, got {value}")
    return value


def check_pvalues(pvalues: Any, d: int, label: str) -> np.ndarray:
    """``pvalues`` as a ``(d,)`` float array of finite values in [0, 1]; ``ValueError`` naming ``label``."""
    try:
        p = np.asarray(pvalues, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{label}: p-values must be numeric") from None
    if p.shape != (d,):
        raise ValueError(f"{label}: {p.size} p-values for {d} mask entries (shape {p.shape})")
    if not np.isfinite(p).all() or (p < 0).any() or (p > 1).any():
        raise ValueError(f"{label}: p-values must be finite numbers in [0, 1]")
    return p


def check_freedom_degree(fd: Any) -> float:
    """``fd`` as a float in ``[0, 1]``; ``ValueError`` otherwise."""
    if isinstance(fd, (bool, np.bool_)) or not isinstance(fd, Real) or not np.isfinite(fd) or not 0.0 <= fd <= 1.0:
        raise ValueError(f"freedom_degree must be a number in [0, 1], got {fd!r}")
    return float(fd)


@dataclass(frozen=True)
class Ballot:
    """One site's vote.

    Attributes:
        mask: ``(d,)`` bool, True = the site's selector keeps the feature.
        scores: ``(d,)`` float, the selector's importance per feature (sign ignored).
        n_samples: rows the site selected on (positive int), the weight of its vote.
        feature_names: ``d`` names the mask and scores refer to, or ``None`` when all
            sites share one column order.
        site: the site's name, used in error messages.
        pvalues: ``(d,)`` float in [0, 1], the p-value of the selector's test per
            feature, or ``None``. Only ``consensus="stouffer"`` asks for and uses them
            (see :mod:`fedtab.election.evidence`).
        n_effective: with ``pvalues``, the site's effective sample size in
            ``(0, n_samples]`` (its Stouffer weight; default ``n_samples``).
    """

    mask: np.ndarray
    scores: np.ndarray
    n_samples: int
    feature_names: tuple[str, ...] | None = None
    site: str = "site"
    pvalues: np.ndarray | None = None
    n_effective: float | None = None

    @classmethod
    def build(
        cls,
        mask: Any,
        scores: Any,
        n_samples: Any,
        feature_names: Sequence[str] | None = None,
        site: str = "site",
        pvalues: Any = None,
        n_effective: Any = None,
    ) -> "Ballot":
        """Validate and normalise the inputs into a ballot.

        Raises:
            ValueError: (naming ``site``) mask/scores not 1-D or of different lengths,
                a mask that is not boolean (0/1 integers are accepted), non-finite or
                non-numeric scores, ``n_samples`` not a positive integer, names whose
                count differs from the mask's length, duplicate names, or ``pvalues``
                (when given) not finite numbers in [0, 1] of the mask's shape,
                ``n_effective`` not a number in ``(0, n_samples]``.
        """
        label = f"site {site!r}"
        m = np.asarray(mask)
        if m.ndim != 1:
            raise ValueError(f"{label}: mask must be 1-D, got shape {m.shape}")
        if m.dtype != bool:
            if m.dtype.kind in "iu" or (m.dtype.kind == "f" and np.all(np.isfinite(m))):
                if not np.isin(m, (0, 1)).all():
                    raise ValueError(f"{label}: mask must be boolean (or 0/1), got other values")
                m = m.astype(bool)
            else:
                raise ValueError(f"{label}: mask must be boolean, got dtype {m.dtype}")
        try:
            s = np.asarray(scores, dtype=np.float64)
        except (TypeError, ValueError):
            raise ValueError(f"{label}: scores must be numeric") from None
        if s.ndim != 1:
            raise ValueError(f"{label}: scores must be 1-D, got shape {s.shape}")
        if s.shape != m.shape:
            raise ValueError(f"{label}: mask has {m.size} entries but scores have {s.size}")
        if not np.isfinite(s).all():
            bad = int((~np.isfinite(s)).sum())
            raise ValueError(f"{label}: {bad} score(s) are not finite (NaN or inf)")
        n = check_n_samples(n_samples, label)
        names: tuple[str, ...] | None = None
        if feature_names is not None:
            names = tuple(map(str, feature_names))
            if len(names) != m.size:
                raise ValueError(f"{label}: {len(names)} feature names for {m.size} mask entries")
            if len(set(names)) != len(names):
                raise ValueError(f"{label}: duplicate feature names in the ballot")
        p = None if pvalues is None else check_pvalues(pvalues, m.size, label)
        eff = None
        if n_effective is not None:
            if isinstance(n_effective, (bool, np.bool_)) or not isinstance(n_effective, Real) \
                    or not 0 < float(n_effective) <= n:
                raise ValueError(f"{label}: n_effective must be a number in (0, n_samples={n}], got {n_effective!r}")
            eff = float(n_effective)
        return cls(m, s, n, names, str(site), p, eff)

    @property
    def n_features(self) -> int:
        return int(self.mask.size)

    @property
    def n_selected(self) -> int:
        return int(self.mask.sum())
