"""Step 4, the tuning (``[election] tune``): the freedom degree chosen on validation rows.

Elections on each site's fit part of its training rows, each candidate mask scored by the
job's model trained on the fit parts and evaluated on the validation parts
(:func:`fedtab.federation.workflows.tuning.server.tune_flow`); the election step then elects on all
training rows at the chosen freedom degree. It has no robust, secure or DP mode: a private
job cannot tune (:func:`fedtab.job.spec.check_spec`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..outputs import Outputs
from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..spec import JobSpec

__all__ = ["STEP"]


def _needed(spec: "JobSpec", out: Outputs) -> bool:
    return spec.election is not None and spec.election.method == "vote" and spec.election.tune != "none"


def _run(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    from fedtab.federation.workflows.tuning.server import tune_flow
    from ..spec import TrainingSpec

    e, tr = spec.election, spec.training or TrainingSpec()
    assert e is not None
    extra = {"grid": tuple(e.grid)} if e.grid is not None else {}
    if e.tune == "grid":
        extra["refine_step"] = e.refine_step
    tuned = tune_flow(federation, model=tr.model, tune_method=e.tune, rounds=tr.rounds, local_epochs=tr.local_epochs,
                      tolerance=e.tolerance, aggregation=e.aggregation, normalization=e.normalization,
                      compat=e.compat, seed=spec.run.seed, apply=False, **extra)
    out.outcomes["tuning"] = tuned
    out.freedom_degree = float(tuned.tuning.freedom_degree)
    out.result["tuning"] = {**tuned.tuning.to_dict(), "selected": list(tuned.features)}


STEP = Step("tuning", _needed, _run)
