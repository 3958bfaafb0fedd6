"""The imputation's server steps: each builds its request, validates every reply and reduces.

A step is a pair, as in Flower's strategies: the request is built here, the site's handler
(:mod:`.site`) answers, and the reduction here validates before it reduces. Every exchange
goes through the one server path (:func:`~fedtab.federation.protocol.exchange` /
:func:`~fedtab.federation.protocol.exchange_sums`): errors, refusals and rejected replies are
split off and named, the quorum holds, participation is recorded. The run's options
(``federation.options``) choose between two ways of reducing, once per run:

* **per site** (plain, and robust) — each reply is validated against the agreed schema and
  the site's earlier claims (its columns exactly the declared ones, every count an integer
  within the rows it declared and the same in the counting and statistics steps, statistics
  taken about the server's shift, no negative variance and no correlation outside [-1, 1]
  — checked overflow-safe —, weights of the model's names and shapes, finite and of plausible
  magnitude, validation errors within the declared validation rows), then pooled: summed, or
  with ``robust`` screened against the median site and capped at ``max_site_share``
  (statistics), coordinate-wise median (weights), median site's RMSE (validation);
* **summed** (secure sums and/or DP) — the moments and statistics over the global schema,
  the row-weighted weights and the validation errors travel by the run's summing strategy
  (masked with secure aggregation, noised at the sites under DP); what a site sent in the
  clear is validated (shapes, finiteness, magnitude) and so are the totals. Under DP the
  validation errors are not released (no validation report, no best round), and the robust
  reducers, which need exact per-site values, do not apply.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from fedtab.impute.graph import FeatureGraph, build_feature_graph
from fedtab.impute.stats import STAT_ARRAYS, PooledStats, SiteStats, pool_stats
from fedtab.privacy.accountant import PrivacyLedger
from fedtab.privacy.dp import DP_META, column_bounds, dp_request
from fedtab.privacy.secagg import MOMENT_BITS
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, FederationError, SumSpec, exchange, exchange_sums
from fedtab.federation.protocol.reduce import cap_weights, robust_params, screen_sites, site_median, usable_counts
from fedtab.federation.workflows.imputation.config import ImputeConfig

__all__ = ["Columns", "Evaluation", "Model", "apply_imputation", "centring", "evaluate", "fit_round", "model_inputs",
           "pooled_statistics", "schema_step", "setup_step", "summed_mode", "validation_report", "weight_arrays"]

log = logging.getLogger("fedtab.impute")


def summed_mode(federation: Federation) -> bool:
    """Whether the run's sums travel by the summing strategy (secure sums and/or DP) rather
    than per site."""
    opts = federation.options
    return opts.secure or opts.dp is not None


def weight_arrays(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``w/…`` arrays of a request that carries the model's weights."""
    return {f"w/{k}": v for k, v in weights.items()}


def _dp_meta(meta: dict[str, Any], dp_meta: Mapping[str, Any] | None) -> dict[str, Any]:
    return {**meta, DP_META: dict(dp_meta)} if dp_meta is not None else meta


def _dp_request(federation: Federation, ledger: PrivacyLedger | None, step: str) -> dict[str, Any] | None:
    """The DP settings of ``step``'s requests (its noise multiplier), ``None`` without DP."""
    if ledger is None:
        return None
    return dp_request(federation.options.dp, ledger.multiplier(step))


def _bounded_arrays(reply: Message, shapes: Mapping[str, tuple[int, ...]], noisy: bool) -> None:
    """The summed arrays a site sent in the clear: of ``shapes``, finite, within ``MAX_SUM``
    (masked arrays are checked as a sum)."""
    for name, shape in shapes.items():
        if name in reply.arrays:
            a = validate.array(reply, name, shape)
            if noisy:
                validate.bounded(a, f"noisy {name}")


def _finite_totals(sums: Mapping[str, np.ndarray], sites: list[str]) -> None:
    for name, total in sums.items():
        validate.bounded(total, f"summed {name}")


