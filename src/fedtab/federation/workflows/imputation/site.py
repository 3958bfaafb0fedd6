"""The imputation's site side: the handlers that answer the server's imputation steps.

Handlers (each registered with what its reply releases, :mod:`fedtab.privacy.gate`):

* ``"impute_schema"`` — the site's feature columns and row counts, and per column the observed
  count, sum and sum of squares over its training rows (over the global schema, to be summed,
  when the request names it: secure sums / DP);
* ``"impute_stats"`` — the sufficient statistics about the server's shift
  (:func:`fedtab.impute.stats.site_stats`), suppressed below ``min_rows`` or noised under DP;
* ``"impute_setup"`` — stores the graph, the global mean/std, the prior and the model config,
  and builds the model; replies its row counts;
* ``"impute_fit"`` — scores the received weights on its validation cells, trains locally
  (DP gradient descent under DP) and returns its weights;
* ``"impute_eval"`` — validation errors of the received weights, and those of mean fill;
* ``"impute_apply"`` — fills its own table (table step ``"impute_fill"``) and replies how
  many cells it imputed and clipped (clipped cells counted only in columns with 0 or
  ``>= min_rows`` imputed cells: the bounds are the server's).

Co-observation statistics are released under :func:`fedtab.impute.stats.release_plan` (no
combination of the sums of a column isolates fewer than ``min_rows`` of its rows), in plain and
secure runs alike: a site never relies on the server's word about the pooled complement.

The label (``Site.target``) is never imputed and never an input of the imputer. Nothing
here knows which engine, strategy or mode the server runs: under DP the kinds' mod
(:func:`fedtab.federation.site.mods.dp_noise_param`, applied by ``Site.handle``) sets the ``noise``
parameter the moments, statistics and DP gradient steps are released under.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fedtab.impute.graph import FeatureGraph
from fedtab.impute.stats import STAT_ARRAYS, SiteStats, released_stats, site_stats
from fedtab.privacy.dp import (add_noise, clip_rows, clip_values, column_bounds, noise_rng, release_moments,
                           row_radius, stats_sensitivity)
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.site.mods import site_params
from fedtab.federation.site.registry import handler, table_step
from fedtab.federation.workflows.imputation.config import ImputeConfig

__all__ = ["site_rng", "validate_site_table", "validation_mask", "MAX_DP_STEPS", "DP_STEPS_PER_ROUND"]


def site_rng(seed: int, name: str, salt: str) -> np.random.Generator:
    """A generator that differs per site and purpose but is reproducible."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode()), zlib.crc32(salt.encode())])


def validate_site_table(table: pd.DataFrame, name: str) -> None:
    """Raise ``ValueError`` naming the site if its table cannot be imputed.

    Rules: at least one row and one column, unique column names, every column
    numeric (bool counts as numeric), no infinite values, no column without a
    single observed value.
    """
    if not isinstance(table, pd.DataFrame):
        raise ValueError(f"site {name!r}: expected a pandas DataFrame, got {type(table).__name__}")
    if table.shape[0] == 0 or table.shape[1] == 0:
        raise ValueError(f"site {name!r}: the table is empty ({table.shape[0]} rows, {table.shape[1]} columns)")
    cols = [str(c) for c in table.columns]
    if len(set(cols)) != len(cols):
        raise ValueError(f"site {name!r}: duplicate column names")
    bad = [c for c in table.columns if not (pd.api.types.is_numeric_dtype(table[c]) or pd.api.types.is_bool_dtype(table[c]))]
    if bad:
        raise ValueError(f"site {name!r}: non-numeric columns {[str(c) for c in bad[:8]]} (encode them as numbers first)")
    values = table.to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isinf(values).any():
        raise ValueError(f"site {name!r}: the table contains infinite values")
    empty = [str(c) for c, n in zip(table.columns, (~np.isnan(values)).sum(0)) if n == 0]
    if empty:
        raise ValueError(f"site {name!r}: columns with no observed value {empty[:8]}")


def _features(site: Site, part: str = "all") -> pd.DataFrame:
    """The site's feature columns (never the label) of one row part."""
    return site.rows(part)[site.feature_names]


def _values(site: Site, part: str) -> np.ndarray:
    return _features(site, part).to_numpy(dtype=np.float64, na_value=np.nan)


