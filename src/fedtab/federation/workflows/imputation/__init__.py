"""The imputation workflow (FedHF-Impute): a GNN over the feature columns, trained by FedAvg,
that fills missing cells and the columns a site never measures.

* :mod:`.config` — :class:`ImputeConfig` (the settings the sites receive) and :class:`ImputationResult`;
* :mod:`.site` — the site's handlers (``impute_schema``, ``impute_stats``, ``impute_setup``,
  ``impute_fit``, ``impute_eval``, ``impute_apply``) and the ``impute_fill`` table step;
* :mod:`.steps` — the server's steps: request, validation, reduction (per site / robust, or
  summed: secure sums and/or DP), and :func:`apply_imputation`;
* :mod:`.server` — :func:`run_imputation`, the short loop over them.

No reply ever carries rows: only counts, sums, weights and error sums.
"""

from fedtab._lazy import lazy_exports

#: public name -> the module that defines it, imported on first access (a site message imports
#: only ``.site``; the server loop and what it needs are not loaded for it)
_EXPORTS = {
    "ImputationResult": ".config",
    "ImputeConfig": ".config",
    "dp_plan": ".server",
    "run_imputation": ".server",
    "DP_STEPS_PER_ROUND": ".site",
    "MAX_DP_STEPS": ".site",
    "site_rng": ".site",
    "validate_site_table": ".site",
    "validation_mask": ".site",
    "apply_imputation": ".steps",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["ImputeConfig", "ImputationResult", "apply_imputation", "run_imputation", "validate_site_table", "site_rng",
           "validation_mask", "dp_plan", "DP_STEPS_PER_ROUND", "MAX_DP_STEPS"]