# ----------------------------------------------------------------------------- 1. schema + counts
@dataclass
class Columns:
    """What the schema step gives the server.

    Attributes:
        site_columns: site -> its feature columns (in its order); columns: the global schema (F).
        count / total / sumsq: ``(F,)`` pooled observed counts, sums and (summed mode) sums of squares.
        site_counts: per site its ``(count, sum)`` over its own columns (per-site mode).
        site_means: ``(sites, F)`` each site's column means (NaN where it has none; summed mode: all NaN).
        scale: ``(F,)`` the pooled spread the summed statistics are taken in (summed mode), else ``None``.
    """

    site_columns: dict[str, list[str]]
    columns: list[str]
    count: np.ndarray
    total: np.ndarray
    sumsq: np.ndarray
    site_counts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    site_means: np.ndarray | None = None
    scale: np.ndarray | None = None


def _counts_checker(federation: Federation, summed: bool, out: dict[str, tuple[list[str], Any, Any]]):
    """Validator of the first ``impute_schema`` replies: the columns are exactly the site's declared
    ones (its target never among them), the row counts the declared ones and, per site, consistent
    moments (kept in ``out``)."""

    def check(s: str, r: Message) -> None:
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
        if summed:  # the moments follow in their own (secure and/or noised) exchange
            out[s] = (list(cols), np.zeros(0), np.zeros(0))
            return
        c_ = validate.counts(validate.array(r, "count", (len(cols),)), n, "column counts")
        total = validate.array(r, "sum", (len(cols),))
        validate.moments(c_, total, validate.array(r, "sumsq", (len(cols),)), "column moments")
        out[s] = (list(cols), c_, total)

    return check


def _summed_moments(federation: Federation, columns: Columns, dp_meta: Mapping[str, Any] | None) -> None:
    """The column moments over the global schema, summed by the run's strategy, into ``columns``."""
    f = len(columns.columns)
    noisy = dp_meta is not None

    def check(s: str, r: Message) -> None:
        if r.meta.get("columns") != columns.site_columns.get(s):
            raise ValueError("moments over different columns than its schema")
        _bounded_arrays(r, {"count": (f,), "sum": (f,), "sumsq": (f,)}, noisy)

    spec = SumSpec({"count": 0 if dp_meta is None else MOMENT_BITS, "sum": MOMENT_BITS, "sumsq": MOMENT_BITS})
    request = Message("impute_schema", meta=_dp_meta({"global": columns.columns}, dp_meta))
    moments = exchange_sums(federation, request, spec, check, check_total=_finite_totals).sums
    cnt, sm, sq = np.rint(moments["count"]), moments["sum"], moments["sumsq"]
    with np.errstate(invalid="ignore", divide="ignore"):
        var = sq / cnt - (sm / cnt) ** 2
    columns.count, columns.total, columns.sumsq = cnt, sm, sq
    columns.scale = np.where(np.isfinite(var) & (var > 1e-12), np.sqrt(np.abs(var)), 1.0)


def schema_step(federation: Federation, ledger: PrivacyLedger | None) -> Columns:
    """Step 1: the sites' columns and row counts (the first exchange of a run also agrees the
    federation's schema), and the pooled column moments.

    Raises:
        FederationError: a site failed or was rejected (naming it), or the sites' schemas
            are disjoint (more than one site and no column held by two).
    """
    summed = summed_mode(federation)
    first: dict[str, tuple[list[str], Any, Any]] = {}
    replies = exchange(federation, Message("impute_schema", meta={"columns_only": True} if summed else {}),
                       _counts_checker(federation, summed, first))
    site_columns: dict[str, list[str]] = {s: first[s][0] for s in replies}
    glob = list(dict.fromkeys(str(c) for s in replies for c in site_columns[s]))
    f = len(glob)
    pos = {c: i for i, c in enumerate(glob)}
    holders = np.zeros(f, dtype=int)
    cnt, sm, sq = np.zeros(f), np.zeros(f), np.zeros(f)
    site_means = np.full((len(replies), f), np.nan)
    for i, s in enumerate(replies):
        idx = [pos[c] for c in site_columns[s]]
        holders[idx] += 1
        if not summed:
            cnt[idx] += first[s][1]
            sm[idx] += first[s][2]
            with np.errstate(invalid="ignore", divide="ignore"):
                site_means[i, idx] = np.where(first[s][1] > 0, first[s][2] / first[s][1], np.nan)
    columns = Columns(site_columns, glob, cnt, sm, sq, site_means=site_means,
                      site_counts={} if summed else {s: (first[s][1], first[s][2]) for s in replies})
    if summed:
        _summed_moments(federation, columns, _dp_request(federation, ledger, "imputation.schema"))
    if len(replies) > 1 and holders.max() < 2:
        raise FederationError(
            "no column is shared by two or more sites: the sites' schemas are disjoint, so nothing links them "
            f"(site columns: { {s: c[:5] for s, c in site_columns.items()} })"
        )
    if ledger is not None:
        ledger.spend("imputation.schema", 3)
        columns.count = usable_counts(columns.count)  # post-processing: noisy counts below 1 are none
    return columns


