"""The GBDT workflow's site side: its handlers over the site's fixed row parts.

* ``"gbdt_summary"`` — for classification, the class labels of the named part (no value of
  any column).
* ``"gbdt_sketch"`` — counts of the site's training rows per feature over a public grid (the
  constant range grid, or the fine grid of an agreed range: :mod:`fedtab.learn.gbdt.sketch`),
  in runs of at least the site's ``min_rows`` rows; summed by the run's strategy. The site's
  policy accepts one fine grid per column per period (``fedtab.privacy.policy._gbdt_sketch``),
  and later accepts bin edges only on that grid or inside public bounds. Under DP the raw
  counts with Gaussian noise from the site's budget (each request charged; the edges of a DP
  run must then lie on the fine grid of the site's last DP sketch or be the public bounds' grid).
* ``"gbdt_start"`` — the agreed edges, classes and parameters: the site bins its rows, keeps
  its boosting state (:class:`~fedtab.learn.gbdt.SiteBooster`, stored as plain arrays in
  ``site.state["gbdt"]`` so an engine can keep it between processes) and replies its label
  sums (for the intercept).
* ``"gbdt_level"`` — one level of one round: the site applies the splits of the previous level
  (and, at a round's first level, the leaf values of the previous round), then replies the
  histograms of the requested nodes through its release rules
  (:func:`~fedtab.learn.gbdt.release.release_level`: small nodes withheld, small bins merged,
  sums on a fixed grid; DP noise instead under DP) — packed when the request says ``pack`` and
  the level is sent in the clear without DP (``hist`` then holds the non-zero slots in grid units
  and :data:`~fedtab.learn.gbdt.release.PACKED` their bit mask: the same numbers; a secure or DP
  level stays dense) — and, when asked, the loss sums of its
  validation part. A request with no nodes only applies what it carries (the last round).
* ``"gbdt_evaluate"`` — the evaluation sums of a classification model (arrays of
  :meth:`~fedtab.learn.gbdt.GBDTModel.to_arrays`, validated as a hostile model) on a part:
  the training workflow's sums (per class: every class needs ``min_rows`` rows there);
  ``"gbdt_score"`` — a regression model's sums of squared and absolute errors, of the target and of its square on a part (only the squared errors under DP).
* ``"gbdt_importance"`` — each feature's summed split gain on the site's training rows,
  replayed from the site's own record of the splits and leaf values it applied (no model of
  the server's choosing; small nodes suppressed; refused after a secure or DP run).

The site never takes a size, a seed or a floor from the server: parts are its own
(:mod:`fedtab.federation.site.parts`), the subsample is drawn from its own seed, its floor is the
larger of its policy's and the request's.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedtab.learn.gbdt import BinLayout, GBDTModel, GBDTParams, SiteBooster, label_sums
from fedtab.learn.gbdt.sketch import SKETCH_BINS, dp_counts_sensitivity, grid_counts, merge_counts, sketch_grids
from fedtab.learn.gbdt.importance import SPLIT_RECORD, SiteRecord, record_splits, site_gains
from fedtab.learn.metrics import regression_sums
from fedtab.learn.gbdt.release import PACKED, check_request, histogram_sensitivity, noisy_level, pack_level, release_level
from fedtab.privacy.dp import add_noise, noise_rng
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.kinds import declared as _declared
from fedtab.federation.site.core import Site
from fedtab.federation.site.mods import site_params
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import class_indices, label_keys, requested_bins, site_matrix
from fedtab.federation.steps.evaluate import evaluation_sums

__all__ = ["STATE", "SPLIT", "LEAF", "MODEL", "PACKED", "site_data", "SUMMARY_PART"]

#: ``site.state`` key of the boosting state (plain arrays: an engine keeps it between processes)
STATE = "gbdt"
#: ``site.state`` key of the live booster of this process (not encodable: an engine leaves it out)
LIVE = "gbdt_live"
#: request array prefixes: the previous level's splits, the previous round's leaf values, a model
SPLIT, LEAF, MODEL = "split:", "leaf:", "model:"
#: the loss of one row is clipped here for the DP validation sums (−ln 1e-16 = 36.8)
_MAX_ROW_LOSS = 36.85


def _floor(site: Site, request: Message) -> int:
    asked = request.meta.get("min_rows", 1)
    asked = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 1 else 1
    return max(int(site.policy.min_rows), asked)


def _features(request: Message) -> list[str]:
    feats = request.meta.get("features")
    if not isinstance(feats, list) or not feats or not all(isinstance(f, str) for f in feats):
        raise ValueError("the request must name the features (a non-empty list of column names)")
    return feats


def _check_target(site: Site, request: Message) -> None:
    target = request.meta.get("target")
    if target is not None and target != site.target:
        raise ValueError("the request names another target column than the site's")


def site_data(site: Site, features: list[str], part: str, classes: list[str] | None,
              regression: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of ``part``: ``X`` over ``features`` with NaN for missing cells and absent
    columns (no imputation: a missing value follows each split's default direction), ``y`` class
    indices in ``classes`` or, for regression, float labels.

    Raises:
        ValueError: a non-numeric column (encode categories first), unknown labels.
    """
    X, y_raw = site_matrix(site, features, part)
    if regression:
        y = np.asarray(y_raw, dtype=np.float64)
        if not np.isfinite(y).all():
            raise ValueError("regression labels must be finite numbers")
        return X, y
    return X, class_indices(y_raw, list(classes or []))


