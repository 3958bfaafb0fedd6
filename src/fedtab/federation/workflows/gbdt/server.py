"""The GBDT workflow's server loop: bins agreed once, then one exchange per depth level.

Exchanges of a run (``R`` rounds, depth ``D``): ``gbdt_summary`` (class labels), two
``gbdt_sketch`` (the sites' counts over public grids, summed: the bin edges are quantiles of
the pooled counts, :mod:`fedtab.learn.gbdt.sketch`; none under DP or when every column has
public bounds: the edges are then their equal-width grid), ``gbdt_start`` (edges,
classes, parameters; label sums for the intercept, summed), then per round one
``gbdt_level`` per depth level for all open nodes of the round's trees (``K`` trees for
``K`` classes are grown together), each carrying the previous level's splits and, at a
round's first level, the previous round's leaf values (and asking for the validation loss
sums when early stopping); one closing ``gbdt_level`` without nodes delivers the last
round's leaves; in a plain run ``gbdt_importance`` (each site's split gains on its own
rows, :func:`importance_step`); and ``gbdt_evaluate`` on the test part. So a tree costs at
most ``D`` exchanges, plus one exchange for the whole run's last leaves: ``R·D + 7`` at most.

The loop is :func:`run_gbdt` over small steps sharing one :class:`_Run`: :func:`_prepare`
(parts, quorum, schema), :func:`_agree_bins` (with :func:`_sketch`), :func:`_start`, :func:`_boost` (rounds of
:func:`_level` exchanges), :func:`importance_step` and :func:`_evaluate`.

Every exchange is one configure/aggregate pair (:class:`~fedtab.federation.protocol.modes.SumStep`)
run on the run's strategy (:func:`~fedtab.federation.protocol.modes.run_strategy`), chosen once:
no step here tests a mode. Histograms are sums: they travel by the run's summing strategy,
plain or masked by secure aggregation; the sites round them to a fixed grid first
(:mod:`fedtab.learn.gbdt.release`), so both give the same trees bit for bit. DP: each step's
:class:`~fedtab.federation.protocol.modes.NoisyRelease` (its request without ``pack``, its
checks of noisy values, its post-processing), spent from the run's accountant before the
request goes out (steps ``gbdt.labels``, ``gbdt.level``, ``training.evaluate``); the sites
noise every histogram, label sum and validation sum on their own terms. Robust mode: the
level's robust reducer caps every site's share of each node's hessian mass at
``max_site_share``. The bin edges are a :class:`~fedtab.federation.protocol.modes.Reduction`
(the sketch, or under DP the public bounds' grid), and the steps state their modes once
(:data:`GBDT_MODES` and the narrower declarations beside it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping

import numpy as np

from fedtab.learn.gbdt import BinLayout, Booster, GBDTModel, GBDTParams, base_margin, check_site_histogram
from fedtab.learn.gbdt.grid import public_grid
from fedtab.learn.gbdt.sketch import (FINE_WIDTH, RANGE_WIDTH, dp_counts_sensitivity, fine_grid, noise_sigma,
                                      noisy_quantile_edges, noisy_range, quantile_edges, range_from_counts)
from fedtab.learn.gbdt.importance import pooled_importance
from fedtab.learn.gbdt.pooled import as_params
from fedtab.learn.gbdt.release import GRID_BITS
from fedtab.learn.metrics import SCORE_BINS
from fedtab.privacy.dp import column_bounds
from fedtab.privacy.secagg import MOMENT_BITS
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import (Federation, FederationError, SiteRefused, Summed, SumSpec, exchange, run_ledger,
                                        set_quorum)
from fedtab.federation.protocol.modes import (MODES, BaseSums, NoisyRelease, Reduction, RunStrategy, SumStep,
                                              declare_modes, run_strategy)
from fedtab.federation.protocol.schema import sort_labels
from fedtab.federation.protocol.agreement import agree_schema
from fedtab.federation.site.matrices import check_part
from fedtab.federation.workflows.gbdt.site import LEAF, SPLIT
from fedtab.federation.workflows.gbdt.steps import (importance_checker, labels_checker, level_checker, noisy_checker,
                                                    payload_bytes, robust_pool, sketch_checker, sketch_total,
                                                    summary_checker)

__all__ = ["GBDTOutcome", "GBDTRunOptions", "run_gbdt", "dp_plan", "importance_step", "GBDT_MODES"]

#: the modes of a boosting run (every step has its secure sums, DP release and robust reducer)
GBDT_MODES = declare_modes("gbdt", "secure", "dp", "robust")
#: early stopping of a regression: its validation loss is unbounded, so it has no DP release
REGRESSION_EARLY_STOPPING_MODES = declare_modes("gbdt.regression_early_stopping", "secure", "robust")
#: the sites' per-site gains (:func:`importance_step`): per-site statistics that secure sums and DP
#: keep from the server, so the step is left out (not refused) in those runs
IMPORTANCE_MODES = declare_modes("gbdt.importance", "robust")
#: why the per-site gains are not asked for, by the first mode of :data:`MODES` that hides them
_HIDDEN_BY = {"secure": "secure aggregation", "dp": "differential privacy"}


@dataclass
class GBDTOutcome:
    """Result of :func:`run_gbdt`.

    Attributes:
        model: the trained :class:`~fedtab.learn.gbdt.GBDTModel` (rounds up to the best one).
        params: the settings used (objective and classes resolved).
        features / classes: input columns, agreed class labels (empty for regression).
        metrics: ``{"pooled", "per_site"}`` of the test part (classification: the training
            workflow's metrics; regression: ``rmse`` and ``n``; ``per_site`` empty when secure).
        history: pooled validation metric after every round (empty without early stopping).
        exchanges: one ``{"step", "round", "level", "nodes", "bytes_down", "bytes_up", "wire_down",
            "wire_up"}`` per exchange: array payload bytes summed over the sites, and the bytes the
            engine measured on its wire (0 for an engine that does not measure them).
        withheld: ``{site: nodes it sent as zeros}`` (plain mode only; its release rules).
        left_out: robust mode: ``{site: its largest share of a node's hessian mass}`` where
            capping reduced it.
        participation / dropped / privacy / seconds: as in the training outcome.
        importance: feature importance by gain, pooled and per site (:func:`importance_step`;
            None when not asked for).
    """

    model: GBDTModel
    params: GBDTParams
    features: list[str]
    classes: list[str]
    metrics: dict[str, Any]
    history: list[float] = field(default_factory=list)
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    withheld: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, float] = field(default_factory=dict)
    participation: list[dict[str, Any]] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    privacy: dict[str, Any] | None = None
    seconds: float = 0.0
    importance: dict[str, Any] | None = None

    @property
    def level_exchanges(self) -> list[dict[str, Any]]:
        return [e for e in self.exchanges if e["step"] == "gbdt_level"]

    @property
    def exchanges_per_tree(self) -> float:
        """Level exchanges (the closing one included) per boosting round (a round's ``K`` trees grow together)."""
        rounds = max({e["round"] for e in self.level_exchanges if e["nodes"]} | {0}) + 1
        return len(self.level_exchanges) / rounds


def dp_plan(params: GBDTParams, validating: bool, sketch: bool = False) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per step, noise scale per step)`` of one DP boosting run, for the accountant;
    ``sketch``: some column has no public bounds, so the two sketch exchanges are released
    (``gbdt.sketch``, one release each)."""
    levels = params.n_trees * params.max_depth
    val = params.n_trees if validating else 0
    plan = {"gbdt.labels": 1, "gbdt.level": levels + val, "training.evaluate": 1}
    if sketch:
        plan["gbdt.sketch"] = SKETCH_STAGES
    return plan, {}


#: the sketch's exchanges: the range grid, then the fine grid
SKETCH_STAGES = 2


def _resolve(params: GBDTParams, classes: list[str]) -> GBDTParams:
    if params.objective == "regression":
        return params
    if len(classes) < 2:
        raise ValueError(f"classification needs at least 2 classes across the sites, found {classes}")
    if len(classes) == 2 and params.objective == "binary":
        return params
    return replace(params, objective="multiclass", n_classes=len(classes))


@dataclass(frozen=True)
class GBDTRunOptions:
    """The settings of one boosting run beside its data and parameters (:func:`run_gbdt`'s
    keywords, documented there): parts, scoring, quorum and failure policy, callbacks, the sites'
    gains, public bounds and packed levels."""

    train_part: str | None = None
    validation_part: str | None = None
    eval_part: str = "test"
    score_bins: int | None = SCORE_BINS
    min_sites: int | None = None
    on_error: Literal["raise", "skip"] | None = None
    on_round: Callable[[int, float | None], None] | None = None
    importance: bool = True
    bounds: Mapping[str, Any] | None = None
    packed_levels: bool = False

    @classmethod
    def of(cls, options: "GBDTRunOptions | None", settings: Mapping[str, Any]) -> "GBDTRunOptions":
        """``options`` (default: the defaults) with ``settings`` replacing fields.

        Raises:
            TypeError: a setting that is not a field (naming it).
        """
        unknown = sorted(set(settings) - set(cls.__dataclass_fields__))
        if unknown:
            raise TypeError(f"run_gbdt() got unexpected keyword argument(s) {unknown}")
        return replace(options or cls(), **settings)


@dataclass
class _Run:
    """One boosting run's server state, shared by its steps (bins, start, levels, importance)."""

    federation: Federation
    params: GBDTParams
    features: list[str]
    train_part: str
    validation_part: str | None
    on_error: Literal["raise", "skip"] | None
    base_meta: dict[str, Any]
    log: list[dict[str, Any]] = field(default_factory=list)
    seen: int = 0
    layout: BinLayout | None = None
    ledger: Any = None
    strategy: RunStrategy | None = None  # the run's modes, chosen once (run_strategy) with its accountant
    withheld: dict[str, int] = field(default_factory=dict)
    left_out: dict[str, float] = field(default_factory=dict)
    carry: dict[str, np.ndarray] = field(default_factory=dict)
    bounds: dict[str, list[float]] = field(default_factory=dict)
    packed: bool = False  # plain levels' histograms asked packed (run_gbdt's packed_levels)

    @property
    def regression(self) -> bool:
        return self.params.objective == "regression"

    def record(self, step: str, request: Message, n_sites: int, up: int, round_: int = -1, level: int = -1,
               nodes: int = 0) -> None:
        """Log one exchange: payload bytes, and what the engine measured on its wire since the last one
        (a secure sum's rounds included)."""
        wire = self.federation.traffic.records[self.seen:]
        self.seen = len(self.federation.traffic.records)
        self.log.append({"step": step, "round": round_, "level": level, "nodes": nodes,
                         "bytes_down": payload_bytes(request) * n_sites, "bytes_up": up,
                         "wire_down": sum(t.bytes_down for t in wire), "wire_up": sum(t.bytes_up for t in wire)})

    def run(self, step: SumStep[Any]) -> Any:
        """``step`` on the run's strategy: its :class:`~fedtab.federation.protocol.modes.Outcome`."""
        assert self.strategy is not None
        return self.strategy.run(self.federation, step, on_error=self.on_error)


def run_gbdt(
    federation: Federation,
    features: list[str] | None = None,
    target: str | None = None,
    params: GBDTParams | Mapping[str, Any] | None = None,
    *,
    options: GBDTRunOptions | None = None,
    **settings: Any,
) -> GBDTOutcome:
    """Federated histogram gradient boosting (see the module docstring for the exchanges).

    The run's settings are ``options`` (:class:`GBDTRunOptions`) or its fields as keywords (a
    keyword replaces the field of ``options``):

    Args:
        features: columns to train on (numeric; categories one-hot encoded by the federation's
            agreed categories first). ``None``: every column of the agreed schema.
        target: the label column, if given checked against each site's (a site refuses another).
        params: :class:`~fedtab.learn.gbdt.GBDTParams` or a mapping of its fields; a
            classification objective becomes ``multiclass`` when the sites hold more than two classes.
        train_part / validation_part: the sites' parts to boost on and to early-stop on; by
            default ``"fit"`` / ``"validation"`` with ``early_stopping_rounds``, else ``"train"`` / none.
        eval_part: the part the final model is scored on; score_bins: its score histograms'
            grid (AUROC), ``None`` for none.
        min_sites / on_error: the quorum and failure policy (as :func:`~fedtab.federation.workflows.training.run_training`).
        on_round: progress callback ``(round, pooled validation metric or None)``.
        importance: ask the sites for their per-site gains (one ``gbdt_importance`` exchange
            before the evaluation; plain runs only, see :func:`importance_step`).
        bounds: the public data dictionary ``{column: [low, high]}`` (``[columns] bounds``):
            without DP those columns are binned on the equal-width grid of their bounds (no
            site data; the sites check the edges lie inside), the others by the quantile sketch.
            Under DP the bounds come from the DP settings.
        packed_levels: ask the sites to send a plain level's histogram packed (its non-zero
            slots in grid units, :func:`~fedtab.learn.gbdt.release.pack_level`): the same
            numbers and trees in about a third of the bytes on Adult. Secure and DP levels
            stay dense (the DP release does not ask; a site packs only what it sends in the clear).

    Raises:
        FederationError: a site failed or replied implausibly (naming it).
        ValueError: bad parameters, fewer than two classes, DP without public bounds, a mode a
            step does not support (before anything is sent).
        TypeError: a keyword that is not a :class:`GBDTRunOptions` field.
    """
    t0 = time.perf_counter()
    opts = GBDTRunOptions.of(options, settings)
    p0, dropped0 = len(federation.participation), set(federation.dropped)
    run = _prepare(federation, features, target, as_params(params), opts)
    run.bounds = _public_bounds(opts.bounds)
    run.packed = bool(opts.packed_levels)
    try:  # a site that would refuse every level of a plain run refuses its sketch or start already
        classes = _agree_bins(run)
        booster = _start(run, classes)
    except FederationError as exc:
        _explain_row_set_refusals(federation, exc)
        raise
    _boost(run, booster, opts.on_round)
    model = booster.model()
    imp = importance_step(run, model) if opts.importance else None
    metrics = _evaluate(run, model, classes, opts.eval_part, opts.score_bins)
    return GBDTOutcome(model=model, params=run.params, features=run.features, classes=classes, metrics=metrics,
                       history=list(booster.history), exchanges=run.log, withheld=run.withheld,
                       left_out=run.left_out, participation=federation.participation[p0:],
                       dropped={s: why for s, why in federation.dropped.items() if s not in dropped0},
                       privacy=run.ledger.report() if run.ledger is not None else None,
                       seconds=time.perf_counter() - t0, importance=imp)


def _public_bounds(bounds: Mapping[str, Any] | None) -> dict[str, list[float]]:
    """``{column: [low, high]}`` checked: finite, ``low <= high``.

    Raises:
        ValueError: otherwise (naming the column).
    """
    out: dict[str, list[float]] = {}
    for c, b in (bounds or {}).items():
        try:
            lo, hi = (float(x) for x in b)
        except (TypeError, ValueError):
            raise ValueError(f"public bounds of column {c!r} must be [low, high], got {b!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
            raise ValueError(f"public bounds of column {c!r} must be finite with low <= high, got {b!r}")
        out[str(c)] = [lo, hi]
    return out


def _prepare(federation: Federation, features: list[str] | None, target: str | None, p: GBDTParams,
             opts: GBDTRunOptions) -> _Run:
    """Check the parts and modes, set the quorum, agree the schema: the run's state before any exchange.

    Raises:
        ValueError: a bad part, or a mode the run's steps do not support (early stopping of a
            regression has no DP release), before anything is sent.
    """
    early = p.early_stopping_rounds is not None
    train_part = opts.train_part or ("fit" if early else "train")
    validation_part = opts.validation_part if opts.validation_part is not None else ("validation" if early else None)
    for part in (train_part, opts.eval_part, *(() if validation_part is None else (validation_part,))):
        check_part(part)
    regression = p.objective == "regression"
    supported, what = GBDT_MODES, "boosted trees"
    if regression and validation_part is not None:
        supported, what = REGRESSION_EARLY_STOPPING_MODES, "early stopping of a regression (it needs a bounded " \
            "validation loss)"
    run_strategy(federation).check_supported(supported, what)
    set_quorum(federation, opts.min_sites)
    if federation.schema is None:
        agree_schema(federation)
    feats = list(features) if features is not None else list(federation.schema.columns)
    base_meta = {"features": feats, "part": train_part, "min_rows": p.min_rows, "regression": regression,
                 **({"target": target} if target is not None else {})}
    return _Run(federation, p, feats, train_part, validation_part, opts.on_error, base_meta,
                seen=len(federation.traffic.records))


def _agree_bins(run: _Run) -> list[str]:
    """The class labels (``gbdt_summary``), then the resolved objective, the run's accountant
    and strategy, then the agreed edges (:func:`_edges`). Returns the agreed classes."""
    fed, regression = run.federation, run.regression
    request = Message("gbdt_summary", meta=run.base_meta)
    replies = exchange(fed, request, summary_checker(fed, run.train_part, regression=regression),
                       on_error=run.on_error, step="gbdt_summary")
    run.record("gbdt_summary", request, len(replies), sum(payload_bytes(r) for r in replies.values()))
    classes = [] if regression else sort_labels({c for r in replies.values() for c in r.meta.get("classes", [])})
    run.params = p = _resolve(run.params, classes)
    run.ledger = run_ledger(fed, *dp_plan(p, run.validation_part is not None, bool(_unbounded(run.features, fed.options.dp or {}))))  # None without DP
    run.strategy = run_strategy(fed, run.ledger)
    run.layout = run.strategy.reduce(_edges(run)).result()
    return classes


def _unbounded(features: list[str], settings: Mapping[str, Any]) -> list[str]:
    """The ``features`` without bounds in the DP settings ``settings`` (``bounds``: one pair for
    all columns or per column): under DP their edges come from the DP sketch."""
    given = settings.get("bounds")
    if given is None:
        return list(features)
    return [f for f in features if isinstance(given, Mapping) and f not in given]


def _edges(run: _Run) -> Reduction[Callable[[], BinLayout]]:
    """How the bin edges are agreed, as a reduction of the run's strategy; its result is the
    agreement to carry out (lazily, so that only the chosen one runs). No site's values are
    behind any edge: the equal-width grid for the columns with public bounds and, for the
    others, the quantile sketch (:func:`_sketch`). Plain and secure runs take the bounds of
    ``run.bounds`` (the job's ``[columns] bounds``); the DP release takes those of the DP
    settings, and the sketch of the other columns is then the DP sketch (its step's DP release)."""
    p = run.params

    def agreed(bounds: Mapping[str, Any]) -> Callable[[], BinLayout]:
        def edges() -> BinLayout:
            bounded = [f for f in run.features if f in bounds]
            out: dict[str, np.ndarray] = {}
            if bounded:
                lo, hi = column_bounds({"bounds": dict(bounds)}, bounded)
                out.update(zip(bounded, public_grid(lo, hi, p.max_bins)))
            rest = [f for f in run.features if f not in bounds]
            if rest:
                out.update(zip(rest, _sketch(run, rest)))
            return BinLayout([out[f] for f in run.features])
        return edges

    def dp_bounds(dp: Mapping[str, Any]) -> dict[str, Any]:
        unbounded = set(_unbounded(run.features, dp))
        given = dp.get("bounds")
        return {f: (given[f] if isinstance(given, Mapping) else given) for f in run.features if f not in unbounded}

    sketched = agreed(run.bounds)
    return Reduction(lambda: sketched, robust=lambda: (sketched, {}),
                     noisy=lambda _, dp: agreed(dp_bounds(dp)))


def _sketch(run: _Run, features: list[str]) -> list[np.ndarray]:
    """Two summed ``gbdt_sketch`` exchanges (:mod:`fedtab.learn.gbdt.sketch`): the sites' counts
    over the range grid -> each feature's range; their counts over the fine grid of that range
    -> at most ``max_bins − 1`` edges per feature, points of the fine grid. Under DP each is the
    step's DP release (:class:`_Pooled` with the noise's σ: :func:`noisy_range`,
    :func:`noisy_quantile_edges`)."""
    d = len(features)
    stages: list[tuple[dict[str, Any], int]] = [({"stage": "range"}, RANGE_WIDTH)]
    pooled: _Pooled | None = None
    grids: list[np.ndarray] = []
    for i in range(SKETCH_STAGES):
        meta, width = stages[-1]
        step = _sketch_step(run, Message("gbdt_sketch", meta={"features": features, **meta}), d, width)
        out = run.run(step)
        assert out.summed is not None
        run.record("gbdt_sketch", step.request, len(out.summed.sites), 8 * d * width * len(out.summed.sites))
        pooled = out.result
        if i == 0:
            lo, hi = pooled.range()
            grids = [fine_grid(a, b) for a, b in zip(lo.tolist(), hi.tolist())]
            stages.append(({"stage": "fine", "lo": lo.tolist(), "hi": hi.tolist()}, FINE_WIDTH))
    assert pooled is not None
    return [pooled.edges(j, grids[j], run.params.max_bins) for j in range(d)]


@dataclass(frozen=True)
class _Pooled:
    """A sketch stage's pooled counts ``(d, width)``; ``sigma``: the standard deviation of their
    noise under DP (``None``: exact counts)."""

    counts: np.ndarray
    sigma: float | None = None

    def range(self) -> tuple[np.ndarray, np.ndarray]:
        return range_from_counts(self.counts) if self.sigma is None else noisy_range(self.counts, self.sigma)

    def edges(self, j: int, grid: np.ndarray, max_bins: int) -> np.ndarray:
        if self.sigma is None:
            return quantile_edges(self.counts[j], grid, max_bins)
        return noisy_quantile_edges(self.counts[j], grid, max_bins)


def _sketch_step(run: _Run, request: Message, d: int, width: int) -> SumStep[_Pooled]:
    """One ``gbdt_sketch`` pair: the pooled counts ``(d, width)``, checked
    (:func:`~.steps.sketch_total`); robust mode sums them too (counts of a fixed part). Its DP
    release (``gbdt.sketch``): noisy counts (shape and finiteness checked), with the σ of the
    pooled noise (:func:`~fedtab.learn.gbdt.sketch.noise_sigma`: the run's multiplier × √d per
    site, or more when the counts show more)."""
    fed = run.federation
    total = sketch_total(fed, d, width)

    def aggregate(summed: Summed) -> _Pooled:
        _checked(total, summed, "gbdt_sketch")
        return _Pooled(np.asarray(summed.sums["counts"], dtype=np.float64).reshape(d, width))

    def noisy(summed: Summed) -> _Pooled:
        c = np.asarray(summed.sums.get("counts", np.zeros(0)), dtype=np.float64)
        if c.size != d * width or not np.isfinite(c).all():
            raise FederationError(f"gbdt_sketch step: the summed noisy counts are not {d} x {width} finite numbers")
        c = c.reshape(d, width)
        assert run.ledger is not None
        planned = run.ledger.multiplier("gbdt.sketch") * dp_counts_sensitivity(d) * np.sqrt(len(summed.sites))
        return _Pooled(c, noise_sigma(c, planned if np.isfinite(planned) else 0.0))

    step = SumStep(request, SumSpec({"counts": 0}), sketch_checker(fed, d, width), aggregate,
                   robust=lambda summed: (aggregate(summed), {}), kind="gbdt_sketch")
    released = SumStep(request, SumSpec({"counts": MOMENT_BITS}), noisy_checker(fed, d, width), noisy,
                       robust=lambda summed: (noisy(summed), {}), kind="gbdt_sketch")
    step.noisy = NoisyRelease(released, "gbdt.sketch")
    return step


def _bounds_meta(run: _Run) -> dict[str, Any]:
    """``{"bounds": {column: [low, high]}}`` of the run's columns with public bounds (the sites
    check those columns' edges lie inside; under DP they check the DP bounds' grid), else ``{}``."""
    given = {f: run.bounds[f] for f in run.features if f in run.bounds}
    return {"bounds": given} if given else {}


def _checked(check_total: Callable[[Mapping[str, np.ndarray], list[str]], None], summed: Summed, step: str) -> None:
    """``check_total`` of a step's sums, its failure a :class:`FederationError` of ``step``
    (the sites cannot be told apart), as :func:`~fedtab.federation.protocol.exchange_sums` words it."""
    try:
        check_total(summed.sums, summed.sites)
    except (ValueError, TypeError, KeyError) as exc:
        raise FederationError(f"{step} step: the summed values are implausible ({exc})") from None


def _start_step(run: _Run, classes: list[str]) -> SumStep[np.ndarray]:
    """Exchange 2's pair: edges, classes, parameters -> the summed label sums. Its DP release
    checks noisy sums (shape and finiteness only) and floors them (counts at ``1e-6``; a
    regression's row count at 1); robust mode sums them too (sums of a fixed part)."""
    p, regression = run.params, run.regression
    assert run.layout is not None
    request = Message("gbdt_start", run.layout.to_arrays(),
                      {**run.base_meta, "classes": classes, "params": p.to_dict(),
                       "validation_part": run.validation_part, **_bounds_meta(run)})

    def pair(exact: bool) -> SumStep[np.ndarray]:
        total = _labels_total(run, exact=exact)

        def aggregate(summed: Summed) -> np.ndarray:
            _checked(total, summed, "gbdt_start")
            sums = np.asarray(summed.sums["label_sums"], dtype=np.float64)
            return sums if exact else np.maximum(sums, 1e-6) if not regression else np.array([sums[0], max(sums[1], 1.0)])

        return SumStep(request, SumSpec({"label_sums": MOMENT_BITS if (regression or not exact) else 0}),
                       labels_checker(run.federation, run.train_part, p.objective, p.n_classes, exact=exact),
                       aggregate, robust=lambda summed: (aggregate(summed), {}), kind="gbdt_start")

    step = pair(True)
    step.noisy = NoisyRelease(pair(False), "gbdt.labels")
    return step


def _start(run: _Run, classes: list[str]) -> Booster:
    """Exchange 2 (:func:`_start_step`) -> the intercept and the booster."""
    p = run.params
    assert run.layout is not None
    step = _start_step(run, classes)
    out = run.run(step)
    width = p.n_classes if p.objective == "multiclass" else 2
    assert out.summed is not None
    run.record("gbdt_start", step.request, len(out.summed.sites), 8 * width * len(out.summed.sites))
    margin0 = base_margin(p, out.result)
    run.carry = {"base_margin": margin0}
    return Booster(p, run.layout, margin0, run.features)


#: a level's result: the nodes' pooled histograms ``(m, n_slots, 2)``, the summed validation
#: loss (or None) and ``{site: its largest hessian share}`` where the robust reducer capped it
LevelResult = tuple[np.ndarray, "np.ndarray | None", dict[str, float]]


def _level_step(run: _Run, nodes: np.ndarray, round_: int, lvl: int, validate_now: bool,
                sizes: dict[str, int]) -> SumStep[LevelResult]:
    """One ``gbdt_level`` pair. The plain request may ask for packed histograms (a site packs
    only what it sends in the clear); the DP release asks for none, checks noisy values and
    floors the noisy validation loss (``loss ≥ 0``, rows ``≥ 1``); the robust reducer caps each
    site's share of a node's hessian mass (:func:`~.steps.robust_pool`)."""
    fed, p, layout = run.federation, run.params, run.layout
    assert layout is not None
    arrays = {**run.carry, "nodes": np.asarray(nodes, dtype=np.int32).reshape(-1, 2)}
    m = int(arrays["nodes"].shape[0])
    meta: dict[str, Any] = {"round": round_, "level": lvl, "validate": validate_now}
    fields = {"hist": GRID_BITS} if m else {}
    if validate_now:
        fields["val_loss"] = MOMENT_BITS
    empty = np.zeros((0, layout.n_slots, 2))

    def pair(exact: bool) -> SumStep[LevelResult]:
        total = _level_total(run, m, validate_now, exact=exact)
        floor = (lambda v: v) if exact else _floor_validation

        def aggregate(summed: Summed) -> LevelResult:
            _checked(total, summed, "gbdt_level")
            hist = summed.sums.get("hist", empty).reshape(m, layout.n_slots, 2)
            return hist, floor(summed.sums.get("val_loss") if validate_now else None), {}

        def robust(summed: Summed) -> tuple[LevelResult, dict[str, str]]:
            hist, shares = robust_pool(summed.replies, layout, run.federation.options.max_site_share) if m \
                else (empty, {})
            cap = run.federation.options.max_site_share
            capped = {s: v for s, v in shares.items() if v > cap}
            val = sum(np.asarray(r.arrays["val_loss"], dtype=np.float64) for r in summed.replies.values()) \
                if validate_now else None
            return (hist, floor(val), capped), {s: f"gbdt: hessian share {v:.3g} capped" for s, v in capped.items()}

        asked = {**meta, "pack": True} if exact and run.packed and m else meta
        check = level_checker(fed, layout, m, run.train_part, run.validation_part, objective=p.objective,
                              exact=exact, validating=validate_now, sizes=sizes)
        return SumStep(Message("gbdt_level", arrays, asked), SumSpec(fields), check, aggregate, robust,
                       kind="gbdt_level")

    step = pair(True)
    step.noisy = NoisyRelease(pair(False), "gbdt.level", releases=_level_releases(m, validate_now))
    return step


def _level_releases(m: int, validating: bool) -> int:
    """The DP releases of a level: its histograms (when it asks for nodes) and its validation loss."""
    return (1 if m else 0) + (1 if validating else 0)


def _level(run: _Run, nodes: np.ndarray, round_: int, lvl: int, validate_now: bool
           ) -> tuple[np.ndarray, np.ndarray | None]:
    """One ``gbdt_level`` exchange (:func:`_level_step`): the requested nodes' pooled histograms
    and, when asked, the summed validation loss. A level that releases nothing (the closing one
    without validation: it only delivers the last leaves) runs on the base summing strategy:
    there is nothing for a DP or robust wrapper to release or reduce."""
    sizes: dict[str, int] = {}  # each reply's array bytes as sent (a plain level's histogram is packed)
    step = _level_step(run, nodes, round_, lvl, validate_now, sizes)
    released = _level_releases(int(np.size(nodes)) // 2, validate_now)
    strategy = run.strategy if released else BaseSums(run.federation.summing)
    assert strategy is not None
    try:
        out = strategy.run(run.federation, step, on_error=run.on_error)
    except FederationError as exc:
        _explain_row_set_refusals(run.federation, exc)
        raise
    hist, val, capped = out.result
    run.left_out.update(capped)
    assert out.summed is not None
    replies = out.summed.replies
    for s, r in replies.items():
        if isinstance(r.meta.get("withheld"), int) and r.meta["withheld"]:
            run.withheld[s] = run.withheld.get(s, 0) + int(r.meta["withheld"])
    m = int(step.request.arrays["nodes"].shape[0])
    dense = m * run.layout.n_slots * 2 * 8 + (16 if validate_now else 0)  # what a masked reply holds
    run.record("gbdt_level", step.request, len(replies), sum(sizes.get(s, dense) for s in replies), round_, lvl, m)
    return hist, val


def _boost(run: _Run, booster: Booster, on_round: Callable[[int, float | None], None] | None) -> None:
    """The rounds, level by level, until the last tree or early stopping; then the closing
    exchange that delivers the last round's leaves (and its validation loss)."""
    validating = run.validation_part is not None
    stopped = False
    while not booster.finished:
        r = len(booster.rounds)
        grower = booster.new_round()
        while not grower.done:
            ask_val = validating and r > 0 and grower.level == 0
            hist, val = _level(run, grower.request(), r, grower.level, ask_val)
            if ask_val:
                metric = booster.record_validation(_val_sums(val))
                if on_round:
                    on_round(r - 1, metric)
                if booster.finished:  # early stopping: this round is not grown
                    stopped = True
                    break
            splits = grower.submit(hist)
            run.carry = {SPLIT + k: v for k, v in splits.items()}
        if stopped:
            break
        booster.add_round(grower)
        values = grower.leaf_values()
        run.carry.update({LEAF + "values": np.concatenate(values).astype(np.float32),
                          LEAF + "ptr": np.r_[0, np.cumsum([v.size for v in values])].astype(np.int64)})
        if on_round and not validating:
            on_round(r, None)
    if not stopped:  # the last round's leaves (and its validation loss)
        _, val = _level(run, np.zeros((0, 2), dtype=np.int32), len(booster.rounds), 0, validating)
        if validating:
            metric = booster.record_validation(_val_sums(val))
            if on_round:
                on_round(len(booster.rounds) - 1, metric)


def importance_step(run: _Run, model: GBDTModel) -> dict[str, Any]:
    """Feature importance by gain: pooled from the model, per site from a ``gbdt_importance`` exchange.

    Returns ``{"kind": "total_gain", "pooled": {feature: Σ gain}, "pooled_mean": {feature: mean gain
    per split}, "per_site": {site: {feature: Σ gain on its training rows}}, "suppressed": {site:
    splits left out by its min_rows}, "per_site_skipped": reason or None, "not_released": [sites
    that refused or failed]}`` (features: those of at least one split). Per-site gains are not
    asked for in a secure or DP run (they are per-site statistics those runs keep from the
    server); a site that refuses or fails is listed, never fatal.
    """
    pooled = pooled_importance(model)
    out: dict[str, Any] = {"kind": "total_gain", "pooled": pooled["total_gain"], "pooled_mean": pooled["gain"],
                           "per_site": {}, "suppressed": {}, "per_site_skipped": None, "not_released": []}
    assert run.strategy is not None
    hidden = [m for m in MODES if m in run.strategy.modes and m not in IMPORTANCE_MODES]  # as declared
    if hidden:
        out["per_site_skipped"] = _HIDDEN_BY.get(hidden[0], hidden[0]) + \
            " hides per-site statistics from the server: per-site gains are not released"
        return out
    fed = run.federation
    asked = list(fed.active)
    req = Message("gbdt_importance", meta={"rounds": int(model.n_rounds)})
    try:
        replies = exchange(fed, req, importance_checker(fed, model, run.train_part), on_error="skip",
                           step="gbdt_importance")
    except FederationError:
        replies = {}
    run.record("gbdt_importance", req, len(asked), 8 * len(run.features) * len(replies))
    used = [f for f in run.features if f in pooled["total_gain"]]
    for s, r in replies.items():
        gain = np.asarray(r.arrays["gain"], dtype=np.float64)
        out["per_site"][s] = {f: float(gain[run.features.index(f)]) for f in used}
        out["suppressed"][s] = int(r.meta.get("suppressed", 0))
    out["not_released"] = [s for s in asked if s not in replies]
    return out



def _explain_row_set_refusals(federation: Federation, exc: FederationError) -> None:
    """Raise one clear line when sites refused a level (or, already, the sketch or start of a plain
    run: :func:`fedtab.privacy.policy._gbdt_refused_run`) because they answer the server's tree
    nodes only securely (their policy's ``allow_server_row_sets`` is off); else return."""
    reasons = getattr(exc, "sites", None) or federation.dropped
    off = sorted(s for s, r in reasons.items() if "allow_server_row_sets" in str(r))
    if off:
        raise SiteRefused(
            f"plain GBDT: site(s) {', '.join(map(repr, off[:10]))}{' ...' if len(off) > 10 else ''} answer tree-node "
            "histograms only inside a secure sum or with DP (allow_server_row_sets is off in their policy): run with "
            "secure aggregation or DP, or have each site opt in with allow_server_row_sets = true",
            {s: str(reasons[s]) for s in off}) from None


def _level_total(run: _Run, m: int, validating: bool, *, exact: bool = True
                 ) -> Callable[[Mapping[str, np.ndarray], list[str]], None]:
    """``check_total`` of a level's sums: what a secure sum hides per site is checked on the
    total (:func:`~fedtab.learn.gbdt.check_site_histogram` over the summing sites' rows; the
    validation loss ``≥ 0`` over their validation rows), so that one hostile site's poison
    (say ``+2**40`` in its masked vector) is a :class:`FederationError` of the ``gbdt_level``
    step, not a failure deep in the tree code. ``exact=False`` (the DP release): noisy totals,
    shapes and finiteness only."""
    layout, p, fed = run.layout, run.params, run.federation
    assert layout is not None

    def check(sums: Mapping[str, np.ndarray], sites: list[str]) -> None:
        schema = fed.schema
        assert schema is not None
        h = sums.get("hist")
        if m:
            if h is None or np.size(h) != m * layout.n_slots * 2:
                raise ValueError("the summed level histogram does not have the requested shape")
            n = sum(schema.rows(s, run.train_part) for s in sites)
            check_site_histogram(np.asarray(h, dtype=np.float64).reshape(m, layout.n_slots, 2), layout, m, n_rows=n,
                                 objective=p.objective, noisy=not exact, site="the summed level histogram",
                                 quantum=len(sites) * 2.0 ** -GRID_BITS)
        v = sums.get("val_loss")
        if validating and v is not None:
            v = np.asarray(v, dtype=np.float64).reshape(-1)
            if v.size != 2 or not np.isfinite(v).all():
                raise ValueError("the summed validation loss must be two finite numbers")
            n_val = sum(schema.rows(s, run.validation_part) for s in sites) if run.validation_part else None
            if exact and (v[0] < -1e-6 or (n_val is not None and abs(v[1] - n_val) > 0.5)):
                raise ValueError("the summed validation loss must be [loss >= 0, the validation rows declared]")

    return check


def _labels_total(run: _Run, *, exact: bool = True) -> Callable[[Mapping[str, np.ndarray], list[str]], None]:
    """``check_total`` of the start's label sums: class counts ≥ 0 summing to the summing sites'
    rows; ``[Σy, n]`` with ``n`` those rows (binary: ``0 ≤ Σy ≤ n``). ``exact=False`` (the DP
    release): the width and finiteness only."""
    p, fed = run.params, run.federation

    def check(sums: Mapping[str, np.ndarray], sites: list[str]) -> None:
        schema = fed.schema
        assert schema is not None
        s = np.asarray(sums.get("label_sums"), dtype=np.float64).reshape(-1)
        width = p.n_classes if p.objective == "multiclass" else 2
        if s.size != width or not np.isfinite(s).all():
            raise ValueError(f"the summed label sums must be {width} finite numbers")
        if exact:
            _exact_label_total(s, sum(schema.rows(x, run.train_part) for x in sites), p.objective)

    return check


def _exact_label_total(s: np.ndarray, n: int, objective: str) -> None:
    tol = 1e-6 * max(n, 1) + 1e-3
    if objective == "multiclass":
        if (s < -tol).any() or abs(s.sum() - n) > tol:
            raise ValueError(f"the summed class counts do not count the {n} rows declared")
    elif abs(s[1] - n) > tol or (objective == "binary" and not -tol <= s[0] <= n + tol):
        raise ValueError(f"the summed label sums do not fit the {n} rows declared")


def _floor_validation(val: np.ndarray | None) -> np.ndarray | None:
    """Post-processing of noisy validation loss sums: ``[max(loss, 0), max(rows, 1)]``."""
    if val is None:
        return None
    v = np.asarray(val, dtype=np.float64).reshape(2)
    return np.array([max(v[0], 0.0), max(v[1], 1.0)])


def _val_sums(val: np.ndarray | None) -> np.ndarray:
    if val is None:
        raise FederationError("no validation loss sums came back")
    v = np.asarray(val, dtype=np.float64).reshape(2)
    if not v[1] > 0:
        raise FederationError("early stopping needs validation rows: no site has any in its validation part")
    return v


def _evaluate(run: _Run, model: GBDTModel, classes: list[str], part: str, bins: int | None) -> dict[str, Any]:
    """The final evaluation on ``part``: the training workflow's for classification
    (:func:`~fedtab.federation.steps.evaluate.evaluate`, kind ``gbdt_evaluate``); for regression
    the regression sums (:func:`_score_step`, kind ``gbdt_score``)."""
    from fedtab.federation.steps.params import params_to
    from fedtab.federation.steps.evaluate import evaluate

    federation = run.federation
    arrays = {k: v for k, v in model.to_arrays().items() if k not in ("edges", "edge_ptr")}
    n = len(federation.active)
    start = len(federation.traffic.records)

    def wire() -> dict[str, int]:
        recs = federation.traffic.records[start:]
        return {"wire_down": sum(t.bytes_down for t in recs), "wire_up": sum(t.bytes_up for t in recs)}

    if model.params.objective != "regression":
        out = evaluate(federation, arrays, len(classes), part, bins, has_proba=True, ledger=run.ledger,
                       on_error=run.on_error, kind="gbdt_evaluate")
        run.log.append({"step": "gbdt_evaluate", "round": -1, "level": -1, "nodes": 0,
                        "bytes_down": payload_bytes(Message("e", params_to(arrays))) * n, "bytes_up": 0, **wire()})
        return out
    step = _score_step(federation, arrays, part)
    scored = run.run(step)
    assert scored.summed is not None
    up = 8 * sum(int(np.size(v)) for v in scored.summed.sums.values()) * len(scored.summed.sites)
    run.log.append({"step": "gbdt_score", "round": -1, "level": -1, "nodes": 0,
                    "bytes_down": payload_bytes(step.request) * n, "bytes_up": up, **wire()})
    return scored.result


def _score_step(federation: Federation, arrays: Mapping[str, Any], part: str) -> SumStep[dict[str, Any]]:
    """A regression model's ``gbdt_score`` pair: RMSE, MAE and R² from the sites' regression sums
    (:func:`~fedtab.federation.steps.evaluate.evaluate_regression_step`); its DP release is the
    noisy squared-error sum only (each row's error clipped at the site), pooled into the RMSE."""
    from fedtab.federation.steps.evaluate import evaluate_regression_step

    def rmse(summed: Summed) -> dict[str, Any]:
        sse = float(summed.sums["sse"][0])
        rows = sum(federation.schema.rows(s, part) for s in summed.sites)
        return {"pooled": {"rmse": float(np.sqrt(max(sse, 0.0) / rows)) if rows else None, "n": rows}, "per_site": {}}

    from fedtab.federation.steps.params import params_to

    noisy = SumStep(Message("gbdt_score", params_to(dict(arrays)), {"part": part}), SumSpec({"sse": MOMENT_BITS}), None, rmse,
                    robust=lambda summed: (rmse(summed), {}), kind="gbdt_score")
    step = evaluate_regression_step(federation, dict(arrays), part, kind="gbdt_score")
    step.noisy = NoisyRelease(noisy, "training.evaluate")
    return step