def centring(federation: Federation, columns: Columns) -> np.ndarray:
    """``(F,)`` the shift the statistics are taken about: the pooled mean; robust: the median
    site's mean where there is one; DP: within the public bounds (their middle where the noisy
    count is below 1).

    Raises:
        FederationError: (without DP) a column with no observed value.
    """
    opts = federation.options
    cnt, sm = columns.count, columns.total
    if np.any(cnt == 0) and opts.dp is None:
        raise FederationError(f"columns without any observed value: "
                              f"{[columns.columns[i] for i in np.flatnonzero(cnt == 0)][:8]}")
    shift = np.divide(sm, cnt, out=np.zeros_like(sm), where=cnt > 0)
    if opts.robust and not summed_mode(federation):  # the median site's mean: claimed sums cannot move it
        median = site_median(columns.site_means)
        shift = np.where(np.isnan(median), shift, median)
    if opts.dp is not None:
        lo, hi = column_bounds(opts.dp, columns.columns)
        shift = np.clip(np.where(cnt > 0, shift, 0.5 * (lo + hi)), lo, hi)
    return shift


# ----------------------------------------------------------------------------- 2. statistics
def _stats_checker(federation: Federation, columns: Columns, shift: np.ndarray, out: dict[str, SiteStats]):
    """Validator of per-site ``impute_stats`` replies (see the module docstring); keeps them in ``out``."""
    pos = {c: i for i, c in enumerate(columns.columns)}

    def check(s: str, r: Message) -> None:
        cols = columns.site_columns[s]
        if r.meta.get("columns") != cols:
            raise ValueError("statistics are over different columns than its schema")
        n = len(cols)
        arrays = {k: validate.array(r, k, (n,) if k in ("count", "sum", "sumsq", "shift") else (n, n))
                  for k in STAT_ARRAYS + ("shift",)}
        if not np.array_equal(arrays["shift"], shift[[pos[c] for c in cols]]):
            raise ValueError("statistics are not taken about the shift the server sent")
        if not np.array_equal(arrays["count"], columns.site_counts[s][0]):
            raise ValueError("column counts differ from the ones it sent in the counting step")
        validate.counts(arrays["pair_count"], federation.schema.rows(s, "train"), "pair counts")
        validate.pair_statistics(arrays["count"], arrays["sum"], arrays["sumsq"], arrays["pair_count"],
                                 arrays["pair_sx"], arrays["pair_sxx"], arrays["pair_sxy"])
        st = SiteStats(columns=cols, **arrays)
        st.validate()
        out[s] = st

    return check


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


def _repaired(st: SiteStats) -> SiteStats:
    """Post-processing of noisy statistics into consistent ones: counts and sums of
    squares floored at 0, symmetric co-observed counts whose diagonal is the count."""
    count = np.maximum(np.rint(st.count), 0.0)
    pc = np.maximum(np.rint(0.5 * (st.pair_count + st.pair_count.T)), 0.0)
    np.fill_diagonal(pc, count)
    return SiteStats(columns=st.columns, shift=st.shift, count=count, sum=st.sum, sumsq=np.maximum(st.sumsq, 0.0),
                     pair_count=pc, pair_sx=st.pair_sx, pair_sxx=np.maximum(st.pair_sxx, 0.0),
                     pair_sxy=0.5 * (st.pair_sxy + st.pair_sxy.T))