# ----------------------------------------------------------------------------- summary, sketch
#: the part every sketch count is computed over, whatever the request names
SUMMARY_PART = "train"


@handler("gbdt_summary")
def _summary(site: Site, request: Message) -> Message:
    """The class labels of the named part (classification) and its rows. No value of any
    column: the bin edges come from public bounds or the sketch (:func:`_sketch`)."""
    _check_target(site, request)
    part = str(request.meta.get("part") or "train")
    feats = _features(request)
    X, y = site_matrix(site, feats, part)
    meta: dict[str, Any] = {"n": int(X.shape[0])}
    if not request.meta.get("regression"):
        meta["classes"] = sorted(set(np.unique(label_keys(y)).tolist()))
    return Message("gbdt_summary", {}, meta)


#: ``site.state`` key of the fine grids of this site's last DP sketch (``{column: [lo, hi, steps]}``):
#: the grid a DP run's bin edges of a column without public bounds must lie on
DP_SKETCH = "gbdt_dp_sketch"


@handler("gbdt_sketch")
def _sketch(site: Site, request: Message) -> Message:
    """``counts`` ``(features, width)``: per feature, the site's training rows over a public
    grid (:func:`~fedtab.learn.gbdt.sketch.sketch_grids`: ``stage = "range"`` the constant
    range grid, ``"fine"`` the fine grid of the request's ``lo``/``hi``, which the site's policy
    checked and fixed for the period), in runs of at least the site's ``min_rows`` rows
    (:func:`~fedtab.learn.gbdt.sketch.merge_counts`) in plain and secure runs. Under DP the raw
    counts, which the site then noises at the declared sensitivity (``√features``,
    :func:`_sketch_sensitivity`, the kind's ``Releases.dp_noise``); a DP fine stage's grids are
    kept (``state[DP_SKETCH]``) as the grids a DP run's edges must lie on."""
    feats = _features(request)
    stage = request.meta.get("stage")
    grids, width = sketch_grids(stage, request.meta.get("lo"), request.meta.get("hi"), len(feats))
    X, _ = site_matrix(site, feats, SUMMARY_PART)
    counts = grid_counts(X, grids, width)
    if site_params(request).get("noise") is None:  # plain/secure; under DP its mod sets the noise
        return Message("gbdt_sketch", {"counts": merge_counts(counts, int(site.policy.min_rows))}, {})
    if stage == "fine":
        kept = dict(site.state.get(DP_SKETCH) or {})
        kept.update({f: [float(a), float(b), SKETCH_BINS] for f, a, b in
                     zip(feats, np.asarray(request.meta["lo"], float).tolist(),
                         np.asarray(request.meta["hi"], float).tolist())})
        site.state[DP_SKETCH] = kept
    return Message("gbdt_sketch", {"counts": counts}, {})


def _sketch_sensitivity(request: Message) -> float:
    """L2 sensitivity of a sketch's counts to adding or removing one row: ``√features``
    (:func:`~fedtab.learn.gbdt.sketch.dp_counts_sensitivity`)."""
    feats = request.meta.get("features")
    return dp_counts_sensitivity(len(feats) if isinstance(feats, list) else 1)


