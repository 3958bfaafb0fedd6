"""The training workflow: FedAvg (or a model's exact aggregation) on the elected columns.

* :mod:`.site` — the site's matrices and its handlers (``describe``, ``fit``, ``evaluate``);
* :mod:`.steps` — the server's steps: request, validation, reduction (plain / secure / DP / robust);
* :mod:`.server` — :func:`run_training`, the short loop over them.
"""

from ..._lazy import lazy_exports

#: public name -> the module that defines it, imported on first access (a site message imports
#: only ``.site``; the server loop and what it needs are not loaded for it)
_EXPORTS = {
    "TrainingOutcome": ".server",
    "run_training": ".server",
    "MATRIX_CACHE_CELLS": ".site",
    "MATRIX_KEY": ".site",
    "PARTS": ".site",
    "check_part": ".site",
    "class_indices": ".site",
    "describe_site": ".site",
    "evaluation_sums": ".site",
    "held_features": ".site",
    "label_key": ".site",
    "part_rows": ".site",
    "requested_bins": ".site",
    "site_matrix": ".site",
    "store_part_matrices": ".site",
    "Description": ".steps",
    "as_description": ".steps",
    "checked_sums": ".steps",
    "describe": ".steps",
    "describe_checker": ".steps",
    "exact_statistics_checker": ".steps",
    "pool_evaluations": ".steps",
    "pooled_standardisation": ".steps",
    "smoothed_sites": ".steps",
    "was_smoothed": ".steps",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["TrainingOutcome", "run_training", "Description", "describe", "describe_checker", "describe_site",
           "as_description", "site_matrix", "label_key", "part_rows", "check_part", "PARTS", "pooled_standardisation",
           "evaluation_sums", "checked_sums", "pool_evaluations", "was_smoothed", "smoothed_sites", "requested_bins", "class_indices",
           "held_features", "store_part_matrices", "exact_statistics_checker", "MATRIX_KEY", "MATRIX_CACHE_CELLS"]
