"""The GBDT workflow's server loop: bins agreed once, then one exchange per depth level.

Exchanges of a run (``R`` rounds, depth ``D``): ``gbdt_summary`` (bin summaries and class
labels; under DP only the labels, the edges come from public bounds), ``gbdt_start`` (edges,
classes, parameters; label sums for the intercept, summed), then per round one
``gbdt_level`` per depth level for all open nodes of the round's trees (``K`` trees for
``K`` classes are grown together), each carrying the previous level's splits and, at a
round's first level, the previous round's leaf values (and asking for the validation loss
sums when early stopping); one closing ``gbdt_level`` without nodes delivers the last
round's leaves; and ``gbdt_evaluate`` on the test part. So a tree costs at most ``D``
exchanges, plus one exchange for the whole run's last leaves: ``R·D + 4`` at most.

Histograms are sums: they travel by the run's summing strategy (``federation.options``):
plain, or masked by secure aggregation; the sites round them to a fixed grid first
(:mod:`fedtab.learn.gbdt.release`), so both give the same trees bit for bit. DP: the sites
noise every histogram, label sum and validation sum on their own terms, paid from the run's
accountant (steps ``gbdt.labels``, ``gbdt.level``, ``training.evaluate``). Robust mode: each
node's pooled histogram caps every site's share of the node's hessian mass at
``max_site_share``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Literal, Mapping

import numpy as np

from ...learn.gbdt import BinLayout, Booster, GBDTModel, GBDTParams, base_margin, merge_summaries
from ...learn.gbdt.pooled import as_params
from ...learn.gbdt.release import GRID_BITS
from ...learn.metrics import SCORE_BINS
from ...privacy.dp import DP_META, dp_request
from ...privacy.secagg import MOMENT_BITS
from ..messages import Message
from ..protocol import Federation, FederationError, SumSpec, exchange, exchange_sums, run_ledger, set_quorum
from ..schema import agree_schema, sort_labels
from ..training.site import check_part
from .site import LEAF, SPLIT
from .steps import labels_checker, level_checker, payload_bytes, public_edges, robust_pool, summary_checker

__all__ = ["GBDTOutcome", "run_gbdt", "dp_plan"]


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

    @property
    def level_exchanges(self) -> list[dict[str, Any]]:
        return [e for e in self.exchanges if e["step"] == "gbdt_level"]

    @property
    def exchanges_per_tree(self) -> float:
        """Level exchanges (the closing one included) per boosting round (a round's ``K`` trees grow together)."""
        rounds = max({e["round"] for e in self.level_exchanges if e["nodes"]} | {0}) + 1
        return len(self.level_exchanges) / rounds


def dp_plan(params: GBDTParams, validating: bool) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per step, noise scale per step)`` of one DP boosting run, for the accountant."""
    levels = params.n_trees * params.max_depth
    val = params.n_trees if validating else 0
    return {"gbdt.labels": 1, "gbdt.level": levels + val, "training.evaluate": 1}, {}


def _resolve(params: GBDTParams, classes: list[str]) -> GBDTParams:
    if params.objective == "regression":
        return params
    if len(classes) < 2:
        raise ValueError(f"classification needs at least 2 classes across the sites, found {classes}")
    if len(classes) == 2 and params.objective == "binary":
        return params
    return replace(params, objective="multiclass", n_classes=len(classes))


def run_gbdt(
    federation: Federation,
    features: list[str] | None = None,
    target: str | None = None,
    params: GBDTParams | Mapping[str, Any] | None = None,
    *,
    train_part: str | None = None,
    validation_part: str | None = None,
    eval_part: str = "test",
    score_bins: int | None = SCORE_BINS,
    min_sites: int | None = None,
    on_error: Literal["raise", "skip"] | None = None,
    on_round: Callable[[int, float | None], None] | None = None,
) -> GBDTOutcome:
    """Federated histogram gradient boosting (see the module docstring for the exchanges).

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
        min_sites / on_error: the quorum and failure policy (as :func:`~fedtab.federation.training.run_training`).
        on_round: progress callback ``(round, pooled validation metric or None)``.

    Raises:
        FederationError: a site failed or replied implausibly (naming it).
        ValueError: bad parameters, fewer than two classes, DP without public bounds.
    """
    t0 = time.perf_counter()
    p = as_params(params)
    early = p.early_stopping_rounds is not None
    train_part = train_part or ("fit" if early else "train")
    validation_part = validation_part if validation_part is not None else ("validation" if early else None)
    for part in (train_part, eval_part, *(() if validation_part is None else (validation_part,))):
        check_part(part)
    set_quorum(federation, min_sites)
    p0, dropped0 = len(federation.participation), set(federation.dropped)
    opts = federation.options
    noisy = opts.dp is not None
    regression = p.objective == "regression"
    if noisy and regression and validation_part is not None:
        raise ValueError("early stopping under DP needs a bounded validation loss: not available for regression")
    if federation.schema is None:
        agree_schema(federation)
    feats = list(features) if features is not None else list(federation.schema.columns)
    log: list[dict[str, Any]] = []
    seen = [len(federation.traffic.records)]

    def record(step: str, request: Message, n_sites: int, up: int, round_: int = -1, level: int = -1,
               nodes: int = 0) -> None:
        wire = federation.traffic.records[seen[0]:]  # what the engine measured (a secure sum's rounds included)
        seen[0] = len(federation.traffic.records)
        log.append({"step": step, "round": round_, "level": level, "nodes": nodes,
                    "bytes_down": payload_bytes(request) * n_sites, "bytes_up": up,
                    "wire_down": sum(t.bytes_down for t in wire), "wire_up": sum(t.bytes_up for t in wire)})

    # 1. bin summaries and class labels
    base_meta = {"features": feats, "part": train_part, "min_rows": p.min_rows, "regression": regression,
                 **({"target": target} if target is not None else {})}
    request = Message("gbdt_summary", meta={**base_meta, "sketch_size": p.sketch_size, "summary": not noisy})
    replies = exchange(federation, request, summary_checker(federation, len(feats), train_part,
                                                            sketch_size=p.sketch_size, min_rows=p.min_rows,
                                                            regression=regression, with_summary=not noisy),
                       on_error=on_error, step="gbdt_summary")
    record("gbdt_summary", request, len(replies), sum(payload_bytes(r) for r in replies.values()))
    classes = [] if regression else sort_labels({c for r in replies.values() for c in r.meta.get("classes", [])})
    p = _resolve(p, classes)
    if noisy:
        layout = public_edges(opts.dp, feats, p.max_bins)
    else:
        names = list(replies)
        layout = merge_summaries([replies[s].arrays for s in names], len(feats), max_bins=p.max_bins,
                                 sketch_size=p.sketch_size, min_rows=p.min_rows, sites=names)
    ledger = run_ledger(federation, *dp_plan(p, validation_part is not None)) if noisy else None

    def dp_meta(step: str, n: int = 1) -> dict[str, Any]:
        if ledger is None or n == 0:
            return {}
        ledger.spend(step, n)
        return {DP_META: dp_request(opts.dp, ledger.multiplier(step))}

    # 2. start: edges, classes, parameters -> label sums
    start = Message("gbdt_start", layout.to_arrays(),
                    {**base_meta, "classes": classes, "params": p.to_dict(), "validation_part": validation_part,
                     **dp_meta("gbdt.labels")})
    width = p.n_classes if p.objective == "multiclass" else 2
    summed = exchange_sums(federation, start, SumSpec({"label_sums": MOMENT_BITS if (regression or noisy) else 0}),
                           labels_checker(federation, train_part, p.objective, p.n_classes, noisy=noisy),
                           on_error=on_error, step="gbdt_start")
    record("gbdt_start", start, len(summed.sites), 8 * width * len(summed.sites))
    sums = np.asarray(summed.sums["label_sums"], dtype=np.float64)
    if noisy:
        sums = np.maximum(sums, 1e-6) if not regression else np.array([sums[0], max(sums[1], 1.0)])
    margin0 = base_margin(p, sums)
    booster = Booster(p, layout, margin0, feats)
    withheld: dict[str, int] = {}
    left_out: dict[str, float] = {}
    carry: dict[str, np.ndarray] = {"base_margin": margin0}
    validating = validation_part is not None

    def level(nodes: np.ndarray, round_: int, lvl: int, validate_now: bool) -> tuple[np.ndarray, np.ndarray | None]:
        meta: dict[str, Any] = {"round": round_, "level": lvl, "validate": validate_now}
        meta.update(dp_meta("gbdt.level", (1 if nodes.size else 0) + (1 if validate_now else 0)) if noisy else {})
        req = Message("gbdt_level", {**carry, "nodes": np.asarray(nodes, dtype=np.int32).reshape(-1, 2)}, meta)
        m = int(req.arrays["nodes"].shape[0])
        fields = {"hist": GRID_BITS} if m else {}
        if validate_now:
            fields["val_loss"] = MOMENT_BITS
        check = level_checker(federation, layout, m, train_part, validation_part, objective=p.objective, noisy=noisy,
                              validating=validate_now)
        if opts.robust:
            got = exchange(federation, req, check, on_error=on_error, step="gbdt_level")
            pooled = robust_pool(got, layout, opts.max_site_share) if m else (np.zeros((0, layout.n_slots, 2)), {})
            hist, shares = pooled
            left_out.update({s: v for s, v in shares.items() if v > opts.max_site_share})
            val = sum(np.asarray(r.arrays["val_loss"], dtype=np.float64) for r in got.values()) if validate_now else None
            replies_ = got
        else:
            out = exchange_sums(federation, req, SumSpec(fields), check, on_error=on_error, step="gbdt_level",
                                check_total=lambda s, _: _total_ok(s, m, layout))
            hist = out.sums.get("hist", np.zeros((0, layout.n_slots, 2))).reshape(m, layout.n_slots, 2)
            val = out.sums.get("val_loss") if validate_now else None
            replies_ = out.replies
        for s, r in replies_.items():
            if isinstance(r.meta.get("withheld"), int) and r.meta["withheld"]:
                withheld[s] = withheld.get(s, 0) + int(r.meta["withheld"])
        n_sites = len(replies_)
        record("gbdt_level", req, n_sites, n_sites * (m * layout.n_slots * 2 * 8 + (16 if validate_now else 0)),
               round_, lvl, m)
        return hist, val

    stopped = False
    while not booster.finished:
        r = len(booster.rounds)
        grower = booster.new_round()
        while not grower.done:
            ask_val = validating and r > 0 and grower.level == 0
            hist, val = level(grower.request(), r, grower.level, ask_val)
            if ask_val:
                metric = booster.record_validation(_val_sums(val, noisy))
                if on_round:
                    on_round(r - 1, metric)
                if booster.finished:  # early stopping: this round is not grown
                    stopped = True
                    break
            splits = grower.submit(hist)
            carry = {SPLIT + k: v for k, v in splits.items()}
        if stopped:
            break
        booster.add_round(grower)
        values = grower.leaf_values()
        carry.update({LEAF + "values": np.concatenate(values).astype(np.float32),
                      LEAF + "ptr": np.r_[0, np.cumsum([v.size for v in values])].astype(np.int64)})
        if on_round and not validating:
            on_round(r, None)
    if not stopped:  # the last round's leaves (and its validation loss)
        _, val = level(np.zeros((0, 2), dtype=np.int32), len(booster.rounds), 0, validating)
        if validating:
            metric = booster.record_validation(_val_sums(val, noisy))
            if on_round:
                on_round(len(booster.rounds) - 1, metric)
    model = booster.model()
    metrics = _evaluate(federation, model, classes, eval_part, score_bins, ledger, on_error, log)
    return GBDTOutcome(model=model, params=p, features=feats, classes=classes, metrics=metrics,
                       history=list(booster.history), exchanges=log, withheld=withheld, left_out=left_out,
                       participation=federation.participation[p0:],
                       dropped={s: why for s, why in federation.dropped.items() if s not in dropped0},
                       privacy=ledger.report() if ledger is not None else None, seconds=time.perf_counter() - t0)


def _total_ok(sums: Mapping[str, np.ndarray], m: int, layout: BinLayout) -> None:
    h = sums.get("hist")
    if m and (h is None or h.size != m * layout.n_slots * 2 or not np.isfinite(h).all()):
        raise ValueError("the summed level histogram does not have the requested shape")


def _val_sums(val: np.ndarray | None, noisy: bool) -> np.ndarray:
    if val is None:
        raise FederationError("no validation loss sums came back")
    v = np.asarray(val, dtype=np.float64).reshape(2)
    if noisy:
        v = np.array([max(v[0], 0.0), max(v[1], 1.0)])
    if not v[1] > 0:
        raise FederationError("early stopping needs validation rows: no site has any in its validation part")
    return v


def _evaluate(federation: Federation, model: GBDTModel, classes: list[str], part: str, bins: int | None,
              ledger: Any, on_error: Any, log: list[dict[str, Any]]) -> dict[str, Any]:
    """The final evaluation on ``part`` (the training workflow's for classification)."""
    from ..training.site import params_to
    from ..training.steps import evaluate

    arrays = {k: v for k, v in model.to_arrays().items() if k not in ("edges", "edge_ptr")}
    n = len(federation.active)
    start = len(federation.traffic.records)

    def wire() -> dict[str, int]:
        recs = federation.traffic.records[start:]
        return {"wire_down": sum(t.bytes_down for t in recs), "wire_up": sum(t.bytes_up for t in recs)}

    if model.params.objective != "regression":
        out = evaluate(federation, arrays, len(classes), part, bins, has_proba=True, ledger=ledger, on_error=on_error,
                       kind="gbdt_evaluate")
        log.append({"step": "gbdt_evaluate", "round": -1, "level": -1, "nodes": 0,
                    "bytes_down": payload_bytes(Message("e", params_to(arrays))) * n, "bytes_up": 0, **wire()})
        return out
    meta: dict[str, Any] = {"part": part}
    if ledger is not None:
        ledger.spend("training.evaluate")
        meta[DP_META] = dp_request(federation.options.dp, ledger.multiplier("training.evaluate"))
    req = Message("gbdt_score", params_to(arrays), meta)
    summed = exchange_sums(federation, req, SumSpec({"sse": MOMENT_BITS}), on_error=on_error, step="gbdt_score")
    sse = float(summed.sums["sse"][0])
    rows = sum(federation.schema.rows(s, part) for s in summed.sites)
    log.append({"step": "gbdt_score", "round": -1, "level": -1, "nodes": 0,
                "bytes_down": payload_bytes(req) * n, "bytes_up": 8 * len(summed.sites), **wire()})
    return {"pooled": {"rmse": float(np.sqrt(max(sse, 0.0) / rows)) if rows else None, "n": rows}, "per_site": {}}