def _summed_pooled(federation: Federation, columns: Columns, shift: np.ndarray,
                   dp_meta: Mapping[str, Any] | None) -> PooledStats:
    """The sites' statistics of ``(x - shift) / scale`` over the global schema, summed by the run's
    strategy (secure and/or noised at the sites) and pooled; mean and std in data units.

    Raises:
        FederationError: a site failed, or the summed statistics are inconsistent.
    """
    glob, scale = columns.columns, columns.scale
    f = len(glob)
    shapes = {k: (f,) if k in ("count", "sum", "sumsq") else (f, f) for k in STAT_ARRAYS}
    request = Message("impute_stats", {"shift": shift, "scale": scale}, _dp_meta({"columns": glob, "global": True},
                                                                                dp_meta))
    spec = SumSpec({k: (0 if k in ("count", "pair_count") and dp_meta is None else None) for k in STAT_ARRAYS})
    sums = exchange_sums(federation, request, spec, lambda s, r: _bounded_arrays(r, shapes, dp_meta is not None),
                         check_total=_finite_totals).sums
    for k in ("count", "pair_count"):
        sums[k] = np.rint(sums[k])
    stats = SiteStats(columns=list(glob), shift=np.zeros(f), **sums)
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


def pooled_statistics(federation: Federation, columns: Columns, shift: np.ndarray, ledger: PrivacyLedger | None
                      ) -> tuple[PooledStats, dict[str, str]]:
    """Step 2: ``(pooled statistics, left out)`` — the exact pooled correlations, mean and std
    (robust: screened and capped per-site statistics, ``left out`` names the sites screened out;
    DP: the noisy moments post-processed back within the public bounds).

    Raises:
        FederationError: a site failed or was rejected (naming it), or pooling failed.
    """
    opts = federation.options
    glob = columns.columns
    left_out: dict[str, str] = {}
    if summed_mode(federation):
        pooled = _summed_pooled(federation, columns, shift, _dp_request(federation, ledger, "imputation.stats"))
    else:
        site_stats_: dict[str, SiteStats] = {}
        replies = exchange(federation, Message("impute_stats", {"shift": shift}, {"columns": glob}),
                           _stats_checker(federation, columns, shift, site_stats_))
        stats = {s: site_stats_[s] for s in replies}
        try:
            if opts.robust:
                pooled, left_out = _robust_pool(stats, glob, opts.max_site_share)
            else:
                pooled = pool_stats(list(stats.values()), glob)
        except ValueError as exc:
            raise FederationError(f"pooling statistics failed: {exc}") from None
    if ledger is not None:
        ledger.spend("imputation.stats", len(STAT_ARRAYS))
        lo, hi = column_bounds(opts.dp, glob)  # post-processing: noisy moments back within the public bounds
        pooled.mean = np.clip(np.nan_to_num(pooled.mean, nan=0.5 * (lo + hi)), lo, hi)
        pooled.std = np.clip(np.nan_to_num(pooled.std, nan=1.0), 1e-6, np.maximum(hi - lo, 1e-6))
    return pooled, left_out


# ----------------------------------------------------------------------------- 3. setup
@dataclass
class Model:
    """What the sites build their imputer from: the feature graph, the linear prior (``None``:
    none), the global mean/std (std 1 for constant columns) and the network's config."""

    graph: FeatureGraph
    prior: Any
    mean: np.ndarray
    std: np.ndarray
    config: Any
    unobserved_pairs: int = 0


