"""Histogram gradient-boosted trees whose server side only sees sums (numpy; XGBoost export).

Pieces, in the order a federated run uses them:

- :mod:`.sketch` / :mod:`.grid` / :mod:`.bins` — bin edges from no site's values: a quantile
  sketch of pooled counts over public grids (or the public bounds' grid), ≤ ``max_bins``
  float32 edges per column; binning (NaN → a missing bin).
- :mod:`.objectives` — intercept from pooled label sums, float32 gradients/hessians
  (logistic, softmax, squared error), validation loss sums.
- :mod:`.site` — level histograms, subsampling, routing rows (:class:`SiteBooster`).
- :mod:`.release` — what a site releases of its level histograms (small nodes withheld, small
  bins merged, a fixed grid so plain and secure sums agree; DP noise).
- :mod:`.split` / :mod:`.grow` — XGBoost's gain and split rules on pooled histograms; the
  level-by-level state machine (:class:`RoundGrower`) and the rounds with early stopping
  (:class:`Booster`).
- :mod:`.model` — the ensemble as flat arrays: predict, importance, model-file arrays.
- :mod:`.importance` — feature importance by gain: pooled (the trees' gains) and on one site's
  rows (replayed from the site's record of the splits it applied; small nodes suppressed).
- :mod:`.xgboost_export` — XGBoost's JSON model format and ``xgboost.Booster``.
- :mod:`.pooled` — the in-process drivers (:func:`fit_gbdt_sites`, :func:`fit_gbdt_pooled`).
"""

from .bins import BinLayout
from .grow import Booster, RoundGrower, check_site_histogram
from .model import GBDTModel
from .objectives import base_margin, gradients, label_sums, loss_sums, metric_from_sums
from .params import GBDTParams
from .pooled import fit_gbdt_pooled, fit_gbdt_sites
from .site import SiteBooster, apply_splits, level_histograms
from .split import find_splits, leaf_values
from .xgboost_export import to_xgboost, write_xgboost_json, xgboost_json

__all__ = [
    "BinLayout", "Booster", "GBDTModel", "GBDTParams", "RoundGrower", "SiteBooster",
    "apply_splits", "base_margin", "check_site_histogram", "find_splits", "fit_gbdt_pooled", "fit_gbdt_sites", "gradients",
    "label_sums", "leaf_values", "level_histograms", "loss_sums", "metric_from_sums",
    "to_xgboost", "write_xgboost_json", "xgboost_json",
]
