"""Privacy accounting of a run: calibrate one noise multiplier, report ε per step and in total.

A workflow plans its Gaussian releases up front (``{step: number of releases}``, each
release a Gaussian mechanism whose noise is ``z`` times its L2 sensitivity), asks
:func:`calibrate` for the smallest ``z`` whose composition over all releases spends at
most the target (ε, δ), and reports :meth:`PrivacyLedger.report`. Composition uses
Google's ``dp-accounting`` Rényi-DP accountant (``RdpAccountant`` over
``GaussianDpEvent`` s); the per-step ε is each step's own composition, the total is the
composition of all steps (smaller than the sum of the per-step values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["PrivacyLedger", "calibrate", "epsilon_of"]


def _accountant():
    try:
        from dp_accounting import GaussianDpEvent, SelfComposedDpEvent
        from dp_accounting.rdp import RdpAccountant
    except ImportError as exc:  # pragma: no cover - only without the privacy extra
        raise ImportError("differential privacy needs the dp-accounting package (pip install fedtab[privacy])") from exc
    return RdpAccountant, GaussianDpEvent, SelfComposedDpEvent


def epsilon_of(noise_multiplier: float, releases: int | Mapping[float, int], delta: float) -> float:
    """ε spent by Gaussian releases with noise ``noise_multiplier`` × sensitivity; ``releases``
    is a count, or ``{relative noise scale: count}`` for releases noised ``scale`` times more."""
    counts = {1.0: int(releases)} if isinstance(releases, (int, float)) else dict(releases)
    counts = {float(k): int(v) for k, v in counts.items() if int(v) > 0}
    if not counts:
        return 0.0
    RdpAccountant, GaussianDpEvent, SelfComposedDpEvent = _accountant()
    acc = RdpAccountant()
    for scale, n in counts.items():
        acc.compose(SelfComposedDpEvent(GaussianDpEvent(float(noise_multiplier) * scale), n))
    return float(acc.get_epsilon(float(delta)))


def calibrate(epsilon: float, delta: float, releases: int | Mapping[float, int], tol: float = 1e-3) -> float:
    """Smallest base noise multiplier (to ``tol`` relative) whose composition of ``releases``
    (as in :func:`epsilon_of`) spends ≤ ε.

    Raises:
        ValueError: ε ≤ 0, δ outside (0, 1), or no release planned.
    """
    if not epsilon > 0 or not 0 < delta < 1:
        raise ValueError(f"differential privacy needs epsilon > 0 and 0 < delta < 1, got {epsilon}, {delta}")
    total = releases if isinstance(releases, (int, float)) else sum(releases.values())
    if total < 1:
        raise ValueError("nothing to calibrate: no release planned")
    lo, hi = 1e-3, 1.0
    while epsilon_of(hi, releases, delta) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e7:
            raise ValueError(f"epsilon={epsilon} is unreachable with {total} releases")
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi)
        if epsilon_of(mid, releases, delta) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass
class PrivacyLedger:
    """The DP plan and bill of one workflow run.

    Attributes:
        epsilon, delta: the target. plan: ``{step: releases}`` planned.
        noise_multiplier: base ``z`` from :func:`calibrate` (``inf`` = no noise, ε = ∞ target).
        scales: ``{step: factor}``: the step's releases use ``factor × z`` (default 1) —
            many cheap releases (gradient steps) can take more noise than a few
            statistics, for the same total ε.
        spent: ``{step: releases}`` actually made so far.
    """

    epsilon: float
    delta: float
    plan: dict[str, int]
    noise_multiplier: float = math.inf
    scales: dict[str, float] = field(default_factory=dict)
    spent: dict[str, int] = field(default_factory=dict)

    @classmethod
    def for_plan(cls, dp: Mapping[str, Any], plan: Mapping[str, int],
                 scales: Mapping[str, float] | None = None) -> "PrivacyLedger":
        """Calibrate ``z`` for ``plan`` (with per-step ``scales``) under ``dp = {"epsilon", "delta"}``."""
        eps, delta = float(dp["epsilon"]), float(dp.get("delta", 1e-5))
        scales = {k: float(v) for k, v in (scales or {}).items()}
        total = int(sum(plan.values()))
        z = math.inf if math.isinf(eps) or total == 0 else calibrate(eps, delta, _by_scale(plan, scales))
        return cls(eps, delta, {k: int(v) for k, v in plan.items()}, z, scales)

    def multiplier(self, step: str) -> float:
        """The noise multiplier of ``step``'s releases."""
        return self.noise_multiplier * self.scales.get(step, 1.0)

    def spend(self, step: str, releases: int = 1) -> None:
        """Record releases of ``step``.

        Raises:
            RuntimeError: more releases than planned (the calibration would be wrong).
        """
        used = self.spent.get(step, 0) + int(releases)
        if used > self.plan.get(step, 0):
            raise RuntimeError(f"DP step {step!r}: release {used} exceeds the {self.plan.get(step, 0)} planned")
        self.spent[step] = used

    def report(self) -> dict[str, Any]:
        """``{"epsilon", "delta", "noise_multiplier", "steps": {step: ε spent}, "total", "releases"}``
        (JSON-able; ε values are ``None`` when nothing was noised)."""
        z = self.noise_multiplier
        if math.isinf(z):  # nothing was noised: no finite guarantee
            steps = {k: None for k in self.spent}
            total = None
        else:
            steps = {k: epsilon_of(z, {self.scales.get(k, 1.0): n}, self.delta) for k, n in self.spent.items()}
            total = epsilon_of(z, _by_scale(self.spent, self.scales), self.delta)
        return {"epsilon": self.epsilon if math.isfinite(self.epsilon) else None, "delta": self.delta,
                "noise_multiplier": z if math.isfinite(z) else None, "steps": steps, "total": total,
                "releases": dict(self.spent), "scales": dict(self.scales)}


def _by_scale(counts: Mapping[str, int], scales: Mapping[str, float]) -> dict[float, int]:
    out: dict[float, int] = {}
    for step, n in counts.items():
        key = float(scales.get(step, 1.0))
        out[key] = out.get(key, 0) + int(n)
    return out
