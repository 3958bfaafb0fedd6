"""A run's options: how sums travel, differential privacy, robust reduction — chosen once.

A mode is a strategy chosen once per run, not a boolean tested inside every workflow
(``../shared/DESIGN.md``): :func:`set_options` fixes the run's :class:`RunOptions` on the
:class:`~fedtab.federation.protocol.Federation`, every workflow reads them from there
(``federation.options``), sums travel by the strategy they select
(``federation.summing``: plain or secure, :mod:`fedtab.federation.protocol.summing`), and
one accountant composes the run's DP releases (``federation.privacy_ledger``, see
:func:`run_ledger`).

The quorum (``min_sites``) and the per-exchange timeout stay where they were: on the
federation (``Federation.min_sites``) and on the engine that delivers the messages.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from ...privacy.accountant import PrivacyLedger
    from .federation import Federation

from fedtab.federation.protocol.reduce import DEFAULT_MAX_SITE_SHARE

__all__ = ["RunOptions", "PrivacyOptions", "TrustOptions", "set_options", "set_step_dp", "run_ledger", "plan_run_ledger"]

log = logging.getLogger("fedtab.federation")


@dataclass(frozen=True)
class PrivacyOptions:
    """``secure_aggregation``: every quantity the server needs only summed travels masked
    (:mod:`fedtab.privacy.secagg`). ``dp``: the run's differential privacy — its *total*
    budget ``{"epsilon", "delta", "bounds", "clip"}`` (:func:`fedtab.privacy.dp.parse_dp`),
    composed over every step by one accountant; ``None`` = no DP."""

    secure_aggregation: bool = False
    dp: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class TrustOptions:
    """``robust``: the robust reducers of :mod:`fedtab.federation.protocol.reduce` (median votes,
    screened and capped moments, coordinate-wise median FedAvg, median scores) instead of
    sums; ``max_site_share``: their ceiling on one site's share of a pooled sum;
    ``min_holders``: holders a feature needs to be election consensus (``None``: the
    election's default)."""

    robust: bool = False
    max_site_share: float = DEFAULT_MAX_SITE_SHARE
    min_holders: int | None = None


@dataclass(frozen=True)
class RunOptions:
    """The options of one run (see the module docstring)."""

    privacy: PrivacyOptions = field(default_factory=PrivacyOptions)
    trust: TrustOptions = field(default_factory=TrustOptions)

    def __post_init__(self) -> None:
        from ...privacy.dp import parse_dp
        from fedtab.federation.protocol.reduce import check_max_site_share

        check_max_site_share(self.trust.max_site_share)
        mh = self.trust.min_holders
        if mh is not None and (isinstance(mh, bool) or not isinstance(mh, int) or mh < 1):
            raise ValueError(f"min_holders must be a positive integer, got {mh!r}")
        if self.trust.robust and self.privacy.secure_aggregation:
            raise ValueError("robust=True cannot be combined with secure_aggregation=True: the robust reducers need "
                             "each site's values, secure aggregation shows the server only their sum")
        spec = parse_dp(self.privacy.dp)  # validates; None when epsilon is infinite
        object.__setattr__(self, "privacy", replace(self.privacy, dp=spec))

    @classmethod
    def of(cls, *, secure_aggregation: bool = False, dp: Mapping[str, Any] | None = None, robust: bool = False,
           max_site_share: float = DEFAULT_MAX_SITE_SHARE, min_holders: int | None = None) -> "RunOptions":
        """The options from flat settings (what a job file's ``[privacy]`` and ``[trust]`` hold).

        Raises:
            ValueError: robust with secure aggregation, invalid DP settings, a share outside
                (0, 1], a min_holders that is not a positive integer.
        """
        return cls(PrivacyOptions(bool(secure_aggregation), dp),
                   TrustOptions(bool(robust), float(max_site_share), min_holders))

    @property
    def secure(self) -> bool:
        return self.privacy.secure_aggregation

    @property
    def dp(self) -> dict[str, Any] | None:
        return None if self.privacy.dp is None else dict(self.privacy.dp)

    @property
    def robust(self) -> bool:
        return self.trust.robust

    @property
    def max_site_share(self) -> float:
        return self.trust.max_site_share

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (``result.json``'s ``privacy`` / ``trust`` settings)."""
        return {"privacy": {"secure_aggregation": self.secure, "dp": self.dp},
                "trust": {"robust": self.robust, "max_site_share": self.max_site_share,
                          "min_holders": self.trust.min_holders}}


def set_options(federation: "Federation", options: RunOptions | None = None, **settings: Any) -> RunOptions:
    """Fix the run's options on ``federation`` (``options``, or :meth:`RunOptions.of` of
    ``settings``); the summing strategy and the accountant are made afresh from them.

    Raises:
        ValueError: as :meth:`RunOptions.of`, or both ``options`` and ``settings`` given.
    """
    if options is not None and settings:
        raise ValueError("give either options or settings, not both")
    opts = options if options is not None else RunOptions.of(**settings)
    federation._options = opts
    federation._summing = None
    federation.privacy_ledger = None
    return opts


def set_step_dp(federation: "Federation", dp: Mapping[str, Any] | None) -> RunOptions:
    """Give the next step of a run its own DP budget ``dp`` (``None``: no DP), keeping every
    other option and the summing strategy (a secure-aggregation session is not restarted).

    A job splits its total budget over its releasing steps this way
    (:func:`fedtab.job.guarantees.dp_for`, basic composition); the previous step's
    accountant, if it spent anything, is kept in ``federation.privacy_spent``.

    Raises:
        ValueError: invalid DP settings (as :class:`RunOptions`).
    """
    opts = federation.options
    new = RunOptions(replace(opts.privacy, dp=None if dp is None else dict(dp)), opts.trust)
    ledger = federation.privacy_ledger
    if ledger is not None and any(ledger.spent.values()):
        federation.privacy_spent.append(ledger.report())
    federation._options = new
    federation.privacy_ledger = None
    return new


def run_ledger(federation: "Federation", plan: Mapping[str, int],
               scales: Mapping[str, float] | None = None) -> "PrivacyLedger | None":
    """The accountant this step spends from, ``None`` without DP.

    The run's accountant when one was planned for these steps: a job plans every step's
    releases up front (:func:`plan_run_ledger`) and one noise multiplier is calibrated for
    the whole budget. A workflow run on its own, whose steps the run's accountant did not
    plan, gets an accountant for its own plan, with the whole budget (as a separate run: a
    warning says so).
    """
    from ...privacy.accountant import PrivacyLedger

    dp = federation.options.dp
    if dp is None:
        return None
    ledger = federation.privacy_ledger
    planned = {k for k, n in plan.items() if n > 0}
    if ledger is not None and planned <= {k for k, n in ledger.plan.items() if n > 0}:
        return ledger
    if ledger is not None and any(ledger.spent.values()):
        log.warning("DP steps %s were not planned with the run's earlier steps: they get their own budget of "
                    "epsilon=%g (plan the whole run at once to share one budget)", sorted(planned),
                    float(dp["epsilon"]))
        federation.privacy_spent.append(ledger.report())
    federation.privacy_ledger = PrivacyLedger.for_plan(dp, plan, scales)
    return federation.privacy_ledger


def plan_run_ledger(federation: "Federation", plans: list[tuple[Mapping[str, int], Mapping[str, float]]]
                    ) -> "PrivacyLedger | None":
    """One accountant for every step of a run: the union of the steps' ``(plan, scales)``,
    calibrated once for the run's whole budget (``None`` without DP)."""
    from ...privacy.accountant import PrivacyLedger

    dp = federation.options.dp
    if dp is None:
        return None
    plan: dict[str, int] = {}
    scales: dict[str, float] = {}
    for p, sc in plans:
        plan.update({k: int(v) for k, v in p.items()})
        scales.update({k: float(v) for k, v in sc.items()})
    federation.privacy_ledger = PrivacyLedger.for_plan(dp, plan, scales)
    return federation.privacy_ledger
