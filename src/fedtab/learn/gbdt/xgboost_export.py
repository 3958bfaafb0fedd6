"""Export to XGBoost: its JSON model format (written without xgboost) and an ``xgboost.Booster``.

:func:`xgboost_json` builds the document ``Booster.save_model("m.json")`` writes (format of
XGBoost ≥ 3.1, whose ``base_score`` is a vector: one intercept per class for softmax),
objective ``binary:logistic`` / ``multi:softprob`` / ``reg:squarederror``. Trees map
one-to-one: the same node ids, ``split_indices``/``split_conditions`` (go left iff
``x < condition``, float32), ``default_left``, leaf values in ``split_conditions``,
``base_weights`` (weights before shrinkage), ``loss_changes`` and ``sum_hessian``. The
``base_score`` is written in XGBoost's convention: the probability for ``binary:logistic``
(XGBoost takes its logit, so the margin may differ from fedtab's by float32 rounding,
~1e-7), the margins themselves otherwise.

**Cover is masked by default.** A node's ``sum_hessian`` (its cover: the hessian mass of the
federation's rows in it) lets the TimberStrike attack reconstruct training rows from an
exported model; like NVIDIA FLARE's federated XGBoost, the export writes ``1.0`` for every
node unless the caller passes ``keep_cover=True``. Predictions do not use it; XGBoost's
``cover``/``total_cover`` importance and SHAP values (``pred_contribs``) do, and are then
meaningless (gain importance is unchanged).

:func:`write_xgboost_json` writes the file (for ``fedtab export MODEL --format xgboost``);
:func:`to_xgboost` loads the document into a Booster (import of xgboost only there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .params import OBJECTIVES

if TYPE_CHECKING:  # pragma: no cover
    from .model import GBDTModel

__all__ = ["xgboost_json", "write_xgboost_json", "to_xgboost", "XGBOOST_FORMAT_VERSION"]

#: the XGBoost version whose JSON layout :func:`xgboost_json` writes (readable by ≥ 3.1).
XGBOOST_FORMAT_VERSION = [3, 1, 0]
_NO_PARENT = 2147483647


def _f32(a: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(a, dtype=np.float32)]


def _f32_text(v: float) -> str:
    return str(np.float32(v))  # shortest text that reads back as the same float32


def _tree_json(model: "GBDTModel", t: int, keep_cover: bool) -> dict[str, Any]:
    nodes = model.tree(t)
    n = nodes["left"].size
    leaf = nodes["left"] < 0
    parents = np.full(n, _NO_PARENT, dtype=np.int64)
    inner = np.flatnonzero(~leaf)
    parents[nodes["left"][inner]] = inner
    parents[nodes["right"][inner]] = inner
    return {
        "base_weights": _f32(nodes["base_weight"]),
        "categories": [], "categories_nodes": [], "categories_segments": [], "categories_sizes": [],
        "default_left": [int(v) for v in (nodes["default_left"] & ~leaf)],
        "id": t,
        "left_children": [int(v) for v in nodes["left"]],
        "loss_changes": _f32(np.where(leaf, 0, nodes["gain"])),
        "parents": [int(v) for v in parents],
        "right_children": [int(v) for v in nodes["right"]],
        "split_conditions": _f32(np.where(leaf, nodes["value"], nodes["threshold"])),
        "split_indices": [int(v) for v in np.where(leaf, 0, nodes["feature"])],
        "split_type": [0] * n,
        "sum_hessian": _f32(nodes["cover"] if keep_cover else np.ones(n, dtype=np.float32)),
        "tree_param": {"num_deleted": "0", "num_feature": str(model.n_features), "num_nodes": str(n),
                       "size_leaf_vector": "1"},
    }


def xgboost_json(model: "GBDTModel", *, keep_cover: bool = False) -> dict[str, Any]:
    """XGBoost's JSON model document of ``model`` (a dict; ``json.dumps`` it to write); every
    node's ``sum_hessian`` is 1.0 unless ``keep_cover`` (module docstring)."""
    p = model.params
    K = p.n_outputs
    if p.objective == "binary":
        base = [float(1.0 / (1.0 + np.exp(-np.float64(model.base_margin[0]))))]
        objective = {"name": OBJECTIVES["binary"], "reg_loss_param": {"scale_pos_weight": "1"}}
    elif p.objective == "regression":
        base = [float(model.base_margin[0])]
        objective = {"name": OBJECTIVES["regression"], "reg_loss_param": {"scale_pos_weight": "1"}}
    else:
        base = [float(v) for v in model.base_margin]
        objective = {"name": OBJECTIVES["multiclass"], "softmax_multiclass_param": {"num_class": str(K)}}
    attributes: dict[str, str] = {}
    if model.best_iteration is not None:
        attributes["best_iteration"] = str(model.best_iteration)
    return {
        "learner": {
            "attributes": attributes,
            "feature_names": list(model.feature_names),
            "feature_types": ["float"] * model.n_features,
            "gradient_booster": {
                "model": {
                    "gbtree_model_param": {"num_parallel_tree": "1", "num_trees": str(model.n_trees)},
                    "iteration_indptr": [int(i) for i in range(0, model.n_trees + 1, K)],
                    "tree_info": [int(c) for c in model.tree_class],
                    "trees": [_tree_json(model, t, keep_cover) for t in range(model.n_trees)],
                },
                "name": "gbtree",
            },
            "learner_model_param": {
                "base_score": "[" + ",".join(_f32_text(v) for v in base) + "]",
                "boost_from_average": "1",
                "num_class": str(K if p.objective == "multiclass" else 0),
                "num_feature": str(model.n_features),
                "num_target": "1",
            },
            "objective": objective,
        },
        "version": list(XGBOOST_FORMAT_VERSION),
    }


def write_xgboost_json(model: "GBDTModel", path: str | Path, *, keep_cover: bool = False) -> Path:
    """Write :func:`xgboost_json` to ``path`` (``xgboost.Booster(model_file=path)`` reads it;
    cover masked unless ``keep_cover``).

    Returns the path; raises ``OSError`` when it cannot be written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(xgboost_json(model, keep_cover=keep_cover)))
    return path


def to_xgboost(model: "GBDTModel", *, keep_cover: bool = False):
    """An ``xgboost.Booster`` of ``model``: ``predict(DMatrix(X))`` on the model's input columns
    equals :meth:`~.model.GBDTModel.predict_proba` (positive-class column for binary) /
    ``predict`` for regression, within float32 rounding (cover masked unless ``keep_cover``).

    Raises:
        ImportError: xgboost is not installed (``pip install 'fedtab[xgboost]'``).
    """
    try:
        import xgboost
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("to_xgboost needs xgboost: pip install 'fedtab[xgboost]'") from exc
    booster = xgboost.Booster()
    booster.load_model(bytearray(json.dumps(xgboost_json(model, keep_cover=keep_cover)).encode()))
    return booster
