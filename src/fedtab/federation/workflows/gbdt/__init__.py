"""Federated histogram gradient boosting (XGBoost's trees) on the protocol path.

* :mod:`.site` — the site's handlers (``gbdt_summary``, ``gbdt_sketch``, ``gbdt_start``, ``gbdt_level``,
  ``gbdt_evaluate``, ``gbdt_score``, ``gbdt_importance``), each with its release declaration;
* :mod:`.steps` — the server's validators and reductions (robust capping, public DP edges);
* :mod:`.server` — :func:`run_gbdt`, the loop: bins once, one exchange per depth level, the
  sites' gains (:func:`importance_step`).

The algorithm itself (bins, gradients, splits, trees, export) is :mod:`fedtab.learn.gbdt`.
"""

from fedtab._lazy import lazy_exports

#: public name -> the module that defines it, imported on first access (a site message imports
#: only ``.site``; the server loop and what it needs are not loaded for it)
_EXPORTS = {
    "GBDTOutcome": ".server",
    "dp_plan": ".server",
    "run_gbdt": ".server",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["GBDTOutcome", "run_gbdt", "dp_plan"]
