"""Honest model selection (issue 22): federated K-fold cross-validation by pooled log-loss,
the one-standard-error choice of columns and personalisation, the refit on all training
rows and per-site contributions — in ``rounds + 3`` exchanges.

* :func:`select_model` (:mod:`.server`) — the workflow (its settings by keyword or as one
  :class:`SelectionOptions`); returns a :class:`SelectionOutcome`;
* :func:`site_contributions` (:mod:`.contributions`) — leave-one-site-out contributions;
* :func:`personalised_predict` — prediction with the stored personalised model
  (:mod:`fedtab.learn.personalise`);
* :mod:`.site` — the three site handlers; :mod:`.plan` — candidates and chains; :mod:`.steps` — the
  server steps (each validates before it reduces).
"""

from fedtab._lazy import lazy_exports

#: public name -> the module that defines it, imported on first access (a site message imports
#: only ``.site``; the server loop and what it needs are not loaded for it)
_EXPORTS = {
    "personalised_predict": "fedtab.learn.personalise",
    "site_contributions": ".contributions",
    "DEFAULT_FD_GRID": ".server",
    "DEFAULT_MODES": ".server",
    "SelectionOutcome": ".server",
    "SelectionOptions": ".server",
    "select_model": ".server",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["select_model", "SelectionOptions", "SelectionOutcome", "site_contributions", "personalised_predict", "DEFAULT_FD_GRID",
           "DEFAULT_MODES"]