def model_inputs(cfg: ImputeConfig, pooled: PooledStats, glob: list[str]) -> Model:
    """The feature graph, the linear prior and the GNN's config from the pooled statistics (no exchange)."""
    from fedtab.impute.model import GNNConfig

    f = len(glob)
    mean = pooled.mean
    std = np.where(np.isfinite(pooled.std) & (pooled.std > 1e-12), pooled.std, 1.0)
    graph = build_feature_graph(pooled.corr, glob, k=cfg.k_neighbors, min_abs_corr=cfg.min_abs_corr)
    unobserved = pooled.unobserved_pairs()
    log.info("feature graph: %d nodes, %d edges; %d column pairs never observed together", f, graph.n_edges, unobserved)
    prior = None
    if cfg.use_prior and f > 1:
        from fedtab.impute.prior import fit_factor_prior

        prior = fit_factor_prior(pooled.corr, pooled.pair_count, rank=cfg.prior_rank, max_rank=cfg.prior_max_rank)
        log.info("linear prior: rank %d", prior.rank)
        if prior.rank == 0:
            prior = None
    mcfg = GNNConfig(n_features=f, hidden_dim=cfg.hidden_dim, n_layers=cfg.n_layers, dropout=cfg.dropout,
                     block_unavailable=cfg.block_unavailable, prior_rank=prior.rank if prior is not None else 0)
    return Model(graph, prior, mean, std, mcfg, unobserved)


def setup_step(federation: Federation, cfg: ImputeConfig, glob: list[str], model: Model) -> dict[str, int]:
    """Step 3: every site builds the model; returns ``{site: training rows}``.

    Raises:
        FederationError: a site failed, refused or replied other row counts than it declared.
    """
    g = model.graph
    arrays = {"edge_index": g.edge_index, "weight": g.weight, "sign": g.sign, "mean": model.mean, "std": model.std}
    if model.prior is not None:
        arrays.update(prior_W=model.prior.W, prior_psi=model.prior.psi)
    setup = Message("impute_setup", arrays, {"columns": glob, "config": asdict(cfg), "model": model.config.to_dict()})

    def check(s: str, r: Message) -> None:
        assert federation.schema is not None
        validate.integer(r.meta.get("n_train"), "training rows", equal=federation.schema.rows(s, "train"))
        validate.integer(r.meta.get("n_valid"), "validation rows", equal=federation.schema.rows(s, "test"))

    replies = exchange(federation, setup, check)
    return {s: int(r.meta["n_train"]) for s, r in replies.items()}


# ----------------------------------------------------------------------------- 4. FedAvg rounds
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


def _summed_fit_round(federation: Federation, weights: dict[str, np.ndarray], rnd: int, f: int,
                      shapes: Mapping[str, tuple], dp_meta: Mapping[str, Any] | None,
                      ) -> tuple[dict[str, np.ndarray], float | None, None]:
    """One FedAvg round by the run's strategy: ``(new weights, validation RMSE or None, None)``
    from the sums of the row-weighted weights (losses are not released)."""
    names = [f"w/{k}" for k in shapes]
    noisy = dp_meta is not None

    def check(s: str, r: Message) -> None:
        got = {k[2:]: v for k, v in r.arrays.items() if k.startswith("w/")}
        if got:  # in the clear (DP without secure sums): names and shapes; noisy, so no magnitude bound
            validate.parameters(got, shapes, max_abs=np.inf, what="array 'w/…'")
        _bounded_arrays(r, {"val_sse": (f,), "val_count": (f,)}, noisy)

    request = Message("impute_fit", weight_arrays(weights), _dp_meta({"round": rnd}, dp_meta))
    spec = SumSpec({**{n: None for n in names}, "val_sse": None, "val_count": 0 if dp_meta is None else None},
                   weighted=tuple(names), weight="n_train", drop_meta=("loss", "steps"))
    summed = exchange_sums(federation, request, spec, check, check_total=_finite_totals)
    sums, n = summed.sums, summed.weight
    if n is None or not n > 0:
        raise FederationError(f"round {rnd}: the summed row count is not positive")
    new = {k: (sums[f"w/{k}"] / n).astype(weights[k].dtype) for k in shapes}
    cnt = float(np.sum(sums["val_count"]))
    val = float(np.sqrt(max(float(np.sum(sums["val_sse"])), 0.0) / cnt)) if cnt > 0 else None
    return new, val, None


