"""Hyper-parameters of histogram gradient boosting (:class:`GBDTParams`).

Names and defaults follow XGBoost's (``n_trees`` is its ``num_boost_round``, ``max_bins``
its ``max_bin``, ``gamma`` its ``min_split_loss``), so :meth:`GBDTParams.xgboost_params`
is a one-to-one translation for the reference runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

__all__ = ["GBDTParams", "OBJECTIVES"]

#: fedtab objective -> XGBoost objective.
OBJECTIVES = {"binary": "binary:logistic", "multiclass": "multi:softprob", "regression": "reg:squarederror"}


@dataclass(frozen=True)
class GBDTParams:
    """Settings of one boosting run (validated on construction; raises ``ValueError``).

    Args:
        objective: ``"binary"`` (logistic loss, labels 0/1), ``"multiclass"`` (softmax,
            labels ``0..n_classes-1``, one tree per class per round as XGBoost) or
            ``"regression"`` (squared error).
        n_classes: number of classes (2 for binary, ignored for regression).
        n_trees: boosting rounds (XGBoost's ``num_boost_round``); a multiclass round grows
            ``n_classes`` trees.
        max_depth: depth of every tree (≥ 1); the root is depth 0, leaves at most ``max_depth``.
        learning_rate: shrinkage ``eta`` applied to every leaf value.
        max_bins: at most this many value bins per feature (plus one missing bin), 2..65535.
        reg_lambda: L2 penalty λ on leaf weights.
        gamma: minimum loss change to split (XGBoost's ``min_split_loss``, compared with the
            gain *without* XGBoost's documented factor ½ — see :mod:`.split`).
        min_child_weight: minimum hessian sum in each child of a split.
        subsample: fraction of rows each site draws (Bernoulli, site-side RNG) per round.
        early_stopping_rounds: stop when the pooled validation loss has not improved for this
            many rounds (``None`` = never); the model keeps the rounds up to the best one.
        base_score: XGBoost's ``base_score`` (probability for binary, value for regression,
            ignored for multiclass); ``None`` = estimated from pooled label sums as XGBoost ≥ 3.1.
        sketch_size: kept so that parameter files naming it load; it shapes nothing (the
            bin edges come from public bounds or the quantile sketch of :mod:`.sketch`, whose
            grids are fixed there).
        min_rows: the floor of the release rules of the level histograms (a site uses the
            larger of its own and this); in :func:`~.pooled.fit_gbdt_sites` also the sites'
            floor of their sketch counts.
        seed: seed of the site-side subsampling streams (each site mixes in its own secret).
    """

    objective: str = "binary"
    n_classes: int = 2
    n_trees: int = 100
    max_depth: int = 6
    learning_rate: float = 0.3
    max_bins: int = 256
    reg_lambda: float = 1.0
    gamma: float = 0.0
    min_child_weight: float = 1.0
    subsample: float = 1.0
    early_stopping_rounds: int | None = None
    base_score: float | None = None
    sketch_size: int = 1024
    min_rows: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {self.objective!r}")
        if self.objective == "binary" and self.n_classes != 2:
            raise ValueError(f"binary objective needs n_classes=2, got {self.n_classes}")
        if self.objective == "multiclass" and (not isinstance(self.n_classes, int) or self.n_classes < 2):
            raise ValueError(f"multiclass objective needs n_classes >= 2, got {self.n_classes}")
        ints = {"n_trees": (1, 100_000), "max_depth": (1, 30), "max_bins": (2, 65535),
                "sketch_size": (2, 1_000_000), "min_rows": (1, 10**9)}
        for name, (lo, hi) in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
        for name in ("learning_rate", "reg_lambda", "gamma", "min_child_weight", "subsample"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite non-negative number, got {v!r}")
        if not 0 < self.learning_rate <= 1:
            raise ValueError(f"learning_rate must be in (0, 1], got {self.learning_rate}")
        if not 0 < self.subsample <= 1:
            raise ValueError(f"subsample must be in (0, 1], got {self.subsample}")
        esr = self.early_stopping_rounds
        if esr is not None and (isinstance(esr, bool) or not isinstance(esr, int) or esr < 1):
            raise ValueError(f"early_stopping_rounds must be a positive integer or None, got {esr!r}")
        bs = self.base_score
        if bs is not None:
            if isinstance(bs, bool) or not isinstance(bs, (int, float)) or not math.isfinite(bs):
                raise ValueError(f"base_score must be a finite number or None, got {bs!r}")
            if self.objective == "binary" and not 0 < bs < 1:
                raise ValueError(f"binary base_score is a probability in (0, 1), got {bs}")

    @property
    def n_outputs(self) -> int:
        """Trees per round: ``n_classes`` for multiclass, else 1."""
        return self.n_classes if self.objective == "multiclass" else 1

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "GBDTParams":
        """From a mapping (a ``[training] model.params`` table); unknown keys raise ``ValueError``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown GBDT parameters {unknown}; known: {sorted(known)}")
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def xgboost_params(self) -> dict[str, Any]:
        """The same settings for ``xgboost.train`` (``tree_method="hist"``, depth-wise growth).

        ``n_trees`` is not in the dict (pass it as ``num_boost_round``); ``base_score`` only
        when set (otherwise XGBoost estimates the same intercept, see :mod:`.objectives`).
        """
        out: dict[str, Any] = {
            "objective": OBJECTIVES[self.objective], "tree_method": "hist", "grow_policy": "depthwise",
            "max_depth": self.max_depth, "eta": self.learning_rate, "max_bin": self.max_bins,
            "reg_lambda": self.reg_lambda, "reg_alpha": 0.0, "gamma": self.gamma,
            "min_child_weight": self.min_child_weight, "subsample": self.subsample,
            "max_delta_step": 0.0,
        }
        if self.objective == "multiclass":
            out["num_class"] = self.n_classes
        if self.base_score is not None and self.objective != "multiclass":
            out["base_score"] = self.base_score
        return out