# ----------------------------------------------------------------------------- start
def _start_part(site: Any, request: Message) -> str:
    return str(request.meta.get("part") or "train")


@handler("gbdt_start")
def _start(site: Site, request: Message) -> Message:
    _check_target(site, request)
    meta = request.meta
    params = GBDTParams.from_dict(meta.get("params") or {})
    layout = BinLayout.from_arrays({"edges": request.arrays["edges"], "edge_ptr": request.arrays["edge_ptr"]})
    feats = _features(request)
    if len(feats) != layout.n_features:
        raise ValueError("the bin edges do not match the features")
    regression = params.objective == "regression"
    classes = None if regression else meta.get("classes")
    if not regression and (not isinstance(classes, list) or len(classes) != params.n_classes):
        raise ValueError("the request's classes do not match its number of classes")
    part = _start_part(site, request)
    noise = site_params(request).get("noise")  # the Gaussian release the sums are made under (its DP mod)
    X, y = site_data(site, feats, part, classes, regression)
    X_val = y_val = None
    val_part = meta.get("validation_part")
    if val_part is not None:
        X_val, y_val = site_data(site, feats, str(val_part), classes, regression)
    margin0 = np.zeros(params.n_outputs, dtype=np.float32)  # the intercept comes with the first level
    secret = int(np.random.default_rng([site.seed, 0x6BD7]).integers(2**31))  # the site's own stream
    booster = SiteBooster(X, y, layout, params, margin0, X_val=X_val, y_val=y_val, secret=secret)
    site.state.pop(LIVE, None)
    site.state[STATE] = {"booster": booster.to_state(), "features": feats, "classes": classes,
                         "part": part, "validation_part": val_part, "splits": None, "started": False,
                         "min_rows": _floor(site, request), "noised": noise is not None, "masked": False,
                         **_empty_record(params.n_outputs)}
    sums = _label_sums(params, y, noise)
    return Message("gbdt_start", {"label_sums": np.asarray(sums, dtype=np.float64)}, {"n": int(len(y))})


def _label_sums(params: GBDTParams, y: np.ndarray, noise: Mapping[str, Any] | None) -> np.ndarray:
    """The label sums for the intercept (:func:`~fedtab.learn.gbdt.label_sums`). With ``noise`` (the
    DP settings its mod sets) the site bounds a row's part first: regression labels are clipped to ``[−clip, clip]`` here,
    so that one row moves ``[Σy, n]`` by at most ``max(2·clip, √(clip² + 1))`` (replaced,
    added or removed); a class count moves by 1 (two counts when a row is replaced, √2)."""
    if noise is None:
        return np.asarray(label_sums(params, y), dtype=np.float64)
    if params.objective == "regression":
        c = float(noise.get("clip", 1.0))
        yc = np.clip(np.asarray(y, dtype=np.float64), -c, c)
        sums, sens = np.array([float(yc.sum()), float(yc.size)]), max(2.0 * c, float(np.hypot(c, 1.0)))
    else:
        sums, sens = np.asarray(label_sums(params, y), dtype=np.float64), float(np.sqrt(2.0))
    return np.asarray(add_noise(sums, sens, noise, noise_rng()), dtype=np.float64)


# ----------------------------------------------------------------------------- level
def _state(site: Site) -> dict[str, Any]:
    st = site.state.get(STATE)
    if not isinstance(st, dict) or "booster" not in st:
        raise ValueError("boosting is not set up on this site (no 'gbdt_start' request received)")
    return st


def _booster(site: Site, st: dict[str, Any]) -> SiteBooster:
    """The live booster when this process answered the last request, else rebuilt from the state's arrays."""
    live = site.state.get(LIVE)
    if isinstance(live, tuple) and live[0] is st["booster"]:
        return live[1]
    return SiteBooster.from_state(st["booster"])


def _level_part(site: Any, request: Message) -> str:
    st = site.state.get(STATE) if site is not None else None
    return str(st.get("part", "train")) if isinstance(st, dict) else "train"


def _level_releases(request: Message) -> int:
    return 1 + (1 if request.meta.get("validate") else 0)


