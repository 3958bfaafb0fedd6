"""The training workflow: FedAvg (or a model's exact aggregation) on the elected columns.

* :mod:`.site` — the site's ``fit`` / ``setup`` handlers;
* :mod:`.steps` — the server's fit steps: request, validation, reduction through the run's summing strategy;
* :mod:`.server` — :func:`run_training`, the short loop over them (and the shared steps
  :mod:`fedtab.federation.steps.describe` / :mod:`fedtab.federation.steps.evaluate`).
"""

from fedtab.federation.workflows.training.server import run_training
from fedtab.federation.workflows.training.outcome import TrainingOutcome

__all__ = ["TrainingOutcome", "run_training"]
