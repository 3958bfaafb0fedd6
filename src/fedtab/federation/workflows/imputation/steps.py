"""The imputation's server steps: each builds its request, validates every reply and reduces.

A step is a configure/aggregate pair (:class:`~fedtab.federation.protocol.modes.SumStep`), as
in Flower's strategies: the request is built here, the site's handler (:mod:`.site`) answers,
and the reduction here validates before it reduces. No step tests the run's modes: each
declares its forms and the run's strategy
(:func:`~fedtab.federation.protocol.modes.run_strategy`) picks one:

* the **per-site** form (plain; with ``robust`` its robust reduction) — each reply is validated
  against the agreed schema and the site's earlier claims (its columns exactly the declared
  ones, every count an integer within the rows it declared and the same in the counting and
  statistics steps, statistics taken about the server's shift, no negative variance and no
  correlation outside [-1, 1] — checked overflow-safe —, weights of the model's names and
  shapes, finite and of plausible magnitude, validation errors within the declared validation
  rows), then pooled: summed, or robust: screened against the median site and capped at
  ``max_site_share`` (statistics), coordinate-wise median (weights), median site's RMSE
  (validation);
* the **summed** form (:attr:`SumStep.summed`: secure sums and/or DP) — the moments and
  statistics over the global schema, the row-weighted weights and the validation errors
  travel by the run's summing strategy (masked with secure aggregation); what a site sent in
  the clear is validated (shapes, finiteness) and so are the totals;
* its **DP release** (:attr:`SumStep.noisy`) — the summed form noised at the sites, paid from
  the run's accountant before the request goes out, the replies bounded as noisy values and
  post-processed (counts below 1 are none, moments back within the public bounds). The
  validation errors are not released under DP (no exchange: no validation report, no best
  round), and the robust reducers, which need exact per-site values, reduce the sums as they are.

Every exchange goes through the one server path (:func:`~fedtab.federation.protocol.exchange`
for a per-site form, :func:`~fedtab.federation.protocol.exchange_sums` for a summed one):
errors, refusals and rejected replies are split off and named, the quorum holds,
participation is recorded.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping, TypeVar

import numpy as np

from fedtab.impute.graph import FeatureGraph, build_feature_graph
from fedtab.impute.stats import STAT_ARRAYS, PooledStats, SiteStats, pool_stats
from fedtab.privacy.accountant import PrivacyLedger
from fedtab.privacy.dp import column_bounds
from fedtab.privacy.secagg import MOMENT_BITS
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation, FederationError, Summed, SumSpec, exchange, exchange_sums
from fedtab.federation.protocol.modes import (BaseSums, NoisyRelease, Reduction, RunStrategy, SumStep, declare_modes,
                                              run_strategy)
from fedtab.federation.protocol.reduce import cap_weights, robust_params, screen_sites, site_median, usable_counts
from fedtab.federation.workflows.imputation.config import ImputeConfig
from fedtab.federation.workflows.imputation.site import DP_STEPS_PER_ROUND

__all__ = ["Columns", "Evaluation", "Model", "apply_imputation", "centred_on", "centring", "columns_step", "evaluate",
           "evaluate_step", "fit_round", "fit_step", "model_inputs", "moments_step", "moments_with_statistics",
           "pooled_statistics",
           "schema_step", "setup_step", "statistics_step", "strategy", "validation_report", "weight_arrays",
           "IMPUTATION_MODES"]

log = logging.getLogger("fedtab.impute")
R = TypeVar("R")

#: the modes the imputation supports (robust with secure sums is refused by the run's options)
IMPUTATION_MODES = declare_modes("imputation", "secure", "dp", "robust")


class _Exchanges(BaseSums):
    """The imputation's base layer: a per-site form (nothing summed) by the one server path, a
    summed form by the run's summing strategy with its totals checked (finite, within ``MAX_SUM``)."""

    def exchange(self, federation: Federation, step: SumStep[Any], *, on_error: str | None = None) -> Summed:
        if not step.spec.fields:
            replies = exchange(federation, step.request, step.check, on_error=on_error)
            return Summed({}, None, dict(replies), list(replies))
        return exchange_sums(federation, step.request, step.spec, step.check, check_total=_finite_totals,
                             on_error=on_error)