def fit_round(federation: Federation, weights: dict[str, np.ndarray], rnd: int, site_rows: Mapping[str, int],
              f: int, *, max_param_abs: float, dp_fit: Mapping[str, Any] | None = None,
              ) -> tuple[dict[str, np.ndarray], float | None, float | None]:
    """Step 4, one round: ``(new weights, validation RMSE of the weights sent, mean training loss)``.

    Per site: FedAvg by training rows (robust: the coordinate-wise median of the weights, the
    median site's RMSE). Summed: the sums of the row-weighted weights (no per-site losses).

    Raises:
        FederationError: a site failed or sent weights or errors that fail validation (naming it).
    """
    from fedtab.impute.train import fedavg

    shapes = {k: v.shape for k, v in weights.items()}
    if summed_mode(federation):
        return _summed_fit_round(federation, weights, rnd, f, shapes, dp_fit)
    robust = federation.options.robust
    fitted: dict[str, tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}

    def check(s: str, r: Message) -> None:
        validate.integer(r.meta.get("n_train"), "training rows", equal=site_rows[s])
        loss = r.meta.get("loss")
        if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
            raise ValueError("loss must be a number or null")
        w = validate.parameters({k[2:]: v for k, v in r.arrays.items() if k.startswith("w/")}, shapes,
                                max_abs=max_param_abs, what="array 'w/…'")
        fitted[s] = (w, _error_arrays(federation, s, r, f))

    replies = exchange(federation, Message("impute_fit", weight_arrays(weights), {"round": rnd}), check)
    new, sizes, losses = [], [], []
    for s, r in replies.items():
        new.append(fitted[s][0])
        sizes.append(site_rows[s])
        loss = r.meta.get("loss")
        if loss is not None:
            losses.append((float(loss), site_rows[s]))
    val = _error_totals({s: fitted[s][1] for s in replies}, robust)
    averaged = robust_params(new) if robust else fedavg(new, sizes)
    train_loss = sum(l * n for l, n in losses) / sum(n for _, n in losses) if losses else None
    return averaged, val, train_loss


# ----------------------------------------------------------------------------- 5. evaluation
@dataclass
class Evaluation:
    """The validation errors of one model: per site ``(sse, count)`` (empty when summed), per
    column summed squared errors and cell counts, the overall RMSE (``None``: no validation
    cells, or not released) and the mean-fill baseline's squared errors (``None``: unknown)."""

    per_site: dict[str, tuple[np.ndarray, np.ndarray]]
    col_sse: np.ndarray
    col_cnt: np.ndarray
    overall: float | None
    mean_sse: np.ndarray | None = None


def _summed_evaluation(federation: Federation, weights: Mapping[str, np.ndarray], f: int) -> Evaluation:
    shapes = {"val_sse": (f,), "val_count": (f,), "val_mean_sse": (f,)}
    summed = exchange_sums(federation, Message("impute_eval", weight_arrays(weights)),
                           SumSpec({"val_sse": None, "val_count": 0, "val_mean_sse": None}),
                           lambda s, r: _bounded_arrays(r, shapes, False), check_total=_finite_totals)
    sums = summed.sums
    sse, cnt = np.maximum(sums["val_sse"], 0.0), np.rint(sums["val_count"])
    return Evaluation({}, sse, cnt, (float(np.sqrt(sse.sum() / cnt.sum())) if cnt.sum() > 0 else None),
                      np.maximum(sums["val_mean_sse"], 0.0))


