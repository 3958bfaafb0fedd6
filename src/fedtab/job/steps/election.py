"""Step 5, the election (``[election] method = "vote"``): Feature Election with abstention.

Each site votes with its own selector (``[election] selector`` or its ``[sites.x] selector``,
set where the site is built); the server elects at the given or tuned freedom degree and
sends the mask. With training next, the ``set_mask`` exchange also gathers the training's
description of the elected columns, so training needs no describe exchange of its own, and a
logistic model's Newton iteration at zero over every candidate column rides on the ballot and the
iteration at the θ1 it gives rides on ``set_mask`` (plain runs:
:func:`fedtab.job.steps.training.ride_ballot_iteration`, :func:`~fedtab.job.steps.training.ride_first_iteration`).
Robust mode and ``min_holders`` come from ``[trust]``, secure aggregation of the
description and the step's DP share from ``[privacy]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..guarantees import use_run_accountant
from ..outputs import Outputs
from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..spec import JobSpec

__all__ = ["STEP"]


def _jsonable(value: Any) -> Any:
    import numpy as np

    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _run(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    from fedtab.election.rule import RuleSettings
    from fedtab.federation.workflows.election.server import ElectionHooks, run_election
    from ...federation.protocol import FederationError

    e = spec.election
    assert e is not None
    fd = out.freedom_degree if out.freedom_degree is not None else (
        0.5 if e.freedom_degree is None else float(e.freedom_degree))
    use_run_accountant(federation, spec, out)  # min_holders, robust, secure sums: the run's options
    rule = RuleSettings(aggregation=e.aggregation, normalization=e.normalization, compat=e.compat,
                        consensus=e.consensus, consensus_alpha=e.consensus_alpha)
    from .training import ride_ballot_iteration, ride_first_iteration

    outcome = run_election(federation, fd, ballots=out.ballots, describe="train" if spec.training is not None else None,
                           rule=rule, hooks=ElectionHooks(before_ballot=ride_ballot_iteration(federation, spec, out),
                                                          before_mask=ride_first_iteration(federation, spec, out)))
    res = outcome.result
    if spec.training is not None and not res.selected_names:
        raise FederationError(f"the election at freedom degree {fd:g} kept no column; lower the selectors' "
                              "strictness or raise freedom_degree")
    chosen = {b.site: {n for n, m in zip(b.feature_names or (), b.mask) if m} for b in outcome.ballots}
    out.outcomes["election"] = outcome
    out.privacy["run"] = outcome.privacy
    out.freedom_degree = fd
    out.result["election"] = {
        "method": "vote", **_jsonable(res.to_dict()), "freedom_degree": fd, "compat": e.compat,
        "kept": len(res.selected_names), "feature_names": list(res.feature_names),
        "mask": [bool(m) for m in res.mask], "min_holders": res.min_holders,
        "features": [{**f, "chosen_by": [s for s, c in chosen.items() if f["feature"] in c]}
                     for f in _jsonable(res.explain_records())],
        "sites": outcome.site_summary(), "abstained": dict(outcome.abstained), "privacy": outcome.privacy,
    }
    out.features, out.described = list(res.selected_names), outcome.described


STEP = Step("election", lambda spec, out: spec.election is not None and spec.election.method == "vote", _run)
