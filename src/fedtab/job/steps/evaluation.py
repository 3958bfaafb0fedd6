"""Step 7, the comparisons (``[evaluation]``): what the federated model is measured against.

* ``baselines`` (one exchange; none when they rode on the first Newton iteration of a converged
  logistic run in a plain run, :func:`fedtab.federation.steps.baselines.ride_baselines`): the majority class and each site's local-only model of the
  same kind, scored on the same test rows (:func:`fedtab.federation.steps.baselines.run_baselines`);
  by default on, except in a private run (they release each site's own scores).
* ``all_columns``: the model trained on every column too (a second training run, with its own
  DP share), to compare with the selected columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..outputs import Outputs
from .step import Step
from .training import wants_baselines

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..spec import JobSpec

__all__ = ["ALL_COLUMNS", "BASELINES", "wants_baselines"]


def _baselines(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    from fedtab.federation.steps.baselines import run_baselines

    out.result["baselines"] = run_baselines(federation, out.outcomes["training"], ridden=out.ridden_baselines)


def _all_columns(federation: "Federation", spec: "JobSpec", out: Outputs) -> None:
    from .training import summary, train

    elected = out.result["election"]
    columns = list(elected["feature_names"]) if elected else out.features  # every column the selection saw
    tr = train(federation, spec, out, columns)
    out.outcomes["all_columns"] = tr
    out.privacy["run"] = tr.privacy
    out.result["all_columns"] = summary(tr)


BASELINES = Step("baselines", wants_baselines, _baselines)
ALL_COLUMNS = Step("all_columns", lambda spec, out: spec.training is not None and spec.evaluation.all_columns,
                   _all_columns)
