"""The training workflow: FedAvg, Newton–Raphson (logistic) or a model's exact aggregation on the elected columns.

* :mod:`.site` — the site's ``fit`` / ``setup`` / ``newton`` handlers;
* :mod:`.steps` — the server's fit and Newton steps: request, validation, reduction through the
  run's summing strategy;
* :mod:`.server` — :func:`run_training`, the short loop over them (and the shared steps
  :mod:`fedtab.federation.steps.describe` / :mod:`fedtab.federation.steps.evaluate`);
* :mod:`.trainers` — models that a workflow of their own trains (boosted trees);
* :mod:`.outcome` — :class:`TrainingOutcome`.
"""

from fedtab._lazy import lazy_exports

#: public name -> the module that defines it, imported on first access (a site message imports
#: only ``.site``; the server loop and what it needs are not loaded for it)
_EXPORTS = {"TrainingOutcome": ".outcome", "run_training": ".server"}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["TrainingOutcome", "run_training"]
