"""FedHF-Impute as a federated workflow: site handlers + the server-side driver.

Protocol (every step: request built on the server, pure handler on the site,
reply validated by :func:`~fedtab.federation.protocol.exchange` and the checks below
before it is reduced):

1. ``impute_schema``  -> each site: its column names, row counts, per-column observed
   count, sum and sum of squares over its training rows. Server: global schema + pooled means.
2. ``impute_stats``   (shift = pooled means) -> each site: :class:`SiteStats`.
   Server: exact pooled Pearson correlations, global mean/std, feature graph and
   the linear prior (a factor model fitted to the known pooled correlations,
   :func:`~fedtab.impute.prior.fit_factor_prior`; no extra round).
3. ``impute_setup``   (graph, mean/std, prior W/psi, model + training config) -> each site
   z-scores its table over the global schema and builds the model. Ack.
4. ``impute_fit`` x rounds (global weights) -> each site scores the received model on
   its validation cells, trains locally, returns weights. Server: FedAvg by rows,
   keeps the weights with the best validation RMSE.
5. ``impute_eval``   (final weights) -> per-column validation errors, and those of mean fill.

6. ``impute_apply`` (optional, :func:`apply_imputation`; final weights, pooled observed
   range, integer columns) -> each site fills its own table (missing cells and
   unavailable columns, clipped to the range, integers rounded) and keeps it for the
   next workflow steps. Reply: how many cells were imputed and clipped.

The label (``Site.target``) is never imputed and never an input of the imputer: every
step works on the site's feature columns only.

No reply ever carries rows: only counts, sums, weights and error sums.

Every reply is validated against the agreed schema and the site's earlier claims
before it is pooled (:mod:`fedtab.federation.validate`): the columns are exactly the
site's declared ones (plus its target, if any); every count is an integer no larger
than the training rows it declared, and the same in the counting and statistics
steps; co-observed counts are at most each column's count; the statistics are taken
about the shift the server sent; sums of squares imply no negative variance and no
correlation outside [-1, 1] (checked overflow-safe, so a forged sum of 1e300 is rejected
before the server centres on it); model weights have the expected names and shapes, are
finite and of plausible magnitude; validation error counts fit the declared
validation rows. A rejected site is named (and dropped while the quorum holds).
Nothing here imports an engine; :func:`run_imputation` only uses
:class:`~fedtab.federation.protocol.Federation`.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from ..impute.graph import FeatureGraph, build_feature_graph
from ..impute.stats import STAT_ARRAYS, PooledStats, SiteStats, pool_stats, site_stats, suppressed_stats
from ..privacy.accountant import PrivacyLedger
from ..privacy.dp import (DP_GD_NOISE_SCALE, DP_META, DP_SCHEMA_NOISE_SCALE, add_noise, clip_rows, clip_values,
                          column_bounds, dp_request, noise_rng, parse_dp, release_moments, row_radius,
                          stats_sensitivity)
from ..privacy.secagg import MOMENT_BITS, WEIGHT, SecureAggregator
from ..privacy.gate import COUNT, NAMES, NUMBER, Releases
from . import validate
from .messages import Message
from .protocol import Federation, FederationError, collect, exchange, set_quorum
from .reduce import DEFAULT_MAX_SITE_SHARE, cap_weights, robust_params, screen_sites, site_median, usable_counts
from .site import Site, handler, table_step

__all__ = ["ImputeConfig", "ImputationResult", "apply_imputation", "run_imputation", "validate_site_table", "site_rng"]

log = logging.getLogger("fedtab.impute")


@dataclass
class ImputeConfig:
    """Everything the workflow needs; JSON-able so it can be sent to sites.

    Graph: ``k_neighbors`` per node, edges need ``|r| >= min_abs_corr``.
    Model: ``hidden_dim``, ``n_layers``, ``dropout``, ``block_unavailable`` (ablation).
    Prior: ``use_prior`` (the GNN predicts a factor model's conditional mean plus a
    learned correction; ``False`` = the plain GNN, kept as an ablation), ``prior_rank``
    (``None`` = from the correlation spectrum, at most ``prior_max_rank``).
    Training: ``rounds`` of FedAvg, ``local_epochs`` per round, Adam ``lr`` and
    ``weight_decay``, ``batch_size``, ``mask_fraction`` of observed entries hidden per
    batch, ``structural_share`` of those flagged unavailable, ``max_steps_per_round``
    (cap on local optimiser steps, ``None`` = no cap).
    Validation: ``validation_mask_fraction`` of observed cells hidden in each site's
    validation rows (the rows come from ``Site.test_size``); ``keep_best`` returns the
    round with the lowest validation RMSE instead of the last one.
    Robust mode (``robust=True``, see :mod:`fedtab.federation.reduce`): the centring
    shift is the median site's column mean; sites whose column means, spreads or
    correlations disagree with the median site's are left out of the pooled statistics
    (with a warning naming them), no site carries more than ``max_site_share`` of the
    pooled sums; the GNN's FedAvg is the coordinate-wise median of the sites' weights
    and the validation RMSE that picks the best round is the median over the sites.
    Privacy: ``secure_aggregation`` sends every summed quantity (column moments,
    co-observed statistics, the row-weighted GNN weights, validation errors) through
    :class:`~fedtab.privacy.secagg.SecureAggregator`; the server then learns only sums
    (per-site validation errors and training losses are not reported).
    ``dp = {"epsilon", "delta", "bounds", "clip"}``: differential privacy at the sites —
    the column moments and co-observed statistics of values clipped into the public
    ``bounds`` and the GNN's DP-FedAvg updates (clipped to L2 norm ``clip``) are Gaussian
    releases under one calibrated noise multiplier; validation errors and losses are not
    released (no validation report, no best-round choice).
    """

    k_neighbors: int = 10
    min_abs_corr: float = 0.05
    hidden_dim: int = 32
    n_layers: int = 3
    dropout: float = 0.0
    block_unavailable: bool = False
    use_prior: bool = True
    prior_rank: int | None = None
    prior_max_rank: int = 20
    rounds: int = 20
    local_epochs: int = 2
    lr: float = 3e-3
    weight_decay: float = 1e-5
    batch_size: int = 64
    mask_fraction: float = 0.4
    structural_share: float = 0.5
    max_steps_per_round: int | None = None
    validation_mask_fraction: float = 0.2
    keep_best: bool = True
    seed: int = 0
    n_threads: int | None = None
    robust: bool = False
    max_site_share: float = DEFAULT_MAX_SITE_SHARE
    secure_aggregation: bool = False
    dp: dict | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` for out-of-range settings."""
        checks = {
            "k_neighbors": self.k_neighbors >= 1,
            "min_abs_corr": 0 <= self.min_abs_corr < 1,
            "hidden_dim": self.hidden_dim >= 1,
            "n_layers": self.n_layers >= 0,
            "prior_rank": self.prior_rank is None or self.prior_rank >= 0,
            "prior_max_rank": self.prior_max_rank >= 1,
            "dropout": 0 <= self.dropout < 1,
            "rounds": self.rounds >= 0,
            "local_epochs": self.local_epochs >= 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "batch_size": self.batch_size >= 1,
            "mask_fraction": 0 < self.mask_fraction <= 1,
            "structural_share": 0 <= self.structural_share <= 1,
            "validation_mask_fraction": 0 < self.validation_mask_fraction <= 1,
            "max_site_share": isinstance(self.max_site_share, (int, float)) and 0 < self.max_site_share <= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid imputation settings: {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}")
        parse_dp(self.dp)


@dataclass
class ImputationResult:
    """What the server learned. Arrays are over the global schema ``columns`` (F).

    Attributes:
        columns: global schema. mean, std: (F,) pooled (std 1 for constant columns).
        pooled: the pooled statistics (correlations, co-observed counts).
        graph: the feature graph sent to the sites.
        prior_W, prior_psi: the linear prior's (F, k) loadings and (F,) noise
            variances (``None`` when ``use_prior`` is off).
        model_config: kwargs of :class:`~fedtab.impute.model.GNNConfig`.
        weights: final model parameters (numpy, float32).
        site_columns: site -> its columns. site_rows: site -> training rows.
        history: per round ``{"round", "train_loss", "val_rmse"}`` (val of the model
            the sites received at the start of that round).
        validation: ``{"overall", "per_site", "per_column"}`` z-space RMSE of the returned
            model on the validation cells (empty dicts / None if no site has validation rows),
            and ``"per_column_mean_fill"``: the z-space RMSE of filling the same cells with the
            pooled mean (the baseline; sites send its squared-error sums ``val_mean_sse``).
        unobserved_pairs: column pairs no site observes together.
        privacy: with ``dp``, ε spent per step and in total (see
            :meth:`~fedtab.privacy.accountant.PrivacyLedger.report`).
        best_round: round whose model is returned. seconds: wall time. bytes: (down, up).
        participation: per exchange ``{"step", "sites"}``: the sites whose reply was used.
        dropped: ``{site: reason}`` of the sites left out during this run.
        left_out: robust mode: ``{site: reason}`` of the sites whose statistics were
            left out of the pooled statistics.
    """

    columns: list[str]
    mean: np.ndarray
    std: np.ndarray
    pooled: PooledStats
    graph: FeatureGraph
    model_config: dict
    weights: dict[str, np.ndarray]
    site_columns: dict[str, list[str]]
    site_rows: dict[str, int]
    prior_W: np.ndarray | None = None
    prior_psi: np.ndarray | None = None
    history: list[dict] = field(default_factory=list)
    validation: dict = field(default_factory=dict)
    unobserved_pairs: int = 0
    best_round: int = 0
    seconds: float = 0.0
    bytes: tuple[int, int] = (0, 0)
    participation: list[dict] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    privacy: dict | None = None


# ----------------------------------------------------------------------------- site side
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


@handler("impute_schema", Releases(part="=train", cells={"count": ("sum", "sumsq")},
                                   meta={"columns": NAMES, "n_train": COUNT, "n_valid": COUNT}, dp=True, dp_releases=3))
def _schema(site: Site, request: Message) -> Message:
    validate_site_table(_features(site), site.name)
    train = _values(site, "train")
    if len(train) == 0:
        raise ValueError(f"site {site.name!r}: no training rows")
    obs = ~np.isnan(train)
    empty = [c for c, n in zip(site.feature_names, obs.sum(0)) if n == 0]
    if empty:
        raise ValueError(f"site {site.name!r}: columns with no observed training value {empty[:8]}")
    dp = request.meta.get(DP_META)
    lo = hi = None  # public bounds, under dp
    if dp is not None:
        lo, hi = column_bounds(dp, site.feature_names)
        train = clip_values(train, lo, hi)
    values = np.where(obs, train, 0.0)
    count, total, sumsq = release_moments(obs.sum(0).astype(np.float64), values.sum(0), (values * values).sum(0),
                                          min_rows=site.policy.min_rows, dp=dp, lo=lo, hi=hi)
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


@handler("impute_stats", Releases(part="=train", cells={"count": ("sum", "sumsq"),
                                                         "pair_count": ("pair_sx", "pair_sxx", "pair_sxy")},
                                  aggregates=("shift",), meta={"columns": NAMES}, dp=True,
                                  dp_releases=len(STAT_ARRAYS)))
def _stats(site: Site, request: Message) -> Message:
    glob = list(request.meta["columns"])
    pos = {c: i for i, c in enumerate(glob)}
    cols = site.feature_names
    idx = [pos[c] for c in cols]
    shift = np.asarray(request.arrays["shift"], dtype=np.float64)[idx]
    values = _values(site, "train")
    dp = request.meta.get(DP_META)
    if dp is not None:
        values = clip_values(values, *column_bounds(dp, cols))
        if "scale" not in request.arrays:
            raise ValueError("DP statistics need the pooled scale (the 'scale' array)")
    if "scale" in request.arrays:  # z-values: well-conditioned fixed-point sums, bounded DP rows
        values = (values - shift) / np.asarray(request.arrays["scale"], dtype=np.float64)[idx]
        shift = np.zeros(len(cols))
    if dp is not None:
        values = clip_rows(values, row_radius(len(cols)))
    s = site_stats(values, cols, shift)
    if dp is None:  # under DP the noise protects small cells (data-dependent suppression would void it)
        s = suppressed_stats(s, site.policy.min_rows)
    if dp is not None:
        sens, rng = stats_sensitivity(row_radius(len(cols)), len(cols)), noise_rng()
        noisy = {k: add_noise(getattr(s, k), sens[k], dp, rng, symmetric=k in ("pair_count", "pair_sxy"))
                 for k in STAT_ARRAYS}
        s = SiteStats(columns=s.columns, shift=s.shift, **noisy)
    if request.meta.get("global"):
        return Message("impute_stats", {k: _embed(getattr(s, k), idx, len(glob)) for k in STAT_ARRAYS}, {})
    return Message("impute_stats", {k: getattr(s, k) for k in STAT_ARRAYS + ("shift",)}, {"columns": cols})


def _global_values(site: Site, part: str, columns: list[str], mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(n, F) z-scored values over the global schema; NaN = missing or unavailable."""
    rows = _features(site, part)
    out = np.full((len(rows), len(columns)), np.nan)
    pos = {c: i for i, c in enumerate(columns)}
    idx = [pos[str(c)] for c in rows.columns]
    out[:, idx] = rows.to_numpy(dtype=np.float64, na_value=np.nan)
    return (out - mean) / std


@handler("impute_setup", Releases(part=None, meta={"n_train": COUNT, "n_valid": COUNT}))
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

    from ..impute.model import GNNConfig, GNNImputer, graph_tensors
    from ..impute.optim_state import numpy_to_optimizer
    from ..impute.train import set_threads

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
    from ..impute.train import masked_sq_errors, predict

    valid, vmask = live["valid"], live["valid_mask"]
    f = len(st["columns"])
    if not vmask.any():
        return np.zeros(f), np.zeros(f)
    given = np.where(vmask, np.nan, valid)
    pred = predict(live["model"], given, live["available"], live["adj"])
    return masked_sq_errors(pred, valid, vmask)


def _weights(request: Message) -> dict[str, np.ndarray]:
    return {k[2:]: v for k, v in request.arrays.items() if k.startswith("w/")}


@handler("impute_fit", Releases(part="=train", model="w/", cells={"val_count": ("val_sse",)},
                                meta={"n_train": COUNT, "loss": NUMBER, "steps": COUNT}, dp=True,
                                dp_releases=lambda r: _dp_steps(r.meta.get(DP_META) or {})))
def _fit(site: Site, request: Message) -> Message:
    from ..impute.model import numpy_to_state, state_to_numpy
    from ..impute.optim_state import optimizer_to_numpy
    from ..impute.train import local_train

    st, live = _state(site), _live(site)
    cfg: ImputeConfig = st["config"]
    numpy_to_state(live["model"], _weights(request))
    dp = request.meta.get(DP_META)
    if dp is None:
        sse, cnt = _validation_errors(st, live)
        loss, steps = local_train(
            live["model"], live["optimizer"], live["train"], live["available"], live["adj"],
            epochs=cfg.local_epochs, batch_size=cfg.batch_size, mask_fraction=cfg.mask_fraction,
            structural_share=cfg.structural_share, rng=st["rng"], max_steps=cfg.max_steps_per_round,
        )
    else:  # DP gradient descent (per-row clipping); validation errors are not released under DP
        from ..impute.dp_train import dp_local_train

        f = len(st["columns"])
        sse, cnt, loss = np.zeros(f), np.zeros(f), float("nan")
        steps = dp_local_train(live["model"], live["optimizer"], live["train"], live["available"], live["adj"],
                               steps=_dp_steps(dp), mask_fraction=cfg.mask_fraction,
                               structural_share=cfg.structural_share, spec=dp, rng=st["rng"], noise=noise_rng())
    st["optimizer_state"] = optimizer_to_numpy(live["optimizer"])
    weights = state_to_numpy(live["model"])
    arrays = {f"w/{k}": v for k, v in weights.items()}
    arrays.update(val_sse=sse, val_count=cnt)
    return Message("impute_fit", arrays, {"n_train": int(len(live["train"])),
                                         "loss": loss if np.isfinite(loss) and dp is None else None, "steps": steps})


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


@handler("impute_eval", Releases(part="=test", cells={"val_count": ("val_sse", "val_mean_sse")}))
def _eval(site: Site, request: Message) -> Message:
    from ..impute.model import numpy_to_state

    st, live = _state(site), _live(site)
    numpy_to_state(live["model"], _weights(request))
    sse, cnt = _validation_errors(st, live)
    # the mean-fill baseline on the same cells: it predicts the pooled mean, 0 in z-space
    mean_sse = np.where(live["valid_mask"], live["valid"], 0.0) ** 2
    return Message("impute_eval", {"val_sse": sse, "val_count": cnt, "val_mean_sse": mean_sse.sum(0)})


@table_step("impute_fill")
def _fill_table(site: Site, params: dict[str, Any]) -> pd.DataFrame:
    """The site's table after imputation: the filled feature columns, then the label.

    Records first which cells were measured (:func:`fedtab.federation.observed.record_measured`):
    ballots vote on measured cells only."""
    from .observed import record_measured

    record_measured(site, site.table, list(params["columns"]))
    table = pd.DataFrame(np.asarray(params["values"], dtype=np.float64), columns=list(params["columns"]))
    if site.target is not None:
        table[site.target] = site.table[site.target].to_numpy()
    return table


@handler("impute_apply", Releases(part="=all", meta={"imputed": COUNT, "clipped": COUNT}))
def _apply(site: Site, request: Message) -> Message:
    from ..impute.fill import fill_from_predictions
    from ..impute.model import numpy_to_state
    from ..impute.train import predict

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
    values, imputed, clipped = fill_from_predictions(raw, pred, mean, std, low, high, integer)
    site.apply_table_step("impute_fill", {"columns": list(columns), "values": values})
    return Message("impute_apply", meta={"imputed": imputed, "clipped": clipped})


# --------------------------------------------------------------------------- server side
def _error_arrays(federation: Federation, site: str, r: Message, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(val_sse, val_count)`` of one reply: non-negative, counts within the declared validation rows."""
    assert federation.schema is not None
    sse, cnt = validate.array(r, "val_sse", (f,)), validate.array(r, "val_count", (f,))
    if np.any(sse < 0):
        raise ValueError("negative validation errors")
    validate.counts(cnt, federation.schema.rows(site, "test"), "validation counts")
    return sse, cnt


def _error_totals(per_site: Mapping[str, tuple[np.ndarray, np.ndarray]], robust: bool = False) -> float | None:
    """The overall validation RMSE from per-site (sse, count): pooled, or with ``robust`` the median site's."""
    if robust:
        rmse = [np.sqrt(v[0].sum() / v[1].sum()) for v in per_site.values() if v[1].sum() > 0]
        return float(site_median(np.array(rmse))) if rmse else None
    tot_sse = sum(v[0].sum() for v in per_site.values())
    tot_cnt = sum(v[1].sum() for v in per_site.values())
    return float(np.sqrt(tot_sse / tot_cnt)) if tot_cnt > 0 else None


def _robust_pool(stats: Mapping[str, SiteStats], glob: list[str], max_site_share: float,
                 ) -> tuple[PooledStats, dict[str, str]]:
    """Screen each site's own means/stds/correlations against the median site, then pool the rest
    with every site's sums scaled so that no site carries more than ``max_site_share`` of the rows.

    A left-out site still informs the columns (and column pairs) that no kept site observes:
    nobody else can check or replace them.
    """
    own = {s: pool_stats([st], glob) for s, st in stats.items()}
    left_out = screen_sites({s: p.mean for s, p in own.items()}, {s: p.std for s, p in own.items()},
                            {s: p.corr for s, p in own.items()}, columns=glob, what="imputation statistics")
    kept = [s for s in stats if s not in left_out]
    rows = np.array([float(usable_counts(stats[s].count).max(initial=0.0)) for s in kept])
    scale = cap_weights(rows, max_site_share) * rows.sum() / np.maximum(rows, 1e-300)
    scaled = [SiteStats(columns=stats[s].columns, shift=stats[s].shift,
                        **{k: getattr(stats[s], k) * f for k in STAT_ARRAYS}) for s, f in zip(kept, scale)]
    pooled = pool_stats(scaled, glob)
    if not left_out:
        return pooled, left_out
    for s in left_out:
        lone = (pooled.count == 0) & (own[s].count > 0)
        pair = (pooled.pair_count == 0) & (own[s].pair_count > 0)
        for name in ("count", "mean", "std"):
            getattr(pooled, name)[lone] = getattr(own[s], name)[lone]
        pooled.pair_count[pair] = own[s].pair_count[pair]
        pooled.corr[pair] = own[s].corr[pair]
    return pooled, left_out


def _weight_arrays(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"w/{k}": v for k, v in weights.items()}


def _dp_meta(meta: dict[str, Any], dp_meta: Mapping[str, Any] | None) -> dict[str, Any]:
    return {**meta, DP_META: dict(dp_meta)} if dp_meta is not None else meta


def _repaired(st: SiteStats) -> SiteStats:
    """Post-processing of noisy statistics into consistent ones: counts and sums of
    squares floored at 0, symmetric co-observed counts whose diagonal is the count."""
    count = np.maximum(np.rint(st.count), 0.0)
    pc = np.maximum(np.rint(0.5 * (st.pair_count + st.pair_count.T)), 0.0)
    np.fill_diagonal(pc, count)
    return SiteStats(columns=st.columns, shift=st.shift, count=count, sum=st.sum, sumsq=np.maximum(st.sumsq, 0.0),
                     pair_count=pc, pair_sx=st.pair_sx, pair_sxx=np.maximum(st.pair_sxx, 0.0),
                     pair_sxy=0.5 * (st.pair_sxy + st.pair_sxy.T))


def _summed(federation: Federation, secure: SecureAggregator | None, request: Message, kind: str,
            fields: Mapping[str, int | None], *, weighted: Sequence[str] = (), weight: str | None = None,
            drop_meta: Sequence[str] = ()) -> dict[str, np.ndarray]:
    """A private run's sum of the sites' arrays ``fields``: through ``secure`` when given,
    else added up here from replies the sites noised (DP without secure aggregation).
    ``weighted`` arrays are multiplied by the reply meta ``weight``, summed as ``WEIGHT``.

    Raises:
        FederationError: a site failed, or sent arrays of other shapes than the others (naming it).
    """
    if secure is not None:
        return secure.ask({s: request for s in secure.peers}, kind, fields, weighted=weighted, weight=weight,
                          drop_meta=drop_meta).sums
    sums: dict[str, np.ndarray] = {}
    for site, reply in collect(federation.broadcast(request), kind).items():
        try:
            w = float(reply.meta[weight]) if weight is not None else 1.0
            for name in fields:
                a = validate.array(reply, name, sums[name].shape if name in sums else np.shape(reply.arrays.get(name)))
                a = a * w if name in weighted else a
                sums[name] = sums[name] + a if name in sums else a
        except (KeyError, TypeError, ValueError) as exc:
            raise FederationError(f"site {site!r}: {exc}") from None
        if weight is not None:
            sums[WEIGHT] = sums.get(WEIGHT, np.zeros(1)) + w
    return sums


def _private_pooled(federation: Federation, secure: SecureAggregator | None, glob: list[str], shift: np.ndarray,
                    scale: np.ndarray, dp_meta: Mapping[str, Any] | None = None) -> PooledStats:
    """Step 2 of a private run: the sites' statistics of ``(x - shift) / scale`` over the
    global schema, summed (securely and/or noised at the sites) and pooled; mean and std
    are returned in data units.

    Raises:
        FederationError: the sum failed or the summed statistics are inconsistent.
    """
    request = Message("impute_stats", {"shift": shift, "scale": scale}, _dp_meta({"columns": glob, "global": True},
                                                                                dp_meta))
    sums = _summed(federation, secure, request, "impute_stats",
                   {k: (0 if k in ("count", "pair_count") and dp_meta is None else None) for k in STAT_ARRAYS})
    for k in ("count", "pair_count"):
        sums[k] = np.rint(sums[k])
    stats = SiteStats(columns=list(glob), shift=np.zeros(len(glob)), **sums)
    if dp_meta is not None:
        stats = _repaired(stats)
    try:
        stats.validate()
        pooled = pool_stats([stats], glob)
    except ValueError as exc:
        raise FederationError(f"the summed statistics are invalid: {exc}") from None
    pooled.mean = shift + scale * pooled.mean
    pooled.std = scale * pooled.std
    return pooled


def _private_fit_round(federation: Federation, secure: SecureAggregator | None, weights: dict[str, np.ndarray],
                       rnd: int, shapes: Mapping[str, tuple], dp_meta: Mapping[str, Any] | None = None,
                       ) -> tuple[dict[str, np.ndarray], float | None, None]:
    """One FedAvg round of a private run: ``(new weights, validation RMSE or None, None)``
    from the sums of the row-weighted weights (losses are not released)."""
    names = [f"w/{k}" for k in shapes]
    request = Message("impute_fit", _weight_arrays(weights), _dp_meta({"round": rnd}, dp_meta))
    sums = _summed(federation, secure, request, "impute_fit",
                   {**{n: None for n in names}, "val_sse": None, "val_count": 0 if dp_meta is None else None},
                   weighted=names, weight="n_train", drop_meta=["loss", "steps"])
    n = float(sums[WEIGHT][0])
    if not n > 0:
        raise FederationError(f"round {rnd}: the summed row count is not positive")
    new = {k: (sums[f"w/{k}"] / n).astype(weights[k].dtype) for k in shapes}
    cnt = float(np.sum(sums["val_count"]))
    val = float(np.sqrt(max(float(np.sum(sums["val_sse"])), 0.0) / cnt)) if cnt > 0 else None
    return new, val, None


def _private_evaluation(federation: Federation, weights: Mapping[str, np.ndarray], f: int,
                        secure: SecureAggregator | None) -> tuple[dict, np.ndarray, np.ndarray, float | None,
                                                                    np.ndarray | None]:
    """Final evaluation of a secure run: ``({}, column sse, column count, RMSE, mean-fill sse)``
    from sums only (no per-site errors)."""
    sums = _summed(federation, secure, Message("impute_eval", _weight_arrays(weights)), "impute_eval",
                   {"val_sse": None, "val_count": 0, "val_mean_sse": None})
    sse, cnt = np.maximum(sums["val_sse"], 0.0), np.rint(sums["val_count"])
    return ({}, sse, cnt, (float(np.sqrt(sse.sum() / cnt.sum())) if cnt.sum() > 0 else None),
            np.maximum(sums["val_mean_sse"], 0.0))


def run_imputation(
    federation: Federation,
    config: ImputeConfig | None = None,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    *,
    min_sites: int | None = None,
    max_param_abs: float = validate.MAX_PARAM_ABS,
) -> ImputationResult:
    """Run FedHF-Impute over ``federation`` and return the learned imputer state.

    Args:
        federation: any engine's :class:`Federation`; every site must have the
            ``impute_*`` handlers (importing this module registers them).
        config: settings (defaults: :class:`ImputeConfig`).
        progress: optional ``fn(round, rounds, info)`` called after each round.
        min_sites: quorum (sets ``federation.min_sites``): failing, timed-out or
            rejected sites are dropped while this many remain; ``None`` keeps the
            federation's policy (by default every site must answer).
        max_param_abs: largest ``|entry|`` accepted in a site's model weights.

    Raises:
        FederationError: a site failed (the message names it), a reply was malformed,
            or the sites share no column (with more than one site).
        ValueError: invalid ``config``.
    """
    import torch

    from ..impute.model import GNNConfig, GNNImputer, state_to_numpy
    from ..impute.train import fedavg, set_threads

    cfg = config or ImputeConfig()
    cfg.validate()
    robust = bool(cfg.robust)
    set_threads(cfg.n_threads)
    t0 = time.perf_counter()
    down0, up0 = federation.traffic.total()

    set_quorum(federation, min_sites)
    p0, dropped0 = len(federation.participation), set(federation.dropped)
    if cfg.robust and cfg.secure_aggregation:
        raise ValueError("robust=True cannot be combined with secure_aggregation=True: the robust reducers need "
                         "each site's statistics, secure aggregation shows the server only their sums")
    secure = SecureAggregator(federation) if cfg.secure_aggregation else None
    spec = parse_dp(cfg.dp)
    private = secure is not None or spec is not None  # sums travel masked and/or noised, in their own exchanges
    ledger = dp_meta = schema_dp = fit_dp = None
    if spec is not None:
        dp_steps = DP_STEPS_PER_ROUND
        ledger = PrivacyLedger.for_plan(spec, {"schema": 3, "stats": len(STAT_ARRAYS), "fit": cfg.rounds * dp_steps},
                                        {"schema": DP_SCHEMA_NOISE_SCALE, "fit": DP_GD_NOISE_SCALE})
        dp_meta = dp_request(spec, ledger.noise_multiplier)
        schema_dp = dp_request(spec, ledger.multiplier("schema"))
        fit_dp = {**dp_request(spec, ledger.multiplier("fit")), "steps": dp_steps}

    # 1. schema + counts (the first exchange of a run also agrees the federation's schema)
    first: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = {}

    def check_counts(s: str, r: Message) -> None:
        schema = federation.schema
        assert schema is not None
        cols = r.meta.get("columns")
        target = schema.declaration(s).target
        own = [c for c in cols if c != target] if isinstance(cols, list) else cols
        own = schema.check_features(s, own, exact=True, what="imputation columns")
        if isinstance(cols, list) and len(cols) != len(own) + (target is not None and target in cols):
            raise ValueError("imputation columns repeat the target")
        n = validate.integer(r.meta.get("n_train"), "training rows", equal=schema.rows(s, "train"))
        validate.integer(r.meta.get("n_valid"), "validation rows", equal=schema.rows(s, "test"))
        if n == 0:
            raise ValueError("no training rows")
        if private:  # the moments follow in their own (secure and/or noised) exchange
            first[s] = (list(cols), np.zeros(0), np.zeros(0))
            return
        c_ = validate.counts(validate.array(r, "count", (len(cols),)), n, "column counts")
        total = validate.array(r, "sum", (len(cols),))
        validate.moments(c_, total, validate.array(r, "sumsq", (len(cols),)), "column moments")
        first[s] = (list(cols), c_, total)

    replies = exchange(federation, Message("impute_schema", meta={"columns_only": True} if private else {}),
                       check_counts)
    site_columns: dict[str, list[str]] = {s: first[s][0] for s in replies}
    columns: dict[str, None] = {}
    for s in replies:
        for c in site_columns[s]:
            columns.setdefault(str(c), None)
    glob = list(columns)
    f = len(glob)
    pos = {c: i for i, c in enumerate(glob)}
    holders = np.zeros(f, dtype=int)
    cnt, sm, sq = np.zeros(f), np.zeros(f), np.zeros(f)
    site_means = np.full((len(replies), f), np.nan)
    for i, s in enumerate(replies):
        idx = [pos[c] for c in site_columns[s]]
        holders[idx] += 1
        if not private:
            cnt[idx] += first[s][1]
            sm[idx] += first[s][2]
            with np.errstate(invalid="ignore", divide="ignore"):
                site_means[i, idx] = np.where(first[s][1] > 0, first[s][2] / first[s][1], np.nan)
    scale = None
    if private:  # the moments over the global schema, summed securely and/or noised at the sites
        moments = _summed(federation, secure, Message("impute_schema", meta=_dp_meta({"global": glob}, schema_dp)),
                          "impute_schema", {"count": 0 if dp_meta is None else MOMENT_BITS, "sum": MOMENT_BITS,
                                            "sumsq": MOMENT_BITS})
        cnt, sm, sq = np.rint(moments["count"]), moments["sum"], moments["sumsq"]
        with np.errstate(invalid="ignore", divide="ignore"):
            var = sq / cnt - (sm / cnt) ** 2
        scale = np.where(np.isfinite(var) & (var > 1e-12), np.sqrt(np.abs(var)), 1.0)
    if len(replies) > 1 and holders.max() < 2:
        raise FederationError(
            "no column is shared by two or more sites: the sites' schemas are disjoint, so nothing links them "
            f"(site columns: { {s: c[:5] for s, c in site_columns.items()} })"
        )
    if ledger is not None:
        ledger.spend("schema", 3)
        cnt = usable_counts(cnt)  # post-processing: noisy counts below 1 are none
    if np.any(cnt == 0) and spec is None:
        raise FederationError(f"columns without any observed value: {[glob[i] for i in np.flatnonzero(cnt == 0)][:8]}")
    shift = np.divide(sm, cnt, out=np.zeros_like(sm), where=cnt > 0)
    if robust:  # the median site's mean: a site's claimed sums cannot move the centring
        shift = np.where(np.isnan(site_median(site_means)), shift, site_median(site_means))
    if spec is not None:  # a count the noise took below 1: the middle of the public bounds
        lo, hi = column_bounds(spec, glob)
        shift = np.clip(np.where(cnt > 0, shift, 0.5 * (lo + hi)), lo, hi)

    # 2. sufficient statistics -> pooled correlations -> graph
    left_out: dict[str, str] = {}
    if private:
        pooled = _private_pooled(federation, secure, glob, shift, scale, dp_meta)
    else:
        site_stats_: dict[str, SiteStats] = {}

        def check_stats(s: str, r: Message) -> None:
            if r.meta.get("columns") != site_columns[s]:
                raise ValueError("statistics are over different columns than its schema")
            n = len(site_columns[s])
            arrays = {k: validate.array(r, k, (n,) if k in ("count", "sum", "sumsq", "shift") else (n, n))
                      for k in STAT_ARRAYS + ("shift",)}
            idx = [pos[c] for c in site_columns[s]]
            if not np.array_equal(arrays["shift"], shift[idx]):
                raise ValueError("statistics are not taken about the shift the server sent")
            if not np.array_equal(arrays["count"], first[s][1]):
                raise ValueError("column counts differ from the ones it sent in the counting step")
            validate.counts(arrays["pair_count"], federation.schema.rows(s, "train"), "pair counts")
            validate.pair_statistics(arrays["count"], arrays["sum"], arrays["sumsq"], arrays["pair_count"],
                                     arrays["pair_sx"], arrays["pair_sxx"], arrays["pair_sxy"])
            st = SiteStats(columns=site_columns[s], **arrays)
            st.validate()
            site_stats_[s] = st

        replies = exchange(federation, Message("impute_stats", {"shift": shift}, {"columns": glob}), check_stats)
        stats = {s: site_stats_[s] for s in replies}
        try:
            if robust:
                pooled, left_out = _robust_pool(stats, glob, cfg.max_site_share)
            else:
                pooled = pool_stats(list(stats.values()), glob)
        except ValueError as exc:
            raise FederationError(f"pooling statistics failed: {exc}") from None
    if ledger is not None:
        ledger.spend("stats", len(STAT_ARRAYS))
        lo, hi = column_bounds(spec, glob)  # post-processing: noisy moments back within the public bounds
        pooled.mean = np.clip(np.nan_to_num(pooled.mean, nan=0.5 * (lo + hi)), lo, hi)
        pooled.std = np.clip(np.nan_to_num(pooled.std, nan=1.0), 1e-6, np.maximum(hi - lo, 1e-6))
    mean = pooled.mean
    std = np.where(np.isfinite(pooled.std) & (pooled.std > 1e-12), pooled.std, 1.0)
    graph = build_feature_graph(pooled.corr, glob, k=cfg.k_neighbors, min_abs_corr=cfg.min_abs_corr)
    unobserved = pooled.unobserved_pairs()
    log.info("feature graph: %d nodes, %d edges; %d column pairs never observed together", f, graph.n_edges, unobserved)
    prior = None
    if cfg.use_prior and f > 1:
        from ..impute.prior import fit_factor_prior

        prior = fit_factor_prior(pooled.corr, pooled.pair_count, rank=cfg.prior_rank, max_rank=cfg.prior_max_rank)
        log.info("linear prior: rank %d", prior.rank)
        if prior.rank == 0:
            prior = None

    # 3. setup
    mcfg = GNNConfig(n_features=f, hidden_dim=cfg.hidden_dim, n_layers=cfg.n_layers, dropout=cfg.dropout,
                     block_unavailable=cfg.block_unavailable, prior_rank=prior.rank if prior is not None else 0)
    setup_arrays = {"edge_index": graph.edge_index, "weight": graph.weight, "sign": graph.sign, "mean": mean, "std": std}
    if prior is not None:
        setup_arrays.update(prior_W=prior.W, prior_psi=prior.psi)
    setup = Message("impute_setup", setup_arrays, {"columns": glob, "config": asdict(cfg), "model": mcfg.to_dict()})
    def check_setup(s: str, r: Message) -> None:
        assert federation.schema is not None
        validate.integer(r.meta.get("n_train"), "training rows", equal=federation.schema.rows(s, "train"))
        validate.integer(r.meta.get("n_valid"), "validation rows", equal=federation.schema.rows(s, "test"))

    replies = exchange(federation, setup, check_setup)
    site_rows = {s: int(r.meta["n_train"]) for s, r in replies.items()}

    # 4. FedAvg rounds
    torch.manual_seed(cfg.seed)
    weights = state_to_numpy(GNNImputer(mcfg))
    shapes = {k: v.shape for k, v in weights.items()}
    history: list[dict] = []
    best = (np.inf, 0, weights)
    for rnd in range(1, cfg.rounds + 1):
        if private:
            new, val, train_loss = _private_fit_round(federation, secure, weights, rnd, shapes, fit_dp)
            if ledger is not None:
                ledger.spend("fit", fit_dp["steps"])
        else:
            fitted: dict[str, tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}

            def check_fit(s: str, r: Message) -> None:
                validate.integer(r.meta.get("n_train"), "training rows", equal=site_rows[s])
                loss = r.meta.get("loss")
                if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
                    raise ValueError("loss must be a number or null")
                w = validate.parameters({k[2:]: v for k, v in r.arrays.items() if k.startswith("w/")}, shapes,
                                        max_abs=max_param_abs, what="array 'w/…'")
                fitted[s] = (w, _error_arrays(federation, s, r, f))

            replies = exchange(federation, Message("impute_fit", _weight_arrays(weights), {"round": rnd}), check_fit)
            new, sizes, losses = [], [], []
            for s, r in replies.items():
                new.append(fitted[s][0])
                sizes.append(site_rows[s])
                loss = r.meta.get("loss")
                if loss is not None:
                    losses.append((float(loss), site_rows[s]))
            val = _error_totals({s: fitted[s][1] for s in replies}, robust)
            new = robust_params(new) if robust else fedavg(new, sizes)
            train_loss = sum(l * n for l, n in losses) / sum(n for _, n in losses) if losses else None
        if val is not None and val < best[0]:
            best = (val, rnd - 1, weights)
        weights = new
        history.append({"round": rnd, "train_loss": train_loss, "val_rmse": val})
        if progress is not None:
            progress(rnd, cfg.rounds, history[-1])

    # 5. final evaluation
    mean_fill: dict[str, np.ndarray] = {}  # the mean-fill baseline's error sums, when every site sends them

    def evaluate(w: dict[str, np.ndarray]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], float | None]:
        errors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        mean_fill.clear()

        def check_eval(s: str, r: Message) -> None:
            errors[s] = _error_arrays(federation, s, r, f)
            if "val_mean_sse" in r.arrays:
                m = validate.array(r, "val_mean_sse", (f,))
                if np.any(m < 0):
                    raise ValueError("negative mean-fill errors")
                mean_fill[s] = m

        got = exchange(federation, Message("impute_eval", _weight_arrays(w)), check_eval)
        per = {s: errors[s] for s in got}
        if set(mean_fill) != set(got):
            mean_fill.clear()
        return per, _error_totals(per, robust)

    if private:  # secure: only sums; DP: validation errors are not released
        per_site, col_sse, col_cnt, val, mean_sse = (_private_evaluation(federation, weights, f, secure) if ledger is None
                                                     else ({}, np.zeros(f), np.zeros(f), None, None))
    else:
        per_site, val = evaluate(weights)
    best_round = cfg.rounds
    if cfg.keep_best and val is not None and best[0] < val:
        best_round, weights = best[1], best[2]
        if private:
            per_site, col_sse, col_cnt, val, mean_sse = _private_evaluation(federation, weights, f, secure)
        else:
            per_site, val = evaluate(weights)
    if not private:
        col_sse = sum(v[0] for v in per_site.values())
        col_cnt = sum(v[1] for v in per_site.values())
        mean_sse = sum(mean_fill.values()) if mean_fill else None
    validation = {
        "overall": val,
        "per_site": {s: (float(np.sqrt(v[0].sum() / v[1].sum())) if v[1].sum() > 0 else None) for s, v in per_site.items()},
        "per_column": {glob[i]: (float(np.sqrt(col_sse[i] / col_cnt[i])) if col_cnt[i] > 0 else None) for i in range(f)},
    }
    if mean_sse is not None:
        validation["per_column_mean_fill"] = {
            glob[i]: (float(np.sqrt(mean_sse[i] / col_cnt[i])) if col_cnt[i] > 0 else None) for i in range(f)}
    down1, up1 = federation.traffic.total()
    return ImputationResult(
        columns=glob, mean=mean, std=std, pooled=pooled, graph=graph, model_config=mcfg.to_dict(), weights=weights,
        prior_W=None if prior is None else prior.W, prior_psi=None if prior is None else prior.psi,
        site_columns=site_columns, site_rows=site_rows, history=history, validation=validation,
        unobserved_pairs=unobserved, best_round=best_round, seconds=time.perf_counter() - t0,
        bytes=(down1 - down0, up1 - up0), participation=federation.participation[p0:],
        dropped={s: r for s, r in federation.dropped.items() if s not in dropped0},
        left_out=left_out,
        privacy=ledger.report() if ledger is not None else None,
    )


def apply_imputation(federation: Federation, result: ImputationResult, low: np.ndarray, high: np.ndarray,
                     integer: np.ndarray) -> dict[str, dict[str, int]]:
    """Let every site fill its table with the imputer of ``result`` (one exchange).

    Args:
        low, high: ``(F,)`` the pooled observed range of each column of ``result.columns``;
            imputed values are clipped into it. integer: ``(F,)`` bool, columns rounded.

    Returns:
        ``{site: {"imputed": cells, "clipped": cells}}``.

    Raises:
        FederationError: a site failed or replied counts that are not non-negative integers.
        ValueError: arrays whose shapes do not match ``result.columns``.
    """
    f = len(result.columns)
    arrays = {"low": np.asarray(low, np.float64), "high": np.asarray(high, np.float64),
              "integer": np.asarray(integer, dtype=bool)}
    if any(a.shape != (f,) for a in arrays.values()):
        raise ValueError(f"apply_imputation: low/high/integer must have shape ({f},)")
    replies = collect(federation.broadcast(Message("impute_apply", {**_weight_arrays(result.weights), **arrays})),
                      "impute_apply")
    out = {}
    for s, r in replies.items():
        counts = {k: r.meta.get(k) for k in ("imputed", "clipped")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()):
            raise FederationError(f"site {s!r}: invalid imputation counts {counts}")
        out[s] = counts
    if getattr(federation, "schema", None) is not None:
        federation.schema = None  # the tables gained columns: the next exchange declares them again
    return out
