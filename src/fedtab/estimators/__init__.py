"""The scikit-learn front doors: :class:`FederatedFeatureElection` (a selector) and
:class:`FederatedImputer` (a transformer).

Both take one table per site with the same contract (:mod:`fedtab.estimators.tables`) and
``fit`` builds a :class:`~fedtab.job.spec.JobSpec` from the estimator's parameters and runs
the job's step loop (:func:`fedtab.job.workflow.run_workflow`) over an in-process
:class:`~fedtab.engines.local.LocalFederation`: the same workflows, wire format and
validation as a deployment on Flower or FLARE. Importing this package imports scikit-learn
(torch only when the imputer fits or transforms).
"""

from .election import FederatedFeatureElection
from .imputer import FederatedImputer, ImputerNotFittedError
from .tables import site_tables

__all__ = ["FederatedFeatureElection", "FederatedImputer", "ImputerNotFittedError", "site_tables"]
