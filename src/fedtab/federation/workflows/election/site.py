"""The election workflow's site side: the ballot (the site's own selector on its training rows) and the elected mask it stores."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedtab.federation.site.data import fill_with_column_means, numeric_matrix
from fedtab.privacy.dp import DP_META, noise_rng, noisy_scores
from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.observed import measured_frame
from fedtab.federation.protocol.schema import SCHEMA_HASH, columns_hash
from fedtab.federation.protocol.kinds import declared as _declared
from fedtab.federation.site.core import Site
from fedtab.federation.site.mods import site_params, with_params
from fedtab.federation.site.registry import Handler, handler




__all__ = ["abstention_reason", "ballot_reply", "dp_ballot", "dp_described", "pack_mask", "unpack_mask",
           "compact_counts", "wire_scores", "BALLOT_RELEASES", "SCORE_TOLERANCE"]

#: the most a ballot's scores may move any per-site min-max-normalised score by travelling as float32
SCORE_TOLERANCE = 1e-6

def abstention_reason(y: np.ndarray, min_site_rows: int = 0) -> str | None:
    """Why a site with labels ``y`` should not vote, or ``None`` if it can.

    A site abstains when it has fewer than ``min_site_rows`` rows, or when its target
    takes a single value: a selector then has nothing to rank features against and
    would vote noise (ANOVA scores all 0) or fail (non-finite scores). Under strong
    label skew (Dirichlet α = 0.1 over 30 sites) a third of the sites are in that case.
    """
    if len(y) < min_site_rows:
        return f"{len(y)} training rows, fewer than min_site_rows={min_site_rows}"
    import pandas as pd  # here: the election module is also imported for set_mask, which needs no pandas

    values = pd.unique(np.asarray(y))
    if values.size < 2:
        if not values.size:
            return "no training rows"
        return "the training rows hold a single target value"
    return None


def ballot_reply(site: Site, kind: str, spec: Any, frame: Any, y: np.ndarray, min_site_rows: int = 0,
                 pvalues: bool = False, *, no_pvalues: str | None = None) -> Message:
    """Run the site's selector (or ``spec``) on ``frame``/``y`` and pack the ballot reply.

    Missing cells are filled with the local column mean for selection only. A site
    that cannot vote (see :func:`abstention_reason`) replies with meta ``abstain``
    (the reason) and ``n_samples`` and no arrays. With ``pvalues`` the reply also carries the
    selector's test p-values (array ``pvalues``) and the site's effective sample size (meta
    ``n_effective``, its Stouffer weight, :func:`~fedtab.election.evidence.effective_rows`).
    Under DP the ballot's mod (:func:`dp_ballot`) turns the reply into a noisy ballot.

    Args:
        no_pvalues: why p-values cannot be sent (a ballot release that does not cover them);
            ``None``: they can.

    Raises:
        ValueError: ``pvalues`` asked of a selector that computes none (naming it), or while
            ``no_pvalues`` says why not.
    """
    X = numeric_matrix(frame, site.name)  # a table that cannot vote is still an error, not an abstention
    reason = abstention_reason(y, min_site_rows)
    if reason is not None:
        return Message(kind, meta={"abstain": reason, "n_samples": int(len(y))})
    from fedtab.election.selectors import make_selector  # imports scikit-learn: only where a site votes

    selector = make_selector(spec if spec is not None else site.selector)
    X = fill_with_column_means(X)
    sel = selector.select(X, y)
    mask, scores = np.asarray(sel.mask, dtype=bool), np.asarray(sel.scores, dtype=np.float64)
    arrays = {"mask": mask, "scores": wire_scores(scores, mask)}
    extra: dict[str, Any] = {}
    if pvalues:
        if no_pvalues is not None:
            raise ValueError(no_pvalues)
        if sel.pvalues is None:
            raise ValueError(f"selector {selector.name!r} computes no p-values; consensus=stouffer needs a selector "
                             "built on a test (anova, chi2, or a scikit-learn SelectKBest/SelectFdr over one)")
        from fedtab.election.evidence import effective_rows
        from fedtab.election.selectors import is_regression_target

        arrays["pvalues"] = np.asarray(sel.pvalues, dtype=np.float64)
        extra = {"n_effective": effective_rows(y, is_regression_target(y))}
    arrays["mask"] = pack_mask(arrays["mask"])
    columns = list(map(str, frame.columns.tolist()))
    declared = list(map(str, site.feature_names))
    if columns != declared:  # a subset of its declared columns: their positions, never their names
        position = {c: i for i, c in enumerate(declared)}
        arrays["column_index"] = np.fromiter((position[c] for c in columns), dtype=np.uint32, count=len(columns))
    return Message(kind, arrays, {"n_features": len(columns), SCHEMA_HASH: columns_hash(declared),
                                  "n_samples": int(len(y)), "selector": selector.name, **extra})


def dp_ballot(site: Site, request: Message, call_next: Handler) -> Message:
    """The ballot's mod under DP (:mod:`fedtab.federation.site.mods`): no p-values asked of the
    selector, then the ballot's mask and scores replaced by the noisy ballot of its scores
    (:func:`~fedtab.privacy.dp.noisy_scores`); an abstention passes as it is."""
    reply = call_next(site, with_params(request, no_pvalues="p-values cannot be sent with a differentially "
                                                            "private ballot"))
    if "scores" not in reply.arrays:
        return reply
    mask, scores = noisy_scores(reply.arrays["scores"], request.meta[DP_META], noise_rng())
    return Message(reply.kind, {**reply.arrays, "mask": pack_mask(mask), "scores": wire_scores(scores, mask)},
                   reply.meta)


def wire_scores(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A ballot's ``(d,)`` scores as they travel: float32 (half the bytes of float64) when that moves
    no per-site min-max-normalised ``|score|`` (over all features, and over the kept ones as FLARE
    normalises) by more than :data:`SCORE_TOLERANCE`, else the float64 scores unchanged.

    The vote reads only normalised scores (:func:`~fedtab.election.tally.normalise_scores`), so a
    float32 ballot elects what the float64 one would, up to features whose weighted votes lie within
    ``SCORE_TOLERANCE`` of each other. Scores beyond float32's range, or spread so that float32
    merges distinct values, stay float64.
    """
    from fedtab.election.tally import normalise_scores

    s = np.asarray(scores, dtype=np.float64)
    with np.errstate(over="ignore"):
        s32 = s.astype(np.float32)
    if not np.isfinite(s32).all():
        return s
    m = np.asarray(mask, dtype=bool)
    wide = s32.astype(np.float64)
    for how in ("all", "selected"):
        if not np.all(np.abs(normalise_scores(m, wide, how) - normalise_scores(m, s, how)) <= SCORE_TOLERANCE):
            return s  # (a NaN difference fails too)
    return s32