@handler("impute_schema")
def _schema(site: Site, request: Message) -> Message:
    validate_site_table(_features(site), site.name)
    train = _values(site, "train")
    if len(train) == 0:
        raise ValueError(f"site {site.name!r}: no training rows")
    obs = ~np.isnan(train)
    empty = [c for c, n in zip(site.feature_names, obs.sum(0)) if n == 0]
    if empty:
        raise ValueError(f"site {site.name!r}: columns with no observed training value {empty[:8]}")
    noise = site_params(request).get("noise")  # the Gaussian release the moments are made under (its DP mod)
    lo = hi = None  # public bounds, under noise
    if noise is not None:
        lo, hi = column_bounds(noise, site.feature_names)
        train = clip_values(train, lo, hi)
    values = np.where(obs, train, 0.0)
    count, total, sumsq = release_moments(obs.sum(0).astype(np.float64), values.sum(0), (values * values).sum(0),
                                          min_rows=site.policy.min_rows, dp=noise, lo=lo, hi=hi)
    meta = {"columns": site.feature_names, "n_train": len(train), "n_valid": len(site.rows("test"))}
    if request.meta.get("columns_only"):  # secure aggregation: the sums follow in a secure exchange
        return Message("impute_schema", {}, meta)
    glob = request.meta.get("global")
    if glob is None:
        # the sum of squares lets the server check the sums (Cauchy-Schwarz) before it centres on them;
        # it discloses nothing the statistics step does not (their sumsq about the shift gives it)
        return Message("impute_schema", {"count": count, "sum": total, "sumsq": sumsq}, meta)
    # secure aggregation: the moments over the global schema (zeros for columns not held), to be summed
    idx = _global_index(site, glob)
    arrays = {k: _embed(v, idx, len(glob)) for k, v in (("count", count), ("sum", total), ("sumsq", sumsq))}
    return Message("impute_schema", arrays, meta)


def _global_index(site: Site, glob: Any) -> list[int]:
    if not isinstance(glob, list):
        raise ValueError("the global schema must be a list of column names")
    pos = {str(c): i for i, c in enumerate(glob)}
    missing = [c for c in site.feature_names if c not in pos]
    if missing:
        raise ValueError(f"the global schema lacks this site's columns {missing[:5]}")
    return [pos[c] for c in site.feature_names]


def _embed(values: np.ndarray, idx: list[int], f: int) -> np.ndarray:
    """A per-site (F_s,) or (F_s, F_s) array placed into the global (F,) or (F, F) one."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        out = np.zeros(f)
        out[idx] = values
    else:
        out = np.zeros((f, f))
        out[np.ix_(idx, idx)] = values
    return out


@handler("impute_stats")
def _stats(site: Site, request: Message) -> Message:
    glob = list(request.meta["columns"])
    pos = {c: i for i, c in enumerate(glob)}
    cols = site.feature_names
    idx = [pos[c] for c in cols]
    shift = np.asarray(request.arrays["shift"], dtype=np.float64)[idx]
    values = _values(site, "train")
    noise = site_params(request).get("noise")  # the Gaussian release the statistics are made under (its DP mod)
    if noise is None:  # no difference of the released sums isolates fewer than min_rows rows (release_plan)
        values, shift = _scaled(values, shift, request, idx)
        s = released_stats(values, cols, site.policy.min_rows, shift)
    else:
        s = _noisy_stats(values, cols, shift, request, idx, noise)
    if request.meta.get("global"):
        return Message("impute_stats", {k: _embed(getattr(s, k), idx, len(glob)) for k in STAT_ARRAYS}, {})
    return Message("impute_stats", {k: getattr(s, k) for k in STAT_ARRAYS + ("shift",)}, {"columns": cols})


def _scaled(values: np.ndarray, shift: np.ndarray, request: Message, idx: list[int]
            ) -> tuple[np.ndarray, np.ndarray]:
    """``(values, shift)``: about the server's shift, or with a ``scale`` array the z-values about
    0 (well-conditioned fixed-point sums, bounded DP rows)."""
    if "scale" in request.arrays:
        return (values - shift) / np.asarray(request.arrays["scale"], dtype=np.float64)[idx], np.zeros(len(idx))
    return values, shift


def _noisy_stats(values: np.ndarray, cols: list[str], shift: np.ndarray, request: Message, idx: list[int],
                 dp: Mapping[str, Any]) -> SiteStats:
    """The DP statistics: values clipped into the public bounds, in units of the pooled scale,
    rows clipped to the sensitivity's radius, every array noised (the noise protects small cells:
    data-dependent suppression would void it).

    Raises:
        ValueError: no ``scale`` array in the request.
    """
    values = clip_values(values, *column_bounds(dp, cols))
    if "scale" not in request.arrays:
        raise ValueError("DP statistics need the pooled scale (the 'scale' array)")
    values, shift = _scaled(values, shift, request, idx)
    values = clip_rows(values, row_radius(len(cols)))
    s = site_stats(values, cols, shift)
    sens, rng = stats_sensitivity(row_radius(len(cols)), len(cols)), noise_rng()
    noisy = {k: add_noise(getattr(s, k), sens[k], dp, rng, symmetric=k in ("pair_count", "pair_sxy"))
             for k in STAT_ARRAYS}
    return SiteStats(columns=s.columns, shift=s.shift, **noisy)


def _global_values(site: Site, part: str, columns: list[str], mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(n, F) z-scored values over the global schema; NaN = missing or unavailable."""
    rows = _features(site, part)
    out = np.full((len(rows), len(columns)), np.nan)
    pos = {c: i for i, c in enumerate(columns)}
    idx = [pos[str(c)] for c in rows.columns]
    out[:, idx] = rows.to_numpy(dtype=np.float64, na_value=np.nan)
    return (out - mean) / std


