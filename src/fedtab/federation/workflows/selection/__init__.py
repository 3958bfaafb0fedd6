"""Honest model selection (issue 22): federated K-fold cross-validation by pooled log-loss,
the one-standard-error choice of columns and personalisation, the refit on all training
rows and per-site contributions — in ``rounds + 3`` exchanges.

* :func:`select_model` (:mod:`.server`) — the workflow; returns a :class:`SelectionOutcome`;
* :func:`site_contributions` (:mod:`.contributions`) — leave-one-site-out contributions;
* :func:`personalised_predict` — prediction with the stored personalised model
  (:mod:`fedtab.learn.personalise`);
* :mod:`.site` — the three site handlers; :mod:`.plan` — candidates and chains; :mod:`.steps` — the
  server steps (each validates before it reduces).
"""

from fedtab.learn.personalise import personalised_predict
from fedtab.federation.workflows.selection.contributions import site_contributions
from fedtab.federation.workflows.selection.server import DEFAULT_FD_GRID, DEFAULT_MODES, SelectionOutcome, select_model

__all__ = ["select_model", "SelectionOutcome", "site_contributions", "personalised_predict", "DEFAULT_FD_GRID",
           "DEFAULT_MODES"]