def pack_mask(mask: Any) -> np.ndarray:
    """A boolean ``(d,)`` mask as bits on the wire: ``uint8`` of ``ceil(d / 8)`` bytes (``np.packbits``,
    big-endian bit order, the padding bits zero)."""
    return np.packbits(np.asarray(mask, dtype=bool))


def unpack_mask(bits: Any, n: int, what: str = "mask") -> np.ndarray:
    """The ``(n,)`` boolean mask of :func:`pack_mask`'s ``bits``.

    Raises:
        ValueError: not a 1-D ``uint8`` array of exactly ``ceil(n / 8)`` bytes, or padding bits set.
    """
    b = np.asarray(bits) if bits is not None else None
    if b is None or b.dtype != np.uint8 or b.ndim != 1 or b.size != (n + 7) // 8:
        got = "nothing" if b is None else f"{b.dtype} of shape {b.shape}"
        raise ValueError(f"{what} must be {(n + 7) // 8} packed bytes (uint8) for {n} columns, got {got}")
    out = np.unpackbits(b, count=None)
    if out[n:].any():
        raise ValueError(f"{what} has bits set beyond its {n} columns")
    return out[:n].astype(bool)


#: a ballot over the training part: the selector's mask and scores (and p-values)
BALLOT_RELEASES = _declared("ballot").releases  # declared in fedtab.federation.protocol.kinds