def _carried(request: Message, prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix):]: v for k, v in request.arrays.items() if k.startswith(prefix)}


def _sibling_counts(booster: SiteBooster, nodes: np.ndarray, splits: Mapping[str, np.ndarray] | None) -> np.ndarray:
    """Rows (of the round's subsample) of each requested node's sibling in the last splits (0: none)."""
    out = np.zeros(nodes.shape[0])
    if not splits or not np.asarray(splits.get("tree", [])).size or booster.keep is None:
        return out
    sib: dict[tuple[int, int], int] = {}
    for k, a, b in zip(*(np.asarray(splits[x]).tolist() for x in ("tree", "left", "right"))):
        sib[(k, a)], sib[(k, b)] = b, a
    keep = None if booster.keep.all() else booster.keep.astype(np.float64)  # None: every row drawn
    per_node: dict[int, np.ndarray] = {}  # tree -> subsampled rows of each of its nodes (one pass per tree)
    for i, (k, node) in enumerate(nodes.tolist()):
        other = sib.get((k, node))
        if other is not None:
            if k not in per_node:
                per_node[k] = np.bincount(booster.positions[k], weights=keep)
            rows = per_node[k]
            out[i] = float(rows[other]) if other < rows.size else 0.0
    return out


def _empty_record(n_outputs: int) -> dict[str, np.ndarray]:
    """The site's record of what it applied (for :func:`_importance`): splits, leaf values, intercept."""
    return {"grown": np.zeros((0, len(SPLIT_RECORD)), np.int64), "grown_leaves": np.zeros(0, np.float32),
            "grown_leaf_ptr": np.zeros(1, np.int64), "base_margin": np.zeros(n_outputs, np.float32)}


def _record(st: dict[str, Any], round_: int, splits: Mapping[str, np.ndarray]) -> None:
    """Append one level's applied splits to the site's record (its level: the round's next)."""
    rec = np.asarray(st["grown"], dtype=np.int64).reshape(-1, len(SPLIT_RECORD))
    this = rec[rec[:, 0] == round_, 1]
    st["grown"] = record_splits(rec, round_, int(this.max()) + 1 if this.size else 0, dict(splits))


@handler("gbdt_level")
def _level(site: Site, request: Message) -> Message:
    """One level (module docstring). Every check runs before anything is applied: a refused
    request (a replay, another round, malformed splits or leaves, both children of a split)
    changes no site state."""
    st = _state(site)
    booster = _booster(site, st)
    meta = request.meta
    p = booster.params
    splits = _carried(request, SPLIT)
    leaves = _carried(request, LEAF)
    base = request.arrays.get("base_margin")
    nodes = np.asarray(request.arrays.get("nodes", np.zeros((0, 2))), dtype=np.int64).reshape(-1, 2)
    # ---- checks (nothing applied yet)
    if meta.get("round") != booster.round + (1 if leaves else 0):
        raise ValueError("the request is for another round than the site's (a replayed or out-of-order level)")
    if splits:
        _check_splits(booster, splits)
    tree_leaves = _check_leaves(booster, leaves) if leaves else None
    if base is not None:  # the intercept, once, before the first round
        if booster.round != 0 or st["started"] or leaves:
            raise ValueError("the intercept may only be set before the first round")
        base = np.asarray(base, dtype=np.float32).reshape(-1)
        if base.shape != (p.n_outputs,) or not np.isfinite(base).all():
            raise ValueError(f"base_margin must be {p.n_outputs} finite numbers")
    started = st["started"] and not leaves
    new_round = bool(nodes.size) and meta.get("level") == 0 and not started
    if nodes.size and not new_round and not started:
        raise ValueError("a level request before the round's first level")
    if nodes.size and not new_round:
        last = splits or st.get("splits") or None
        if last is not None:  # with the nodes this level already released (a second request for the sibling)
            seen = np.zeros((0, 2), np.int64) if splits else np.asarray(st.get("released") or [],
                                                                          dtype=np.int64).reshape(-1, 2)
            check_request(np.vstack([seen, nodes]), last["left"], last["right"], last["tree"])
    # ---- apply
    if splits:
        booster.apply(splits)
        st["splits"], st["released"] = splits, []
        _record(st, booster.round, splits)
    if tree_leaves is not None:
        values = np.asarray(leaves["values"], dtype=np.float32)
        booster.finish_round(tree_leaves)
        st["grown_leaves"] = np.concatenate([st["grown_leaves"], values])
        st["grown_leaf_ptr"] = np.r_[st["grown_leaf_ptr"], st["grown_leaf_ptr"][-1] + np.asarray(leaves["ptr"])[1:]]
        st["started"] = False
    if base is not None:
        booster.margins[:] = base[None, :]
        st["base_margin"] = base
        if booster.val_margins is not None:
            booster.val_margins[:] = base[None, :]
    out, reply_meta = _level_reply(st, booster, nodes, new_round, meta)
    st["booster"] = booster.to_state()
    site.state[LIVE] = (st["booster"], booster)
    return Message("gbdt_level", out, reply_meta)


