"""The job's guarantees, read from its :class:`~fedtab.job.spec.JobSpec` once: the quorum and
timeout of the federation, the run's options, the DP budget's accountants, and what
``result.json`` records about them (``privacy``, ``trust``, ``participation``).

The privacy budget ``[privacy] dp`` is the run's *total*. One accountant (the dp-accounting
RDP accountant, :class:`fedtab.privacy.accountant.PrivacyLedger`) composes every release of
the election and training steps (the all-columns comparison included): the job plans their
releases before the first of them (:func:`use_run_accountant`) and one noise multiplier is
calibrated for all of them. The imputation, which runs first and plans its releases on its
own, gets an equal share of the budget (:func:`dp_for`: ε/k, δ/k over the k releasing
steps, :func:`releasing_steps`) and the accountant the rest (:func:`accountant_dp`); by
basic composition the two spend at most the total, which :func:`privacy_record` reports.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from ..federation.protocol import Federation
    from .outputs import Outputs
    from .spec import JobSpec

__all__ = ["accountant_dp", "apply_options", "apply_trust", "dp_for", "run_plan", "use_run_accountant", "participation_record", "privacy_record", "releasing_steps", "trust_record"]


def apply_trust(federation: "Federation", spec: "JobSpec") -> None:
    """Set the run's quorum (``[trust] min_sites``) and per-exchange timeout (``[trust] timeout``)
    on ``federation``; unset values keep the federation's own.

    Raises:
        ValueError: ``min_sites`` above the federation's sites.
    """
    from ..federation.protocol import set_quorum

    set_quorum(federation, spec.trust.min_sites)
    if spec.trust.timeout is not None:
        federation.timeout = float(spec.trust.timeout)


def apply_options(federation: "Federation", spec: "JobSpec") -> None:
    """Fix the run's options on ``federation`` from ``[privacy]`` and ``[trust]``
    (:func:`fedtab.federation.protocol.set_options`): how sums travel (secure aggregation
    or plain), the robust reducers, ``max_site_share`` and ``min_holders``. DP starts off;
    each releasing step sets its share of the budget (:func:`dp_for`) before it runs.

    Raises:
        ValueError: settings that cannot hold together (robust with secure aggregation).
    """
    from ..federation.protocol import set_options

    t = spec.trust
    kwargs: dict[str, Any] = {"secure_aggregation": spec.privacy.secure_aggregation, "robust": t.robust,
                              "min_holders": t.min_holders}
    if t.max_site_share is not None:
        kwargs["max_site_share"] = t.max_site_share
    set_options(federation, **kwargs)


def releasing_steps(spec: "JobSpec") -> list[str]:
    """The steps of ``spec`` that make DP releases, in run order (the tuning, the score test and
    the baselines have no DP mode; :func:`~fedtab.job.spec.check_spec` refuses or skips them)."""
    steps = []
    if spec.impute is not None:
        steps.append("imputation")
    if spec.election is not None and spec.election.method == "vote":
        steps.append("election")
    if spec.training is not None:
        steps.append("training")
        if spec.evaluation.all_columns:
            steps.append("all_columns")
    return steps


def dp_for(spec: "JobSpec", step: str) -> dict[str, Any] | None:
    """The ``dp`` argument of ``step``'s workflow: the total budget's equal share (ε/k, δ/k over the
    k releasing steps), or ``None`` without ``[privacy] dp``.

    Raises:
        ValueError: ``step`` makes no DP release in this job.
    """
    dp = spec.privacy.dp
    if dp is None:
        return None
    steps = releasing_steps(spec)
    if step not in steps:
        raise ValueError(f"step {step!r} makes no DP release in this job")
    return {**dp, "epsilon": dp["epsilon"] / len(steps), "delta": dp["delta"] / len(steps)}


def accountant_dp(spec: "JobSpec") -> dict[str, Any] | None:
    """The budget of the run's one accountant: the total less the imputation's share (the
    whole budget without imputation), or ``None`` without ``[privacy] dp`` or without a step
    it pays for."""
    dp = spec.privacy.dp
    steps = releasing_steps(spec)
    paid = [s for s in steps if s != "imputation"]
    if dp is None or not paid:
        return None
    share = len(paid) / len(steps)
    return {**dp, "epsilon": dp["epsilon"] * share, "delta": dp["delta"] * share}


def run_plan(spec: "JobSpec", ballots_given: bool = False) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per DP step, noise scale per DP step)`` of every release the run's accountant
    pays for: the election's ballot and description (unless ``ballots_given``), the training's
    description (unless the election gathered it), rounds and evaluation, and the all-columns
    comparison's training (its releases add to the training's: the same steps, run twice)."""
    from fedtab.federation.workflows.election.server import dp_plan as election_plan
    from fedtab.federation.workflows.training.steps import dp_plan as training_plan
    from ..learn.models import make_model

    plans = []
    vote = spec.election is not None and spec.election.method == "vote"
    if vote:
        plans.append(election_plan(not ballots_given, spec.training is not None))
    if spec.training is not None:
        fm = make_model(spec.training.model)
        rounds, epochs = spec.training.rounds, spec.training.local_epochs
        plans.append(training_plan(fm, rounds, epochs, 0, vote))
        if spec.evaluation.all_columns:
            plans.append(training_plan(fm, rounds, epochs, 0, False))
    plan: dict[str, int] = {}
    scales: dict[str, float] = {}
    for p, sc in plans:
        for k, n in p.items():
            plan[k] = plan.get(k, 0) + int(n)
        scales.update(sc)
    return plan, scales


