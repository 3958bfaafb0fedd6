"""Step 3, the imputation (``[impute]``): FedHF-Impute over the feature columns, never the label.

When later steps follow, every site then fills its own table (the ``impute_apply`` request rides
on the next step's first exchange, :mod:`fedtab.federation.protocol.piggyback`) (missing cells and unavailable
columns) so that the election and the model work on the imputed data: values clipped to the
pooled coarse range of the schema step and integer columns rounded — an integer-coded column
(at most 20 values, ``schema.levels``) to the nearest value of its agreed set, and a categorical
column's indicators to one category (:func:`finishing`) — or, without a profile (a private run),
clipped to ``[privacy] dp.bounds`` when given and not rounded. Robust mode,
secure aggregation and the step's DP share come from ``[trust]`` and ``[privacy]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..guarantees import dp_for
from .impute_settings import impute_config
from .step import Step

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..outputs import Outputs
    from ..spec import JobSpec

__all__ = ["STEP", "finishing", "impute_config"]


def _public_bounds(dp: dict[str, Any] | None, columns: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` per column from ``dp["bounds"]`` (the float range where none is given)."""
    bounds = (dp or {}).get("bounds")
    big = float(np.finfo(np.float64).max)
    low, high = np.full(len(columns), -big), np.full(len(columns), big)
    for i, c in enumerate(columns):
        b = bounds.get(c) if isinstance(bounds, dict) else bounds
        if isinstance(b, (list, tuple)) and len(b) == 2:
            low[i], high[i] = float(b[0]), float(b[1])
    return low, high


def _clip_ranges(spec: "JobSpec", out: "Outputs", columns: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(low, high, integer)`` per imputed column (see the module docstring)."""
    if not out.ranges:
        low, high = _public_bounds(spec.privacy.dp, columns)
        return low, high, np.zeros(len(columns), dtype=bool)
    big = float(np.finfo(np.float64).max)
    low = np.array([out.ranges[c][0] if c in out.ranges else -big for c in columns])
    high = np.array([out.ranges[c][1] if c in out.ranges else big for c in columns])
    return low, high, np.array([c in out.integer for c in columns])


def finishing(schema: dict[str, Any] | None, columns: list[str]) -> tuple[dict[int, list[float]], list[list[int]]]:
    """``(levels, groups)`` over ``columns`` (by index): the agreed value set of each
    integer-coded column (``schema["levels"]``) and the indicator columns of each categorical
    column (``schema["categories"]``); empty without a profile."""
    from ...data.categories import onehot_name

    if not schema:
        return {}, []
    pos = {c: j for j, c in enumerate(columns)}
    levels = {pos[c]: list(v) for c, v in (schema.get("levels") or {}).items() if c in pos}
    groups = [[pos[onehot_name(c, v)] for v in cats if onehot_name(c, v) in pos]
              for c, cats in (schema.get("categories") or {}).items()]
    return levels, [g for g in groups if len(g) > 1]


def _arrays(params: dict[str, Any]) -> dict[str, list]:
    return {k: np.asarray(v).tolist() for k, v in params.items()}


def _run(federation: "Federation", spec: "JobSpec", out: "Outputs") -> None:
    from fedtab.federation.workflows.imputation import apply_imputation, run_imputation
    from ...federation.protocol import set_step_dp
    from .schema import from_declaration

    set_step_dp(federation, dp_for(spec, "imputation"))  # robust, max_site_share, secure sums: the run's options
    # the profile's coarse ranges are public: about their midpoints the statistics need no pooled mean
    # first, so in a plain run the column moments ride on the statistics' exchange (one, not two)
    centre = {c: 0.5 * (float(lo) + float(hi)) for c, (lo, hi) in out.ranges.items()} if out.ranges else None
    im = run_imputation(federation, impute_config(spec), progress=out.hooks.get("imputation"), centre=centre)
    out.outcomes["imputation"] = im
    out.privacy["imputation"] = im.privacy
    from_declaration(federation, spec, out)  # before the filled tables change the declared schema
    low, high, is_int = _clip_ranges(spec, out, list(im.columns))
    summary: dict[str, Any] = {
        "columns": list(im.columns), "validation": im.validation, "rounds": len(im.history),
        "training_curve": im.history, "best_round": im.best_round, "imputed_cells": None, "clipped_cells": None,
        "linear_prior_rank": None if im.prior_W is None else int(im.prior_W.shape[1]),
        "left_out": dict(im.left_out), "privacy": im.privacy,
    }
    levels, groups = finishing(out.result["schema"], list(im.columns))
    summary["levels"] = {im.columns[j]: v for j, v in levels.items()}
    if spec.election is not None or spec.training is not None:  # the later steps work on the filled tables
        def counted(counts: dict[str, dict[str, int]]) -> None:
            summary["imputed_cells"] = {s: c["imputed"] for s, c in counts.items()}
            summary["clipped_cells"] = {s: c["clipped"] for s, c in counts.items()}

        # rides on the next step's first exchange (answered before it: that step sees the filled tables)
        apply_imputation(federation, im, low, high, is_int, levels, groups, ride=True, then=counted)
    out.result["imputation"] = summary
    out.imputer = {
        "columns": list(im.columns), "mean": im.mean.tolist(), "std": im.std.tolist(),
        "edge_index": im.graph.edge_index.tolist(), "weight": im.graph.weight.tolist(),
        "sign": im.graph.sign.tolist(), "model_config": dict(im.model_config),
        "weights": _arrays(im.weights), "weight_dtypes": {k: str(np.asarray(w).dtype) for k, w in im.weights.items()},
        "prior_W": None if im.prior_W is None else im.prior_W.tolist(),
        "prior_psi": None if im.prior_psi is None else im.prior_psi.tolist(),
        "low": low.tolist(), "high": high.tolist(), "integer": is_int.tolist(),
        "levels": {str(j): v for j, v in levels.items()}, "groups": groups,
    }


STEP = Step("imputation", lambda spec, out: spec.impute is not None, _run)