def strategy(federation: Federation, ledger: PrivacyLedger | None = None) -> RunStrategy:
    """The run's strategy for the imputation's steps (``ledger``: the run's accountant under DP)."""
    return run_strategy(federation, ledger, base=_Exchanges(federation.summing))


def weight_arrays(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``w/…`` arrays of a request that carries the model's weights."""
    return {f"w/{k}": v for k, v in weights.items()}


def _as_robust(aggregate: Callable[[Summed], R]) -> Callable[[Summed], tuple[R, dict[str, str]]]:
    """A robust reduction that is ``aggregate`` (no site left out): the summed forms' per-site
    values are unknown, a robust reducer has nothing to screen."""
    return lambda summed: (aggregate(summed), {})


def _clear_arrays(shapes: Mapping[str, tuple[int, ...]], bound: bool = False) -> Callable[[str, Message], None]:
    """Check of the summed arrays a site sent in the clear: of ``shapes``, finite and (``bound``:
    noisy values) within ``MAX_SUM``; masked arrays are absent, checked as a sum."""

    def check(site: str, reply: Message) -> None:
        for name, shape in shapes.items():
            if name in reply.arrays:
                a = validate.array(reply, name, shape)
                if bound:
                    validate.bounded(a, f"noisy {name}")

    return check


def _finite_totals(sums: Mapping[str, np.ndarray], sites: list[str]) -> None:
    for name, total in sums.items():
        validate.bounded(total, f"summed {name}")


# ----------------------------------------------------------------------------- 1. schema + counts
@dataclass
class Columns:
    """What the schema step gives the server.

    Attributes:
        site_columns: site -> its feature columns (in its order); columns: the global schema (F).
        count / total / sumsq: ``(F,)`` pooled observed counts, sums and (summed form) sums of squares.
        site_counts: per site its ``(count, sum)`` over its own columns (per-site form).
        site_means: ``(sites, F)`` each site's column means (NaN where it has none; summed form: all NaN).
        scale: ``(F,)`` the pooled spread the summed statistics are taken in (summed form), else ``None``.
        moments_follow: the summed form's moments are not known yet: they follow in their own
            summed exchange (:func:`moments_step`).
    """

    site_columns: dict[str, list[str]]
    columns: list[str]
    count: np.ndarray
    total: np.ndarray
    sumsq: np.ndarray
    site_counts: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    site_means: np.ndarray | None = None
    scale: np.ndarray | None = None
    moments_follow: bool = False


def _declared_columns(federation: Federation, s: str, r: Message) -> tuple[list[str], int]:
    """``(columns, training rows)`` of one ``impute_schema`` reply: the columns exactly the site's
    declared ones (its target never among them), the row counts the declared ones."""
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
    return list(cols), n


def _global_schema(site_columns: Mapping[str, list[str]]) -> tuple[list[str], np.ndarray]:
    """The global schema (the ordered union of the sites' columns) and how many sites hold each column.

    Raises:
        FederationError: more than one site and no column held by two (disjoint schemas).
    """
    glob = list(dict.fromkeys(str(c) for cols in site_columns.values() for c in cols))
    pos = {c: i for i, c in enumerate(glob)}
    holders = np.zeros(len(glob), dtype=int)
    for cols in site_columns.values():
        holders[[pos[c] for c in cols]] += 1
    if len(site_columns) > 1 and holders.max() < 2:
        raise FederationError(
            "no column is shared by two or more sites: the sites' schemas are disjoint, so nothing links them "
            f"(site columns: { {s: c[:5] for s, c in site_columns.items()} })"
        )
    return glob, holders


def _observed(columns: Columns) -> Columns:
    """``columns`` when every column has an observed value.

    Raises:
        FederationError: a column with no observed value (exact counts only: noisy ones may be 0).
    """
    cnt = columns.count
    if np.any(cnt == 0):
        raise FederationError(f"columns without any observed value: "
                              f"{[columns.columns[i] for i in np.flatnonzero(cnt == 0)][:8]}")
    return columns


def columns_step(federation: Federation) -> SumStep[Columns]:
    """The sites' columns and row counts (the first exchange of a run also agrees the federation's
    schema). Per site: with each site's column counts and sums (checked: counts within its rows,
    consistent moments), pooled; summed form: columns and rows only, the moments follow
    (:func:`moments_step`); it releases no noised number under DP."""
    first: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    names: dict[str, list[str]] = {}

    def check_names(s: str, r: Message) -> int:
        names[s], n = _declared_columns(federation, s, r)
        return n

    def check_counts(s: str, r: Message) -> None:
        n, f = check_names(s, r), len(names[s])
        c_ = validate.counts(validate.array(r, "count", (f,)), n, "column counts")
        total = validate.array(r, "sum", (f,))
        validate.moments(c_, total, validate.array(r, "sumsq", (f,)), "column moments")
        first[s] = (c_, total)

    def per_site(summed: Summed) -> Columns:
        site_columns = {s: names[s] for s in summed.replies}
        glob, _ = _global_schema(site_columns)
        f, pos = len(glob), {c: i for i, c in enumerate(glob)}
        cnt, sm = np.zeros(f), np.zeros(f)
        site_means = np.full((len(site_columns), f), np.nan)
        for i, (s, cols) in enumerate(site_columns.items()):
            idx = [pos[c] for c in cols]
            cnt[idx] += first[s][0]
            sm[idx] += first[s][1]
            with np.errstate(invalid="ignore", divide="ignore"):
                site_means[i, idx] = np.where(first[s][0] > 0, first[s][1] / first[s][0], np.nan)
        return _observed(Columns(site_columns, glob, cnt, sm, np.zeros(f), site_means=site_means,
                                 site_counts={s: first[s] for s in site_columns}))

    def columns_only(summed: Summed) -> Columns:
        site_columns = {s: names[s] for s in summed.replies}
        glob, _ = _global_schema(site_columns)
        f = len(glob)
        return Columns(site_columns, glob, np.zeros(f), np.zeros(f), np.zeros(f),
                       site_means=np.full((len(site_columns), f), np.nan), moments_follow=True)

    summed = SumStep(Message("impute_schema", meta={"columns_only": True}), SumSpec({}), check_names, columns_only,
                     _as_robust(columns_only))
    summed.noisy = NoisyRelease(replace(summed), None)  # names and row counts: nothing noised
    return SumStep(Message("impute_schema"), SumSpec({}), check_counts, per_site, _as_robust(per_site),
                   summed=summed)


def moments_step(federation: Federation, columns: Columns) -> SumStep[Columns]:
    """The summed form's column moments over the global schema, summed by the run's strategy,
    into ``columns`` (with the pooled spread ``scale``); DP: three releases of
    ``"imputation.schema"``, noisy counts below 1 none."""
    f = len(columns.columns)
    shapes = {"count": (f,), "sum": (f,), "sumsq": (f,)}

    def form(count_bits: int | None, bound: bool, aggregate: Callable[[Summed], Columns]) -> SumStep[Columns]:
        clear = _clear_arrays(shapes, bound)

        def check(s: str, r: Message) -> None:
            if r.meta.get("columns") != columns.site_columns.get(s):
                raise ValueError("moments over different columns than its schema")
            clear(s, r)

        spec = SumSpec({"count": count_bits, "sum": MOMENT_BITS, "sumsq": MOMENT_BITS})
        return SumStep(Message("impute_schema", meta={"global": columns.columns}), spec, check, aggregate,
                       _as_robust(aggregate))

    def moments(summed: Summed) -> Columns:
        cnt, sm, sq = np.rint(summed.sums["count"]), summed.sums["sum"], summed.sums["sumsq"]
        with np.errstate(invalid="ignore", divide="ignore"):
            var = sq / cnt - (sm / cnt) ** 2
        columns.count, columns.total, columns.sumsq = cnt, sm, sq
        columns.scale = np.where(np.isfinite(var) & (var > 1e-12), np.sqrt(np.abs(var)), 1.0)
        columns.moments_follow = False
        return columns

    def noisy(summed: Summed) -> Columns:
        out = moments(summed)
        out.count = usable_counts(out.count)  # post-processing: noisy counts below 1 are none
        return out

    step = form(0, False, lambda summed: _observed(moments(summed)))
    step.noisy = NoisyRelease(form(None, True, noisy), "imputation.schema", 3)
    return step


def schema_step(federation: Federation, ledger: PrivacyLedger | None) -> Columns:
    """Step 1: the sites' columns and row counts (:func:`columns_step`) and the pooled column
    moments (with them per site; summed form: :func:`moments_step`).

    Raises:
        FederationError: a site failed or was rejected (naming it), the sites' schemas are
            disjoint (more than one site and no column held by two), or (exact counts) a
            column has no observed value.
    """
    run = strategy(federation, ledger)
    columns = run.run(federation, columns_step(federation)).result
    if columns.moments_follow:
        columns = run.run(federation, moments_step(federation, columns)).result
    return columns


def centring(federation: Federation, columns: Columns) -> np.ndarray:
    """``(F,)`` the shift the statistics are taken about: the pooled mean; robust: the median
    site's mean where there is one (none in the summed form); DP: within the public bounds
    (their middle where the noisy count is below 1)."""
    cnt, sm = columns.count, columns.total

    def pooled() -> np.ndarray:
        return np.divide(sm, cnt, out=np.zeros_like(sm), where=cnt > 0)

    def median_site() -> tuple[np.ndarray, dict[str, str]]:  # claimed sums cannot move it
        median = site_median(columns.site_means)
        return np.where(np.isnan(median), pooled(), median), {}

    def bounded(shift: np.ndarray, dp: Mapping[str, Any]) -> np.ndarray:
        lo, hi = column_bounds(dp, columns.columns)
        return np.clip(np.where(cnt > 0, shift, 0.5 * (lo + hi)), lo, hi)

    return strategy(federation).reduce(Reduction(pooled, median_site, bounded)).result


# ----------------------------------------------------------------------------- 2. statistics
def _stats_checker(federation: Federation, columns: Columns, shift: np.ndarray, out: dict[str, SiteStats],
                   pos: Mapping[str, int] | None = None):
    """Validator of per-site ``impute_stats`` replies (see the module docstring); keeps them in ``out``
    (``pos``: column -> index into ``shift``; default: ``columns.columns``' order)."""
    pos = {c: i for i, c in enumerate(columns.columns)} if pos is None else pos

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


def _pooled(pool: Callable[[], R]) -> R:
    try:
        return pool()
    except ValueError as exc:
        raise FederationError(f"pooling statistics failed: {exc}") from None


def _summed_pooled(summed: Summed, columns: Columns, shift: np.ndarray, repair: bool) -> PooledStats:
    """The summed statistics of ``(x - shift) / scale`` over the global schema pooled; mean and std
    in data units (``repair``: noisy sums made consistent first, :func:`_repaired`).

    Raises:
        FederationError: the summed statistics are inconsistent.
    """
    glob, scale = columns.columns, columns.scale
    sums = dict(summed.sums)
    for k in ("count", "pair_count"):
        sums[k] = np.rint(sums[k])
    stats = SiteStats(columns=list(glob), shift=np.zeros(len(glob)), **sums)
    if repair:
        stats = _repaired(stats)
    try:
        stats.validate()
        pooled = pool_stats([stats], glob)
    except ValueError as exc:
        raise FederationError(f"the summed statistics are invalid: {exc}") from None
    pooled.mean = shift + scale * pooled.mean
    pooled.std = scale * pooled.std
    return pooled


def statistics_step(federation: Federation, columns: Columns, shift: np.ndarray) -> SumStep[PooledStats]:
    """Step 2's pair: the pooled statistics (a robust run's left-out sites in its measurements). Per site: each site's statistics over its
    own columns about ``shift``, pooled (robust: screened and capped, :func:`_robust_pool`).
    Summed form: the statistics of ``(x - shift) / scale`` over the global schema; DP: one
    release of ``"imputation.stats"`` per statistics array, the noisy moments post-processed
    back within the public bounds."""
    glob = columns.columns
    f = len(glob)
    shapes = {k: (f,) if k in ("count", "sum", "sumsq") else (f, f) for k in STAT_ARRAYS}
    site_stats_: dict[str, SiteStats] = {}
    # the summed form's values in units of the pooled spread (known once the summed moments are)
    scaled = {"shift": shift, **({} if columns.scale is None else {"scale": columns.scale})}

    def per_site(summed: Summed) -> PooledStats:
        return _pooled(lambda: pool_stats([site_stats_[s] for s in summed.replies], glob))

    def robust(summed: Summed) -> tuple[PooledStats, dict[str, str]]:
        stats = {s: site_stats_[s] for s in summed.replies}
        return _pooled(lambda: _robust_pool(stats, glob, federation.options.max_site_share))

    def form(count_bits: int | None, bound: bool, aggregate: Callable[[Summed], PooledStats]) -> SumStep[PooledStats]:
        request = Message("impute_stats", scaled, {"columns": glob, "global": True})
        spec = SumSpec({k: (count_bits if k in ("count", "pair_count") else None) for k in STAT_ARRAYS})
        return SumStep(request, spec, _clear_arrays(shapes, bound), aggregate, _as_robust(aggregate))

    def within_bounds(summed: Summed) -> PooledStats:
        pooled = _summed_pooled(summed, columns, shift, repair=True)
        lo, hi = column_bounds(federation.options.dp, glob)  # post-processing: back within the public bounds
        pooled.mean = np.clip(np.nan_to_num(pooled.mean, nan=0.5 * (lo + hi)), lo, hi)
        pooled.std = np.clip(np.nan_to_num(pooled.std, nan=1.0), 1e-6, np.maximum(hi - lo, 1e-6))
        return pooled

    summed = form(0, False, lambda s: _summed_pooled(s, columns, shift, repair=False))
    summed.noisy = NoisyRelease(form(None, True, within_bounds), "imputation.stats", len(STAT_ARRAYS))
    return SumStep(Message("impute_stats", {"shift": shift}, {"columns": glob}), SumSpec({}),
                   _stats_checker(federation, columns, shift, site_stats_), per_site, robust, summed=summed)


def pooled_statistics(federation: Federation, columns: Columns, shift: np.ndarray, ledger: PrivacyLedger | None
                      ) -> tuple[PooledStats, dict[str, str]]:
    """Step 2: ``(pooled statistics, left out)`` on the run's strategy (:func:`statistics_step`);
    ``left out`` names the sites a robust run screened out.

    Raises:
        FederationError: a site failed or was rejected (naming it), or pooling failed.
    """
    out = strategy(federation, ledger).run(federation, statistics_step(federation, columns, shift))
    return out.result, dict(out.measurements.left_out)


def centred_on(federation: Federation, centre: Mapping[str, float] | None) -> np.ndarray | None:
    """The public per-column centre as an ``(F,)`` array over ``list(centre)`` when the column moments
    may ride on the statistics' exchange (:func:`moments_with_statistics`), else ``None``: only in a
    plain run (:func:`~fedtab.federation.protocol.riders.plain_run`) whose schema is agreed (the
    riding moments are checked against it) and whose every site's columns have a finite centre."""
    from fedtab.federation.protocol.riders import plain_run

    if not centre or federation.schema is None or not plain_run(federation):
        return None
    shift = np.array([float(centre[c]) for c in centre], dtype=np.float64)
    if not np.all(np.isfinite(shift)):
        return None
    held = set(centre)
    if any(not set(federation.schema.site_columns(s)) <= held for s in federation.active):
        return None
    return shift


def moments_with_statistics(federation: Federation, centre: Mapping[str, float], shift: np.ndarray
                            ) -> tuple[Columns, PooledStats]:
    """Steps 1 and 2 in one exchange (a plain run, :func:`centred_on`): the statistics taken about a
    *public* centre (``shift``, ``(F,)`` over ``list(centre)``: the job profile's coarse ranges'
    midpoints) as the primary request, the column moments (:func:`columns_step`, per-site form)
    riding on it (:mod:`fedtab.federation.protocol.piggyback`). Each part is answered by the site as
    if alone; the server learns what the two exchanges release (the moments, and the statistics
    about a public shift, which determine those about any other public shift, the pooled mean
    included). Every reply is validated as in the two exchanges (the statistics' counts equal the
    moments' counts of the same site).

    Raises:
        FederationError: a site failed or was rejected (naming it), the sites' schemas are
            disjoint, a column has no observed value, or pooling failed.
    """
    from fedtab.federation.protocol.piggyback import ride

    pair = columns_step(federation)
    got: list[Columns] = []
    ride(federation, pair.request, pair.check,
         lambda replies: got.append(pair.aggregate(Summed({}, None, dict(replies), list(replies)))),
         step="impute_schema")
    names = list(centre)
    pos = {c: i for i, c in enumerate(names)}
    stats: dict[str, SiteStats] = {}

    def check(s: str, r: Message) -> None:  # the riding moments are reduced before this runs
        if not got or s not in got[0].site_columns:
            raise ValueError("statistics from a site whose column moments were not accepted")
        _stats_checker(federation, got[0], shift, stats, pos)(s, r)

    replies = exchange(federation, Message("impute_stats", {"shift": shift}, {"columns": names}), check)
    columns = got[0]
    return columns, _pooled(lambda: pool_stats([stats[s] for s in replies], columns.columns))


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


def setup_step(federation: Federation, cfg: ImputeConfig, glob: list[str], model: Model, *,
               ride: bool = False) -> dict[str, int]:
    """Step 3: every site builds the model; returns ``{site: training rows}``. With ``ride`` the
    setup rides on the next exchange (:func:`fedtab.federation.protocol.piggyback.ride`: the first
    round's, answered before it) and the dict is filled when its replies arrive.

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

    rows: dict[str, int] = {}

    def keep(replies: Mapping[str, Message]) -> None:
        rows.update({s: int(r.meta["n_train"]) for s, r in replies.items()})

    if ride:
        from fedtab.federation.protocol.piggyback import ride as ride_on

        ride_on(federation, setup, check, keep, step="impute_setup")
    else:
        keep(exchange(federation, setup, check))
    return rows


# ----------------------------------------------------------------------------- 4. FedAvg rounds
def _error_arrays(federation: Federation, site: str, r: Message, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(val_sse, val_count)`` of one reply: non-negative, counts within the declared validation rows."""
    assert federation.schema is not None
    sse, cnt = validate.array(r, "val_sse", (f,)), validate.array(r, "val_count", (f,))
    if np.any(sse < 0):
        raise ValueError("negative validation errors")
    validate.counts(cnt, federation.schema.rows(site, "test"), "validation counts")
    return sse, cnt


def _pooled_rmse(per_site: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> float | None:
    """The overall validation RMSE from per-site ``(sse, count)``, pooled."""
    tot_sse = sum(v[0].sum() for v in per_site.values())
    tot_cnt = sum(v[1].sum() for v in per_site.values())
    return float(np.sqrt(tot_sse / tot_cnt)) if tot_cnt > 0 else None


def _median_rmse(per_site: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> float | None:
    """The median site's validation RMSE from per-site ``(sse, count)``."""
    rmse = [np.sqrt(v[0].sum() / v[1].sum()) for v in per_site.values() if v[1].sum() > 0]
    return float(site_median(np.array(rmse))) if rmse else None


#: one round's result: (new weights, validation RMSE of the weights sent, mean training loss, the median
#: site's validation RMSE of those weights — ``None`` when the sites' errors arrive only as sums)
Round = tuple[dict[str, np.ndarray], "float | None", "float | None", "float | None"]


def fit_step(federation: Federation, weights: dict[str, np.ndarray], rnd: int, site_rows: Mapping[str, int],
             f: int, *, max_param_abs: float) -> SumStep[Round]:
    """Step 4's pair, one round: ``(new weights, validation RMSE of the weights sent, mean training
    loss, median site's validation RMSE)``. Per site: FedAvg by training rows (robust: the
    coordinate-wise median of the weights, the median site's RMSE). Summed form: the sums of the
    row-weighted weights (no per-site losses, no median site: its last entry is ``None``); DP:
    ``DP_STEPS_PER_ROUND`` releases of ``"imputation.fit"`` (gradient steps)."""
    from fedtab.impute.train import fedavg

    shapes = {k: v.shape for k, v in weights.items()}
    names = [f"w/{k}" for k in shapes]
    request = Message("impute_fit", weight_arrays(weights), {"round": rnd})
    fitted: dict[str, tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}

    def check(s: str, r: Message) -> None:
        validate.integer(r.meta.get("n_train"), "training rows", equal=site_rows[s])
        loss = r.meta.get("loss")
        if loss is not None and (isinstance(loss, bool) or not isinstance(loss, (int, float))):
            raise ValueError("loss must be a number or null")
        w = validate.parameters({k[2:]: v for k, v in r.arrays.items() if k.startswith("w/")}, shapes,
                                max_abs=max_param_abs, what="array 'w/…'")
        fitted[s] = (w, _error_arrays(federation, s, r, f))

    def train_loss(replies: Mapping[str, Message]) -> float | None:
        losses = [(float(r.meta["loss"]), site_rows[s]) for s, r in replies.items() if r.meta.get("loss") is not None]
        return sum(l * n for l, n in losses) / sum(n for _, n in losses) if losses else None

    def per_site(summed: Summed) -> Round:
        new = fedavg([fitted[s][0] for s in summed.replies], [site_rows[s] for s in summed.replies])
        errors = {s: fitted[s][1] for s in summed.replies}
        return new, _pooled_rmse(errors), train_loss(summed.replies), _median_rmse(errors)

    def robust(summed: Summed) -> tuple[Round, dict[str, str]]:
        new = robust_params([fitted[s][0] for s in summed.replies])
        median = _median_rmse({s: fitted[s][1] for s in summed.replies})
        return (new, median, train_loss(summed.replies), median), {}

    def summed_round(summed: Summed) -> Round:
        sums, n = summed.sums, summed.weight
        if n is None or not n > 0:
            raise FederationError(f"round {rnd}: the summed row count is not positive")
        new = {k: (sums[f"w/{k}"] / n).astype(weights[k].dtype) for k in shapes}
        cnt = float(np.sum(sums["val_count"]))
        val = float(np.sqrt(max(float(np.sum(sums["val_sse"])), 0.0) / cnt)) if cnt > 0 else None
        return new, val, None, None

    def form(count_bits: int | None, bound: bool) -> SumStep[Round]:
        clear = _clear_arrays({"val_sse": (f,), "val_count": (f,)}, bound)

        def check_clear(s: str, r: Message) -> None:
            got = {k[2:]: v for k, v in r.arrays.items() if k.startswith("w/")}
            if got:  # in the clear (DP without secure sums): names and shapes; noisy, so no magnitude bound
                validate.parameters(got, shapes, max_abs=np.inf, what="array 'w/…'")
            clear(s, r)

        spec = SumSpec({**{n: None for n in names}, "val_sse": None, "val_count": count_bits},
                       weighted=tuple(names), weight="n_train", drop_meta=("loss", "steps"))
        return SumStep(request, spec, check_clear, summed_round, _as_robust(summed_round))

    summed = form(0, False)
    summed.noisy = NoisyRelease(form(None, True), "imputation.fit", DP_STEPS_PER_ROUND,
                                extra={"steps": DP_STEPS_PER_ROUND})
    return SumStep(request, SumSpec({}), check, per_site, robust, summed=summed)


def fit_round(federation: Federation, weights: dict[str, np.ndarray], rnd: int, site_rows: Mapping[str, int],
              f: int, *, max_param_abs: float, ledger: PrivacyLedger | None = None) -> Round:
    """Step 4, one round on the run's strategy (:func:`fit_step`); under DP the round's gradient
    steps are spent from ``ledger`` before the request goes out.

    Raises:
        FederationError: a site failed or sent weights or errors that fail validation (naming it).
    """
    pair = fit_step(federation, weights, rnd, site_rows, f, max_param_abs=max_param_abs)
    return strategy(federation, ledger).run(federation, pair).result


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


def evaluate_step(federation: Federation, weights: Mapping[str, np.ndarray], f: int) -> SumStep[Evaluation]:
    """Step 5's pair: the validation errors of ``weights`` (and of mean fill) on the sites'
    validation cells. Per site: pooled (robust: the median site's RMSE); summed form: the sums
    only; under DP they are not released: no exchange, an empty evaluation."""
    request = Message("impute_eval", weight_arrays(weights))
    errors: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    mean_fill: dict[str, np.ndarray] = {}  # the mean-fill baseline's error sums, when every site sends them

    def check(s: str, r: Message) -> None:
        errors[s] = _error_arrays(federation, s, r, f)
        if "val_mean_sse" in r.arrays:
            m = validate.array(r, "val_mean_sse", (f,))
            if np.any(m < 0):
                raise ValueError("negative mean-fill errors")
            mean_fill[s] = m

    def pooled_by(overall: Callable[[Mapping[str, tuple[np.ndarray, np.ndarray]]], float | None]):
        def aggregate(summed: Summed) -> Evaluation:
            per = {s: errors[s] for s in summed.replies}
            mean_sse = sum(mean_fill[s] for s in summed.replies) if set(mean_fill) >= set(summed.replies) else None
            return Evaluation(per, sum(v[0] for v in per.values()), sum(v[1] for v in per.values()), overall(per),
                              mean_sse)

        return aggregate

    def summed_errors(summed: Summed) -> Evaluation:
        sums = summed.sums
        sse, cnt = np.maximum(sums["val_sse"], 0.0), np.rint(sums["val_count"])
        return Evaluation({}, sse, cnt, (float(np.sqrt(sse.sum() / cnt.sum())) if cnt.sum() > 0 else None),
                          np.maximum(sums["val_mean_sse"], 0.0))

    def withheld() -> Evaluation:
        return Evaluation({}, np.zeros(f), np.zeros(f), None, None)

    shapes = {"val_sse": (f,), "val_count": (f,), "val_mean_sse": (f,)}
    summed = SumStep(request, SumSpec({"val_sse": None, "val_count": 0, "val_mean_sse": None}), _clear_arrays(shapes),
                     summed_errors, _as_robust(summed_errors))
    summed.noisy = NoisyRelease(Reduction(withheld, lambda: (withheld(), {})), None)
    median = pooled_by(_median_rmse)
    return SumStep(request, SumSpec({}), check, pooled_by(_pooled_rmse), lambda s: (median(s), {}), summed=summed)


def evaluate(federation: Federation, weights: Mapping[str, np.ndarray], f: int) -> Evaluation:
    """Step 5 on the run's strategy (:func:`evaluate_step`).

    Raises:
        FederationError: a site failed or sent errors that fail validation (naming it).
    """
    return strategy(federation).run(federation, evaluate_step(federation, weights, f)).result


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
                     groups: list[list[int]] | None = None, *, ride: bool = False,
                     then: Callable[[dict[str, dict[str, int]]], Any] | None = None) -> dict[str, dict[str, int]]:
    """Let every site fill its table with the imputer of ``result`` (one exchange; with ``ride``
    none of its own: it rides on the next exchange, answered before it, and the returned dict is
    filled when its replies arrive — :func:`fedtab.federation.protocol.piggyback.ride`); ``then(counts)``
    is called once they are known.

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
    out: dict[str, dict[str, int]] = {}

    def keep(replies: Mapping[str, Message]) -> None:
        out.update({s: {k: int(r.meta[k]) for k in ("imputed", "clipped")} for s, r in replies.items()})
        if then is not None:
            then(out)

    request = Message("impute_apply", {**weight_arrays(result.weights), **arrays}, meta)
    if ride:
        from fedtab.federation.protocol.piggyback import ride as ride_on

        ride_on(federation, request, check, keep, step="impute_apply")
    else:
        keep(exchange(federation, request, check))
    if getattr(federation, "schema", None) is not None:
        # the tables gained columns (with ride: before the next request is answered), so the next
        # exchange declares them again
        federation.schema = None
    return out