@handler("ballot")
def _ballot(site: Site, request: Message) -> Message:
    columns = request.meta.get("features")
    if columns is not None:
        held = site.feature_set
        columns = [c for c in columns if c in held]
    frame, y = site.xy("train", columns)
    frame = measured_frame(site, frame, "train")  # imputed cells are no evidence (issue 22)
    if site.keeps_matrices:  # a ClientApp process per message: spare set_mask and the first round the file
        from fedtab.federation.site.matrices import store_part_matrices

        store_part_matrices(site)
    return ballot_reply(site, "ballot", request.meta.get("selector"), frame, y,
                        _min_rows(request.meta.get("min_site_rows", 0)), pvalues=request.meta.get("pvalues") is True,
                        **site_params(request))


def _min_rows(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"min_site_rows must be a non-negative integer, got {value!r}")
    return value


@handler("set_mask")
def _set_mask(site: Site, request: Message) -> Message:
    features = request.meta.get("features")
    if features is None and "elected" in request.arrays:  # bits over the agreed columns (hash checked on arrival)
        schema = site.state.get("schema")
        columns = schema.get("columns") if isinstance(schema, dict) else None
        if not isinstance(columns, list):
            raise ValueError("set_mask refers to an agreed schema this site has not received")
        bits = unpack_mask(request.arrays["elected"], len(columns), "the elected mask")
        features = [c for c, b in zip(columns, bits.tolist()) if b]
    if not isinstance(features, list) or not set(map(type, features)) <= {str}:
        raise ValueError("set_mask needs a list of feature names")
    site.state["features"] = list(features)
    from fedtab.federation.site.matrices import held_features  # the stored matrices' columns: no table read

    held_set = held_features(site)
    held = [f for f in features if f in held_set]
    meta: dict[str, Any] = {"kept": len(features), "held": len(held)}
    part = request.meta.get("describe")
    if part is None:
        return Message("set_mask", meta=meta)
    from fedtab.federation.steps.describe import describe_site  # the training workflow's "describe" answer, same exchange

    described = describe_site(site, list(features), str(part), **site_params(request))
    # the server knows the features it elected: the description does not echo their names
    described_meta = {k: v for k, v in described.meta.items() if k != "features"}
    return Message("set_mask", {**described.arrays, "count": compact_counts(described.arrays["count"])},
                   {**meta, "describe": described_meta})


def dp_described(site: Site, request: Message, call_next: Handler) -> Message:
    """The ``"set_mask"`` mod under DP: the description it carries released as the ``"describe"``
    mod releases it (:func:`fedtab.federation.steps.describe.dp_moments`)."""
    from fedtab.federation.steps.describe import description_params, noised_moments

    spec = request.meta[DP_META]
    reply = call_next(site, with_params(request, **description_params(spec)))
    if "count" not in reply.arrays:  # nothing described (a DP request always asks for it: dp_terms)
        return reply
    feats = list(site.state["features"])  # the elected features the handler stored (no names echoed)
    return Message(reply.kind, noised_moments(site, reply.arrays, feats, spec), reply.meta)


def compact_counts(count: np.ndarray) -> np.ndarray:
    """Exact counts (non-negative integers) in the smallest unsigned dtype that holds them (``uint16``
    for a site of fewer than 65,536 rows: a quarter of ``int64``'s bytes); anything else as it is."""
    c = np.asarray(count)
    if c.dtype.kind not in "iu" or not c.size or c.min() < 0:
        return c
    return c.astype(np.min_scalar_type(int(c.max())), copy=False)