def evaluate(federation: Federation, weights: Mapping[str, np.ndarray], f: int) -> Evaluation:
    """Step 5: the validation errors of ``weights`` (and of mean fill) on the sites' validation
    cells. Under DP they are not released: no exchange, an empty evaluation.

    Raises:
        FederationError: a site failed or sent errors that fail validation (naming it).
    """
    if federation.options.dp is not None:
        return Evaluation({}, np.zeros(f), np.zeros(f), None, None)
    if summed_mode(federation):
        return _summed_evaluation(federation, weights, f)
    errors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    mean_fill: dict[str, np.ndarray] = {}  # the mean-fill baseline's error sums, when every site sends them

    def check(s: str, r: Message) -> None:
        errors[s] = _error_arrays(federation, s, r, f)
        if "val_mean_sse" in r.arrays:
            m = validate.array(r, "val_mean_sse", (f,))
            if np.any(m < 0):
                raise ValueError("negative mean-fill errors")
            mean_fill[s] = m

    got = exchange(federation, Message("impute_eval", weight_arrays(weights)), check)
    per = {s: errors[s] for s in got}
    mean_sse = sum(mean_fill[s] for s in got) if set(mean_fill) >= set(got) else None
    return Evaluation(per, sum(v[0] for v in per.values()), sum(v[1] for v in per.values()),
                      _error_totals(per, federation.options.robust), mean_sse)


def validation_report(glob: list[str], ev: Evaluation) -> dict[str, Any]:
    """``ImputationResult.validation`` of an evaluation: overall, per-site and per-column z-space
    RMSE, and the mean-fill baseline's per column when known."""
    f = len(glob)
    col_sse, col_cnt = ev.col_sse, ev.col_cnt
    validation = {
        "overall": ev.overall,
        "per_site": {s: (float(np.sqrt(v[0].sum() / v[1].sum())) if v[1].sum() > 0 else None)
                     for s, v in ev.per_site.items()},
        "per_column": {glob[i]: (float(np.sqrt(col_sse[i] / col_cnt[i])) if col_cnt[i] > 0 else None)
                       for i in range(f)},
    }
    if ev.mean_sse is not None:
        validation["per_column_mean_fill"] = {
            glob[i]: (float(np.sqrt(ev.mean_sse[i] / col_cnt[i])) if col_cnt[i] > 0 else None) for i in range(f)}
    return validation


# ----------------------------------------------------------------------------- 6. apply
def apply_imputation(federation: Federation, result: Any, low: np.ndarray, high: np.ndarray,
                     integer: np.ndarray, levels: dict[int, list[float]] | None = None,
                     groups: list[list[int]] | None = None) -> dict[str, dict[str, int]]:
    """Let every site fill its table with the imputer of ``result`` (one exchange).

    Args:
        result: an :class:`~fedtab.federation.workflows.imputation.ImputationResult`.
        low, high: ``(F,)`` the pooled observed range of each column of ``result.columns``;
            imputed values are clipped into it. integer: ``(F,)`` bool, columns rounded.
        levels, groups: the agreed value sets of integer-coded columns and the indicator
            columns of each categorical column, by column index
            (:func:`fedtab.impute.fill.fill_from_predictions`).

    Returns:
        ``{site: {"imputed": cells, "clipped": cells}}`` of the sites that filled their table.

    Raises:
        FederationError: a site failed or replied counts that are not non-negative integers
            (naming it; under a quorum it is dropped instead while enough sites remain).
        ValueError: arrays whose shapes do not match ``result.columns``.
    """
    f = len(result.columns)
    arrays = {"low": np.asarray(low, np.float64), "high": np.asarray(high, np.float64),
              "integer": np.asarray(integer, dtype=bool)}
    if any(a.shape != (f,) for a in arrays.values()):
        raise ValueError(f"apply_imputation: low/high/integer must have shape ({f},)")

    def check(s: str, r: Message) -> None:
        counts = {k: r.meta.get(k) for k in ("imputed", "clipped")}
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts.values()):
            raise ValueError(f"invalid imputation counts {counts}")

    meta = {"levels": {str(j): [float(x) for x in v] for j, v in (levels or {}).items()},
            "groups": [[int(j) for j in g] for g in groups or ()]}
    replies = exchange(federation, Message("impute_apply", {**weight_arrays(result.weights), **arrays}, meta), check)
    out = {s: {k: int(r.meta[k]) for k in ("imputed", "clipped")} for s, r in replies.items()}
    if getattr(federation, "schema", None) is not None:
        federation.schema = None  # the tables gained columns: the next exchange declares them again
    return out