def use_run_accountant(federation: "Federation", spec: "JobSpec", out: "Outputs") -> None:
    """Before a step the run's accountant pays for (election, training, all columns): the first
    time, set the accountant's budget (:func:`accountant_dp`) as the run's DP option and plan
    every release of those steps in one :class:`~fedtab.privacy.accountant.PrivacyLedger`
    (:func:`fedtab.federation.protocol.plan_run_ledger`); later steps spend from it."""
    from ..federation.protocol import plan_run_ledger, set_step_dp

    if out.accountant:
        return
    out.accountant = True
    dp = accountant_dp(spec)
    set_step_dp(federation, dp)
    if dp is not None:
        plan_run_ledger(federation, [run_plan(spec, ballots_given=out.ballots is not None)])


def privacy_record(spec: "JobSpec", reports: Mapping[str, Mapping[str, Any] | None]) -> dict[str, Any]:
    """``result["privacy"]``: ``secure_aggregation`` and ``dp`` (``None``, or the budget ``epsilon`` /
    ``delta``, ``epsilon_spent`` by the whole run, and ``steps``: per accountant -- ``"imputation"``
    and ``"run"`` (the election and training steps, composed by one accountant; its ``steps``
    names them) -- its budget, what it spent, its noise multiplier and releases)."""
    dp = spec.privacy.dp
    out: dict[str, Any] = {"secure_aggregation": spec.privacy.secure_aggregation, "dp": None}
    if dp is None:
        return out
    budgets = {"imputation": dp_for(spec, "imputation") if "imputation" in releasing_steps(spec) else None,
               "run": accountant_dp(spec)}
    steps = {}
    for name, share in budgets.items():
        if share is None:
            continue
        report = reports.get(name) or {}
        steps[name] = {"epsilon": share["epsilon"], "delta": share["delta"], "epsilon_spent": report.get("total"),
                       "noise_multiplier": report.get("noise_multiplier"), "releases": report.get("releases", {})}
        if name == "run":
            steps[name]["steps"] = [s for s in releasing_steps(spec) if s != "imputation"]
            steps[name]["epsilon_per_step"] = report.get("steps", {})
    spent = [s["epsilon_spent"] for s in steps.values() if s["epsilon_spent"] is not None]
    out["dp"] = {"epsilon": dp["epsilon"], "delta": dp["delta"], "epsilon_spent": float(sum(spent)),
                 "bounds": dp.get("bounds"), "clip": dp.get("clip"), "steps": steps}
    return out


def trust_record(spec: "JobSpec") -> dict[str, Any]:
    """``result["trust"]``: ``robust``, ``min_sites``, ``max_site_share``, ``timeout``, ``min_holders``
    as the job set them (``None`` = the default: every site must answer, the engine's timeout,
    2 holders with two or more sites)."""
    return asdict(spec.trust)


def participation_record(federation: "Federation", spans: Sequence[tuple[str, int, Mapping[str, str]]]
                         ) -> dict[str, Any]:
    """``result["participation"]``: per step that exchanged with the sites (``spans``: ``(step, index
    of its first exchange in Federation.participation, sites dropped before it)``, in run order) the
    sites whose replies every exchange of the step used (``sites``) and the sites it dropped
    (``dropped``: site -> reason); ``dropped``: every site left out of the run; ``exchanges``: one
    ``{"step", "sites"}`` per exchange (:attr:`Federation.participation`)."""
    log = list(federation.participation)
    ends = [start for _, start, _ in spans[1:]] + [len(log)]
    afters = [before for _, _, before in spans[1:]] + [dict(federation.dropped)]
    steps = []
    for (name, start, before), end, after in zip(spans, ends, afters):
        exchanges = log[start:end]
        dropped = {s: r for s, r in after.items() if s not in before}
        if not exchanges and not dropped:
            continue
        sites = [s for s in exchanges[0]["sites"] if all(s in e["sites"] for e in exchanges)] if exchanges else []
        steps.append({"step": name, "sites": sites, "dropped": dropped})
    return {"steps": steps, "dropped": dict(federation.dropped), "exchanges": log}