@handler("impute_setup")
def _setup(site: Site, request: Message) -> Message:
    meta, arr = request.meta, request.arrays
    cfg = ImputeConfig(**meta["config"])
    columns = list(meta["columns"])
    graph = FeatureGraph(columns, np.asarray(arr["edge_index"], np.int64), np.asarray(arr["weight"], np.float64),
                         np.asarray(arr["sign"], np.float64))
    graph.validate()
    model_config = dict(meta["model"])
    with_prior = int(model_config.get("prior_rank", 0)) > 0
    if with_prior and ("prior_W" not in arr or "prior_psi" not in arr):
        raise ValueError("the setup message lacks the prior (prior_W, prior_psi)")
    # Only arrays, JSON values, fedtab dataclasses and the generator: an engine can store
    # this next to the site and restore it in a new process (a Flower ClientApp per
    # message). The torch objects are rebuilt from it by _live().
    site.state["impute"] = {
        "config": cfg, "columns": columns, "graph": graph, "model_config": model_config,
        "mean": np.asarray(arr["mean"], np.float64), "std": np.asarray(arr["std"], np.float64),
        "prior_W": np.asarray(arr["prior_W"], np.float64) if with_prior else None,
        "prior_psi": np.asarray(arr["prior_psi"], np.float64) if with_prior else None,
        "rng": site_rng(site.seed, site.name, "train"),  # the site's own seed, never the server's
        "optimizer_state": {},
    }
    site.state.pop(_LIVE, None)
    live = _live(site)
    return Message("impute_setup", meta={"n_train": int(len(live["train"])), "n_valid": int(len(live["valid"]))})


_LIVE = "impute_live"  # process-local: model, optimiser, adjacency, z-scored tables


def _state(site: Site) -> dict:
    st = site.state.get("impute")
    if st is None:
        raise RuntimeError(f"site {site.name!r} received an imputation step before impute_setup")
    return st