def _level_reply(st: dict[str, Any], booster: SiteBooster, nodes: np.ndarray, new_round: bool,
                 meta: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of a checked and applied level request: the validation loss sums when
    asked, and the requested nodes' histograms through the site's release rules (noised instead
    under the request's DP settings; packed when asked and sent in the clear). Starts the round
    (``new_round``) and records the released nodes in ``st``."""
    p = booster.params
    out: dict[str, np.ndarray] = {}
    reply_meta: dict[str, Any] = {"round": int(booster.round)}
    params = site_params(meta)  # set by the kind's mods: noise (DP), masked (secure sums)
    noise = params.get("noise")
    if params.get("masked"):
        st["masked"] = True
    if meta.get("validate"):
        if booster.val_margins is None:
            out["val_loss"], reply_meta["n_val"] = np.zeros(2), 0
        else:
            out["val_loss"], reply_meta["n_val"] = _validation_sums(booster, noise), int(booster.y_val.size)
    if nodes.size:
        if new_round:
            booster.start_round()
            if noise is not None and p.objective == "regression":  # bounded gradients for the sensitivity
                c = float(noise.get("clip", 1.0))
                booster.grad = np.clip(booster.grad, -c, c).astype(np.float32)
            st["started"], st["splits"], st["released"] = True, None, []
        last = st.get("splits") or None
        st["released"] = [*(st.get("released") or []), *nodes.tolist()]
        hist, counts = booster.histograms_and_counts(nodes)
        if noise is not None:
            sens = histogram_sensitivity(p.objective, booster.layout.n_features, p.n_outputs,
                                         float(noise.get("clip", 1.0)))
            out["hist"] = noisy_level(hist, sens, float(noise["z"]), noise_rng())
        else:
            released, withheld = release_level(hist, counts, _sibling_counts(booster, nodes, last), booster.layout,
                                               int(st["min_rows"]))
            out["hist"] = released
            if not params.get("masked"):  # a per-site count the secure sum would otherwise leave in the clear
                reply_meta["withheld"] = withheld
                if meta.get("pack") is True:  # sent in the clear: the same numbers in fewer bytes
                    out["hist"], out[PACKED] = pack_level(released)
    return out, reply_meta


def _check_splits(booster: SiteBooster, splits: Mapping[str, np.ndarray]) -> None:
    """A level's split message (:data:`~fedtab.learn.gbdt.grow.SPLIT_MESSAGE`): equal-length
    integer arrays naming trees, features and bins that exist.

    Raises:
        ValueError: otherwise.
    """
    need = ("tree", "node", "feature", "bin", "default_left", "left", "right")
    if set(splits) != set(need):
        raise ValueError(f"a level's splits must carry exactly {list(need)}")
    a = {k: np.asarray(splits[k]) for k in need}
    n = a["tree"].size
    if any(v.ndim != 1 or v.size != n or v.dtype.kind not in "iub" for v in a.values()):
        raise ValueError("a level's splits must be equal-length 1-d integer arrays")
    if not n:
        return
    lay = booster.layout
    feat, b = a["feature"].astype(np.int64), a["bin"].astype(np.int64)
    if (a["tree"].min() < 0 or a["tree"].max() >= booster.params.n_outputs or feat.min() < 0
            or feat.max() >= lay.n_features or a["node"].min() < 0 or a["left"].min() < 0 or a["right"].min() < 0):
        raise ValueError("a split names a tree, node or feature that does not exist")
    if (b < -1).any() or (b >= lay.n_bins[feat]).any():
        raise ValueError("a split names a bin outside the agreed grid")


def _check_leaves(booster: SiteBooster, leaves: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """One round's leaf values as one array per tree, each covering its tree's nodes.

    Raises:
        ValueError: a pointer that does not give one array per tree, non-finite or huge values,
            or a tree whose values do not cover the nodes its rows are in.
    """
    p = booster.params
    values, ptr = np.asarray(leaves.get("values"), dtype=np.float32), np.asarray(leaves.get("ptr"), dtype=np.int64)
    if ptr.shape != (p.n_outputs + 1,) or ptr[0] != 0 or ptr[-1] != values.size or (np.diff(ptr) < 1).any():
        raise ValueError("leaf values must come as one array per tree of the round")
    if not np.isfinite(values).all() or np.abs(values).max(initial=0) > 1e6:
        raise ValueError("leaf values must be finite and at most 1e6 in magnitude")
    out = [values[ptr[k]:ptr[k + 1]] for k in range(p.n_outputs)]
    for k, v in enumerate(out):
        for pos in (booster.positions, booster.val_positions):
            if pos is not None and pos[k].size and pos[k].max() >= v.size:
                raise ValueError(f"leaf values of tree {k} do not cover the rows' nodes")
    return out


def _validation_sums(booster: SiteBooster, noise: Mapping[str, Any] | None) -> np.ndarray:
    """``[loss sum, n]`` of the site's validation rows; with ``noise`` (DP) each row's loss is bounded
    (classification: −ln 1e-16; regression: the squared error clipped at ``clip²``) and the
    sums noised with that sensitivity."""
    sums = booster.validation_sums()
    if noise is None:
        return np.asarray(sums, dtype=np.float64)
    if booster.params.objective == "regression":
        c = float(noise.get("clip", 1.0))
        err = (booster.val_margins[:, 0].astype(np.float64) - np.asarray(booster.y_val, dtype=np.float64)) ** 2
        sums = np.array([float(np.minimum(err, c * c).sum()), float(err.size)])
        sens = float(np.hypot(c * c, 1.0))
    else:
        sens = float(np.hypot(_MAX_ROW_LOSS, 1.0))
    return np.asarray(add_noise(sums, sens, noise, noise_rng()), dtype=np.float64)


# ----------------------------------------------------------------------------- evaluate
EVALUATE_RELEASES = _declared("gbdt_evaluate").releases  # declared in fedtab.federation.protocol.kinds


class _Fitted:
    """A trained model in the shape :func:`~fedtab.federation.steps.evaluate.evaluation_sums` calls."""

    def __init__(self, model: GBDTModel) -> None:
        self.model = model

    def predict(self, params: Any, X: np.ndarray) -> np.ndarray:
        return self.model.predict(X)

    def predict_proba(self, params: Any, X: np.ndarray) -> np.ndarray:
        return self.model.predict_proba(X)


def _model_from(request: Message, st: Mapping[str, Any]) -> GBDTModel:
    from fedtab.learn.gbdt.model import FORMAT, VERSION

    arrays = {k[len("param:"):]: v for k, v in request.arrays.items() if k.startswith("param:")}
    params = SiteBooster.from_state(st["booster"]).params
    manifest = {"format": FORMAT, "version": VERSION, "params": params.to_dict(),
                "feature_names": list(st["features"]), "best_iteration": None}
    for k in ("left", "right", "feature", "bin", "tree_ptr"):
        if k in arrays:
            arrays[k] = np.asarray(arrays[k]).astype(np.int64 if k == "tree_ptr" else np.int32)
    if "default_left" in arrays:
        arrays["default_left"] = np.asarray(arrays["default_left"]).astype(bool)
    for k in ("threshold", "value", "base_weight", "gain", "cover", "base_margin"):
        if k in arrays:
            arrays[k] = np.asarray(arrays[k], dtype=np.float32)
    arrays.pop("edges", None), arrays.pop("edge_ptr", None)
    model = GBDTModel.from_arrays(manifest, arrays)
    layout = BinLayout.from_arrays(st["booster"]["layout"])
    inner = model.nodes["left"] >= 0
    agreed = layout.threshold(model.nodes["feature"][inner], model.nodes["bin"][inner])
    if not np.array_equal(agreed, model.nodes["threshold"][inner]):  # no threshold of the server's choosing
        raise ValueError("the model to evaluate splits at thresholds that are not the agreed bin edges")
    return model


@handler("gbdt_score")
def _score(site: Site, request: Message) -> Message:
    """Regression: ``[squared error sum]`` of a model on a part (each row's error clipped at the
    DP clip under DP)."""
    st = _state(site)
    model = _model_from(request, st)
    if model.params.objective != "regression":
        raise ValueError("gbdt_score scores regression models; classification uses gbdt_evaluate")
    X, y = site_data(site, st["features"], str(request.meta.get("part") or "test"), None, True)
    pred = model.predict(X) if len(y) else np.zeros(0)
    err = (pred - y) ** 2
    noise = site_params(request).get("noise")  # the Gaussian release the sum is made under (its DP mod)
    if noise is None:  # the regression sums of fedtab.learn.metrics.regression_sums
        sums = regression_sums(y, pred)
        return Message("gbdt_score", {k: np.array([v]) for k, v in sums.items()}, {"n": int(len(y))})
    c = float(noise.get("clip", 1.0))
    noisy = add_noise(np.array([float(np.minimum(err, c * c).sum())]), c * c, noise, noise_rng())
    return Message("gbdt_score", {"sse": noisy}, {"n": int(len(y))})


@handler("gbdt_evaluate")
def _evaluate(site: Site, request: Message) -> Message:
    st = _state(site)
    model = _model_from(request, st)
    part = str(request.meta.get("part") or "test")
    if model.params.objective == "regression":
        raise ValueError("gbdt_evaluate scores classification models; regression uses gbdt_score")
    X, y = site_data(site, st["features"], part, st["classes"], False)
    out = evaluation_sums(_Fitted(model), {}, X, y, len(st["classes"]), requested_bins(request.meta),
                          pairs=not site_params(request).get("masked"))  # masked: set by the secure mod
    return Message("gbdt_evaluate", out, {"n": int(len(y))})  # under DP the site noises it as declared


# ----------------------------------------------------------------------------- importance
@handler("gbdt_importance")
def _importance(site: Site, request: Message) -> Message:
    """``gain`` ``(d,)``: each feature's summed split gain on the site's training rows over the
    first ``meta["rounds"]`` rounds (:func:`~fedtab.learn.gbdt.importance.site_gains`), replayed
    from the site's own record of the splits and leaf values it applied — the server sends no
    model. Splits with a node or child of 1 to ``min_rows − 1`` of the site's rows add nothing
    (``suppressed`` counts them).

    Refused (an error reply) after a secure or DP run (a per-site number is what those runs
    keep from the server), when the site's policy requires secure aggregation or DP, for
    more rounds than the site grew, and a second time in one boosting run (the server asks
    once, for the kept rounds: answers for ``r`` and ``r + 1`` rounds would give one round's
    gains). A plain release over the server's splits: the policy refuses it unless the site
    opted in (``allow_server_row_sets``).
    """
    st = _state(site)
    if st.get("masked") or st.get("noised") or site.policy.require_secure_aggregation or site.policy.require_dp:
        raise ValueError("this site releases per-site importance only after a plain run (secure aggregation and "
                         "DP keep per-site statistics from the server)")
    rounds = request.meta.get("rounds")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError("the request must name the rounds to count (a non-negative integer)")
    if st.get("importance_released"):
        raise ValueError("this site releases its importance once per boosting run (for the kept rounds); it did")
    booster = _booster(site, st)
    if rounds > booster.round:
        raise ValueError("the request asks for more rounds than the site grew")
    record = SiteRecord(st["grown"], st["grown_leaves"], st["grown_leaf_ptr"])
    out = site_gains(booster.bins, booster.y, booster.layout, booster.params, st["base_margin"], record, rounds,
                     int(st["min_rows"]))
    st["importance_released"] = True  # once per run: gains for r and r + 1 rounds would give one round's
    return Message("gbdt_importance", {"gain": out.total}, {"n": int(booster.y.size), "suppressed": out.suppressed})
