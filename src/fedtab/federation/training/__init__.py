"""The training workflow: FedAvg (or a model's exact aggregation) on the elected columns.

* :mod:`.site` — the site's matrices and its handlers (``describe``, ``fit``, ``evaluate``);
* :mod:`.steps` — the server's steps: request, validation, reduction (plain / secure / DP / robust);
* :mod:`.server` — :func:`run_training`, the short loop over them.
"""

from .server import TrainingOutcome, run_training
from .site import (MATRIX_CACHE_CELLS, MATRIX_KEY, PARTS, check_part, class_indices, describe_site, evaluation_sums,
                   held_features, label_key, part_rows, requested_bins, site_matrix, store_part_matrices)
from .steps import (Description, as_description, checked_sums, describe, describe_checker, exact_statistics_checker,
                    pool_evaluations, pooled_standardisation, smoothed_sites, was_smoothed)

__all__ = ["TrainingOutcome", "run_training", "Description", "describe", "describe_checker", "describe_site",
           "as_description", "site_matrix", "label_key", "part_rows", "check_part", "PARTS", "pooled_standardisation",
           "evaluation_sums", "checked_sums", "pool_evaluations", "was_smoothed", "smoothed_sites", "requested_bins", "class_indices",
           "held_features", "store_part_matrices", "exact_statistics_checker", "MATRIX_KEY", "MATRIX_CACHE_CELLS"]