def _live(site: Site) -> dict:
    """The site's torch model, optimiser, graph tensors and z-scored tables, built from
    ``site.state["impute"]`` the first time this process needs them (after setup, or
    after the engine restored the state in a new process). Adam's moments come back
    from the stored ``optimizer_state``, so training continues exactly."""
    live = site.state.get(_LIVE)
    if live is not None:
        return live
    import torch

    from fedtab.impute.model import GNNConfig, GNNImputer, graph_tensors
    from fedtab.impute.optim_state import numpy_to_optimizer
    from fedtab.impute.train import set_threads

    st = _state(site)
    cfg: ImputeConfig = st["config"]
    set_threads(cfg.n_threads)
    columns, mean, std = st["columns"], st["mean"], st["std"]
    valid = _global_values(site, "test", columns, mean, std)
    vmask = validation_mask(valid, cfg.validation_mask_fraction, site.policy.min_rows,
                            site_rng(site.seed, site.name, "valid"))
    model = GNNImputer(GNNConfig(**st["model_config"]))
    if model.config.prior_rank > 0:
        model.set_prior(st["prior_W"], st["prior_psi"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if st["optimizer_state"]:
        numpy_to_optimizer(optimizer, st["optimizer_state"])
    live = {
        "available": np.isin(columns, site.feature_names),
        "train": _global_values(site, "train", columns, mean, std), "valid": valid, "valid_mask": vmask,
        "model": model, "adj": graph_tensors(st["graph"]), "optimizer": optimizer,
    }
    site.state[_LIVE] = live
    return live


def validation_mask(values: np.ndarray, fraction: float, min_rows: int, rng: np.random.Generator) -> np.ndarray:
    """``(n, F)`` bool: the validation cells a site hides, drawn from its own generator.

    Per column, ``round(fraction · observed)`` observed cells, raised to ``min_rows`` when the
    column has at least twice that many observed cells (a column's error sums are released
    only over ``min_rows`` cells or more: fewer would be suppressed by the release gate),
    none when it has fewer.
    """
    observed = ~np.isnan(values)
    mask = np.zeros_like(observed)
    for j in range(values.shape[1]):
        rows = np.flatnonzero(observed[:, j])
        k = int(round(fraction * len(rows)))
        if k < min_rows:
            k = min_rows if len(rows) >= 2 * min_rows else 0
        if k:
            mask[rng.choice(rows, size=k, replace=False), j] = True
    return mask


def _validation_errors(st: dict, live: dict) -> tuple[np.ndarray, np.ndarray]:
    from fedtab.impute.train import masked_sq_errors, predict

    valid, vmask = live["valid"], live["valid_mask"]
    f = len(st["columns"])
    if not vmask.any():
        return np.zeros(f), np.zeros(f)
    given = np.where(vmask, np.nan, valid)
    pred = predict(live["model"], given, live["available"], live["adj"])
    return masked_sq_errors(pred, valid, vmask)


def _weights(request: Message) -> dict[str, np.ndarray]:
    return {k[2:]: v for k, v in request.arrays.items() if k.startswith("w/")}


@handler("impute_fit")
def _fit(site: Site, request: Message) -> Message:
    from fedtab.impute.model import numpy_to_state, state_to_numpy
    from fedtab.impute.optim_state import optimizer_to_numpy
    from fedtab.impute.train import Masking, Schedule, local_train

    st, live = _state(site), _live(site)
    cfg: ImputeConfig = st["config"]
    numpy_to_state(live["model"], _weights(request))
    noise = site_params(request).get("noise")  # the Gaussian release the weights are made under (its DP mod)
    masking = Masking(cfg.mask_fraction, cfg.structural_share)
    if noise is None:
        sse, cnt = _validation_errors(st, live)
        loss, steps = local_train(
            live["model"], live["optimizer"], live["train"], live["available"], live["adj"], rng=st["rng"],
            schedule=Schedule(cfg.local_epochs, cfg.batch_size, cfg.max_steps_per_round), masking=masking,
        )
    else:  # DP gradient descent (per-row clipping); validation errors are not released under DP
        from fedtab.impute.dp_train import DPSteps, dp_local_train

        f = len(st["columns"])
        sse, cnt, loss = np.zeros(f), np.zeros(f), float("nan")
        steps = dp_local_train(live["model"], live["optimizer"], live["train"], live["available"], live["adj"],
                               dp=DPSteps(_dp_steps(noise), noise, noise_rng()), masking=masking, rng=st["rng"])
    st["optimizer_state"] = optimizer_to_numpy(live["optimizer"])
    weights = state_to_numpy(live["model"])
    arrays = {f"w/{k}": v for k, v in weights.items()}
    arrays.update(val_sse=sse, val_count=cnt)
    return Message("impute_fit", arrays, {"n_train": int(len(live["train"])),
                                         "loss": loss if np.isfinite(loss) else None, "steps": steps})


def _dp_steps(dp: Mapping[str, Any]) -> int:
    """The DP gradient steps a fit request asks for (1 to :data:`MAX_DP_STEPS`; each is a
    release the server's accountant counted, so the site refuses an unbounded number)."""
    steps = dp.get("steps", 1)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_DP_STEPS:
        raise ValueError(f"DP imputation: steps must be an integer in [1, {MAX_DP_STEPS}], got {steps!r}")
    return steps


#: most DP gradient steps one imputation fit request may ask of a site.
MAX_DP_STEPS = 100
#: full-batch DP gradient steps per round of a DP run (each is a release the accountant
#: composes; on AirQuality more steps bought no accuracy over the linear prior and took
#: budget from the statistics the prior is fitted from — see benchmarks/README.md).
DP_STEPS_PER_ROUND = 1


@handler("impute_eval")
def _eval(site: Site, request: Message) -> Message:
    from fedtab.impute.model import numpy_to_state

    st, live = _state(site), _live(site)
    numpy_to_state(live["model"], _weights(request))
    sse, cnt = _validation_errors(st, live)
    # the mean-fill baseline on the same cells: it predicts the pooled mean, 0 in z-space
    mean_sse = np.where(live["valid_mask"], live["valid"], 0.0) ** 2
    return Message("impute_eval", {"val_sse": sse, "val_count": cnt, "val_mean_sse": mean_sse.sum(0)})


@table_step("impute_fill")
def _fill_table(site: Site, params: dict[str, Any]) -> pd.DataFrame:
    """The site's table after imputation: the filled feature columns, then the label.

    Records first which cells were measured (:func:`fedtab.federation.site.observed.record_measured`):
    ballots vote on measured cells only."""
    from fedtab.federation.site.observed import record_measured

    record_measured(site, site.table, list(params["columns"]))
    table = pd.DataFrame(np.asarray(params["values"], dtype=np.float64), columns=list(params["columns"]))
    if site.target is not None:
        table[site.target] = site.table[site.target].to_numpy()
    return table


def _finishing(request: Message, f: int) -> tuple[dict[int, list[float]], list[list[int]]]:
    """The request's value sets and indicator groups over ``f`` columns (checked)."""
    levels, groups = request.meta.get("levels") or {}, request.meta.get("groups") or []
    try:
        levels = {int(j): [float(x) for x in v] for j, v in dict(levels).items()}
        groups = [[int(j) for j in g] for g in groups]
    except (TypeError, ValueError):
        raise ValueError("impute_apply: levels must map column indices to numbers, groups be lists of indices") from None
    if any(not 0 <= j < f for j in [*levels, *(j for g in groups for j in g)]) or any(not v for v in levels.values()) \
            or not all(np.isfinite(x) for v in levels.values() for x in v):
        raise ValueError(f"impute_apply: a value set or group outside the {f} columns, empty or not finite")
    return levels, groups


@handler("impute_apply")
def _apply(site: Site, request: Message) -> Message:
    from fedtab.impute.fill import fill_from_predictions
    from fedtab.impute.model import numpy_to_state
    from fedtab.impute.train import predict

    st, live = _state(site), _live(site)
    numpy_to_state(live["model"], _weights(request))
    columns, mean, std = st["columns"], st["mean"], st["std"]
    raw = _global_values(site, "all", columns, np.zeros(len(columns)), np.ones(len(columns)))
    pred = predict(live["model"], (raw - mean) / std, live["available"], live["adj"])
    f = len(columns)
    low, high = (np.asarray(request.arrays[k], np.float64) for k in ("low", "high"))
    integer = np.asarray(request.arrays["integer"], dtype=bool)
    if low.shape != (f,) or high.shape != (f,) or integer.shape != (f,):
        raise ValueError(f"impute_apply: range/integer arrays must have shape ({f},)")
    levels, groups = _finishing(request, f)
    values, imputed, _ = fill_from_predictions(raw, pred, mean, std, low, high, integer, levels, groups)
    clipped = _released_clipped(raw, pred * std + mean, low, high, site.policy.min_rows)
    site.apply_table_step("impute_fill", {"columns": list(columns), "values": values})
    return Message("impute_apply", meta={"imputed": imputed, "clipped": clipped})


def _released_clipped(given: np.ndarray, raw: np.ndarray, low: np.ndarray, high: np.ndarray, min_rows: int) -> int:
    """How many imputed cells fell outside the server's ``[low, high]``, counted only in columns
    with 0 or ``>= min_rows`` imputed cells: the server chooses the bounds per column, so a
    column with a few imputed cells would otherwise give a bit about each of those rows."""
    fill = np.isnan(given)
    per_col = fill.sum(0)
    counted = (per_col == 0) | (per_col >= min_rows)
    out = fill & ((raw < low) | (raw > high))
    return int(out[:, counted].sum())
