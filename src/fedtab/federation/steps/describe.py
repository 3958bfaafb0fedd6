"""The description: per-feature moments of a part, and the pooled standardisation they give.

* site side, ``"describe"`` — per feature, the count, sum and sum of squares of the observed
  values of a row part, and the site's class labels (:func:`describe_site`); counts below
  ``min_rows`` are suppressed; under DP the kind's mod (:func:`dp_moments`, applied by ``Site.handle``)
  asks for the exact moments of values clipped into the public bounds and noises the three arrays;
* server side, :func:`describe` / :func:`describe_step` — the sites' moments summed through the
  run's summing strategy (plain, secure, noisy, robust), checked against the agreed schema, and
  :func:`standardisation` / :func:`pooled_standardisation` from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np

from fedtab.federation.protocol import Federation, FederationError, Summed, SumSpec, validate
from fedtab.federation.protocol.kinds import declared as _declared
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.modes import NoisyRelease, Reduction, SumStep, run_strategy
from fedtab.federation.protocol.reduce import (
    cap_weights,
    moment_summaries,
    screen_sites,
    usable_counts,
)
from fedtab.federation.protocol.schema import sort_labels
from fedtab.federation.site.core import Site
from fedtab.federation.site.mods import site_params, with_params
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import (
    label_keys,
    requested_features,
    site_matrix,
)
from fedtab.federation.site.parts import canonical_part
from fedtab.privacy.accountant import PrivacyLedger
from fedtab.privacy.dp import (
    DP_META,
    clip_values,
    column_bounds,
    moment_release,
)
from fedtab.privacy.suppression import suppress_small
from fedtab.privacy.secagg import MOMENT_BITS


__all__ = ["describe_site", "pooled_standardisation", "Description", "describe_checker", "exact_moments", "noisy_moments", "describe_step", "Carrier", "describe", "as_description", "standardisation", "DESCRIBE_RELEASES", "DESCRIBE_FIELDS", "dp_moments",
           "noised_moments", "description_params"]


def _suppress_rare_ones(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, X: np.ndarray, min_rows: int
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The moments with every 0/1 column whose ones number ``1 .. min_rows - 1`` zeroed: its sum
    counts rows. The test part is one-hot encoded as the model file encodes it, so a category
    this site holds in fewer than ``min_rows`` rows has an indicator of its own there
    (:func:`fedtab.federation.steps.encoding._one_hot_table`); a description over rows that
    include the test part must not count them."""
    obs = ~np.isnan(X)
    binary = ~(obs & (X != 0) & (X != 1)).any(axis=0)
    ones = (obs & (X == 1)).sum(axis=0)
    small = binary & (ones > 0) & (ones < min_rows)
    if not small.any():
        return count, total, sumsq
    return tuple(np.where(small, 0, a).astype(np.asarray(a).dtype) for a in (count, total, sumsq))  # type: ignore


def describe_site(site: Site, feats: list[str], part: str = "train", *, bounds: Any = None, suppress: bool = True
                  ) -> Message:
    """The ``"describe"`` reply of ``site`` over ``feats`` on row part ``part``.

    Arrays ``count``/``sum``/``sumsq`` (per feature, observed cells only; a feature the
    site lacks has count 0); meta ``classes`` (label keys), ``n_train`` (rows of
    ``part``), ``n_test`` and ``features``.

    Args:
        bounds: public value bounds (``[lo, hi]`` or ``{column: [lo, hi]}``,
            :func:`~fedtab.privacy.dp.column_bounds`): the values are clipped into them first.
        suppress: zero the cells counted from fewer than ``min_rows`` rows (and, over the test
            part, the rare one-hot indicators); ``False``: the exact moments (a release mod noises
            them instead: :func:`dp_moments`).

    Raises:
        ValueError: ``bounds`` without valid bounds for a held column.
    """
    X, y = site_matrix(site, feats, part)
    if bounds is not None:
        X = clip_values(X, *_bounds(site, feats, bounds))
    obs = ~np.isnan(X)
    Xz = np.where(obs, X, 0.0)
    labels = [] if getattr(site, "target_kind", "classes") == "regression" else sorted(set(np.unique(label_keys(y)).tolist()))
    count, total, sumsq = obs.sum(axis=0).astype(np.int64), Xz.sum(axis=0), (Xz * Xz).sum(axis=0)
    if suppress:
        count, total, sumsq = suppress_small(count, site.policy.min_rows, total, sumsq)
        if canonical_part(part) in ("test", "all"):
            count, total, sumsq = _suppress_rare_ones(count, total, sumsq, X, site.policy.min_rows)
    return Message(
        "describe",
        {"count": count, "sum": total, "sumsq": sumsq},
        {"classes": labels, "n_train": int(len(y)), "n_test": site.n_rows("test"), "features": feats},
    )


def _bounds(site: Site, feats: list[str], bounds: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` ``(d,)`` of ``feats`` from the public ``bounds``; ``(0, 0)`` for a column the site lacks."""
    return column_bounds({"bounds": bounds}, feats, held=[f for f in feats if f in site.table.columns])


def noised_moments(site: Site, moments: Mapping[str, np.ndarray], feats: list[str], spec: Mapping[str, Any]
                   ) -> dict[str, np.ndarray]:
    """The exact ``count``/``sum``/``sumsq`` of values clipped into ``spec["bounds"]`` as a DP release:
    each a Gaussian release at :func:`~fedtab.privacy.dp.moment_sensitivity` (``spec``: a request's
    DP settings)."""
    return moment_release(moments, *_bounds(site, feats, spec.get("bounds")), spec)


def description_params(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The description's parameters for a DP release of it (``spec``: the DP settings): values
    clipped into the public bounds, nothing suppressed (the noise protects small cells;
    data-dependent suppression would void the guarantee)."""
    return {"bounds": spec.get("bounds"), "suppress": False}


def dp_moments(site: Site, request: Message, call_next: Callable[[Site, Message], Message]) -> Message:
    """The ``"describe"`` mod under DP (:mod:`fedtab.federation.site.mods`): the exact moments of the
    clipped values (:func:`description_params`), then each array a Gaussian release
    (:func:`noised_moments`)."""
    spec = request.meta[DP_META]
    reply = call_next(site, with_params(request, **description_params(spec)))
    if reply.is_error or reply.is_refusal:
        return reply
    return Message(reply.kind, noised_moments(site, reply.arrays, list(reply.meta["features"]), spec), reply.meta)


#: the description: per-feature moments over a part (counts suppressed below min_rows)
DESCRIBE_RELEASES = _declared("describe").releases  # declared in fedtab.federation.protocol.kinds


@handler("describe")
def _describe(site: Site, request: Message) -> Message:
    return describe_site(site, requested_features(site, request), str(request.meta.get("part") or "train"),
                         **site_params(request))


#: the description's summed arrays and their fixed-point bits under secure sums
DESCRIBE_FIELDS = {"count": 0, "sum": MOMENT_BITS, "sumsq": MOMENT_BITS}


def pooled_standardisation(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, *, floor: bool = True
                           ) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` ``(d,)`` of each column from summed per-column ``count``/``sum``/``sumsq``
    (observed cells): 0 where nothing was observed; with ``floor`` a std that is not above
    1e-12 becomes 1 (a constant column stays 0 after standardising)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / np.maximum(count, 1), 0.0)
        var = np.where(count > 0, sumsq / np.maximum(count, 1) - mean**2, 0.0)
    std = np.sqrt(np.maximum(var, 0.0))
    if floor:
        std[~(std > 1e-12)] = 1.0
    return mean, std


# ----------------------------------------------------------------------------- describe
@dataclass
class Description:
    """The pooled description of the training features: what the setup is made from.

    Attributes:
        features: the columns described; classes: the agreed class labels (sorted union).
        count / total / sumsq: ``(d,)`` pooled per-feature moments.
        per_site: ``{site: (count, sum, sumsq)}`` (empty when the sums were secure or streamed).
        sites: the sites whose values are in the pool.
        noisy: the moments are DP releases (not exact counts).
    """

    features: list[str]
    classes: list[str]
    count: np.ndarray
    total: np.ndarray
    sumsq: np.ndarray
    per_site: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    sites: list[str] = field(default_factory=list)
    noisy: bool = False


def describe_checker(federation: Federation, features: list[str] | None, part: str, *,
                     arrays: Callable[[np.ndarray, np.ndarray, np.ndarray, int, frozenset[str], list[str]], None]
                     | None = None) -> Callable[[str, Message], None]:
    """Validator of ``"describe"`` replies over ``features`` (``None``: the site's choice) on ``part``.

    The features are the ones asked for and the site declared; the row counts are the
    declared ones. ``arrays(count, sum, sumsq, rows, held columns, features)`` checks the
    moments (default :func:`exact_moments`: counts are integers within the rows, zero for
    columns the site does not hold, the moments consistent; a DP release uses
    :func:`noisy_moments`: finiteness and ``|x| <= MAX_SUM``). The arrays are checked only
    when present (a secure sum sends them masked).
    """
    expected = None if features is None else list(features)
    checked_for: list[Any] = []  # the schema the expected list was validated against (once, not per site)
    check_arrays = exact_moments if arrays is None else arrays

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        feats = reply.meta.get("features")
        if expected is not None and feats != expected:
            raise ValueError("described other features than the ones to train on")
        if expected is None or not (checked_for and checked_for[0] is schema):
            feats = schema.check_features(site, feats, within="federation", what="described features")
            if expected is not None:
                checked_for[:] = [schema]  # equal to ``expected`` and valid: later equal lists are too
        schema.check_classes(site, reply.meta.get("classes"))
        d = len(feats)
        n = -1
        if "n_train" in reply.meta:
            n = validate.integer(reply.meta.get("n_train"), f"{part} rows", equal=schema.rows(site, part))
            validate.integer(reply.meta.get("n_test"), "test rows", equal=schema.rows(site, "test"))
        if "count" not in reply.arrays:
            return
        count, total, sumsq = (validate.array(reply, k, (d,)) for k in ("count", "sum", "sumsq"))
        check_arrays(count, total, sumsq, n, frozenset(schema.column_set(site)), list(feats))

    return check


def exact_moments(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, n: int, held: frozenset[str],
                  feats: list[str]) -> None:
    """Exact per-feature moments of ``n`` rows: integer counts within ``n``, none for a column
    the site does not hold (``held``), consistent moments (raises ``ValueError``)."""
    validate.counts(count, n, "feature counts")
    if not held.issuperset(feats) and [f for f, c in zip(feats, count) if c > 0 and f not in held]:
        raise ValueError("counts values of features it did not declare")
    validate.moments(count, total, sumsq, "feature moments")


def noisy_moments(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, n: int, held: frozenset[str],
                  feats: list[str]) -> None:
    """DP releases of the moments: not integer counts; only their magnitude can be checked."""
    for k, a in (("counts", count), ("sums", total), ("sums of squares", sumsq)):
        validate.bounded(a, f"noisy feature {k}")


def _description_of(federation: Federation, summed: Any, unpack: Callable[[Message], Message] | None,
                    noisy: bool) -> Description:
    feats, classes = None, set()
    for name, reply in summed.replies.items():
        meta = (unpack(reply) if unpack else reply).meta
        if feats is None:
            feats = meta.get("features")
        elif meta.get("features") != feats:
            federation.drop(name, "describes different features than the others")
        classes |= {str(c) for c in meta.get("classes", [])}
    per_site = {  # each site's moments when the server sees them (not in a secure sum's one total)
        s: tuple(np.asarray((unpack(r) if unpack else r).arrays[k], dtype=np.float64) for k in DESCRIBE_FIELDS)
        for s, r in summed.parts.items() if s in federation.active}
    return Description(list(feats or []), sort_labels(classes), *(summed.sums[k] for k in DESCRIBE_FIELDS),
                       per_site=per_site, sites=list(summed.sites), noisy=noisy)


def describe_step(federation: Federation, features: list[str] | None, part: str,
                  carrier: "Carrier | None" = None) -> SumStep[Description]:
    """The description's configure/aggregate pair (see :func:`describe`), carried by ``carrier``
    (default: its own ``"describe"`` exchange, :class:`Carrier`); its DP release is 3 releases of
    the carrier's budget ``step``, its robust reduction the same description (the moments are
    screened when standardising: :func:`standardisation`). ``carrier.stream``: plain sums are
    running sums (:attr:`~fedtab.federation.protocol.summing.SumSpec.stream`: no per-site moments
    kept, ``per_site`` empty, unless the run is robust)."""
    c = carrier or Carrier()
    kind, meta, unpack, step, check_reply, request_arrays, stream = (c.kind, c.meta, c.unpack, c.step, c.check_reply,
                                                                     c.arrays, c.stream)
    body: dict[str, Any] = dict(meta or {})
    if kind == "describe":
        body.update({"part": part, **({"features": list(features)} if features is not None else {})})

    def pair(arrays: Any, bits: Mapping[str, int], noisy: bool) -> SumStep[Description]:
        check = describe_checker(federation, features, part, arrays=arrays)

        def checked(site: str, reply: Message) -> None:
            if check_reply is not None:
                check_reply(site, reply)
            check(site, unpack(reply) if unpack is not None else reply)

        def aggregate(summed: Summed) -> Description:
            return _description_of(federation, summed, unpack, noisy)

        return SumStep(Message(kind, dict(request_arrays or {}), meta=body), SumSpec(dict(bits), stream=stream), checked,
                       aggregate, robust=lambda summed: (aggregate(summed), {}), kind=kind)

    exact = pair(exact_moments, DESCRIBE_FIELDS, False)
    exact.noisy = NoisyRelease(pair(noisy_moments, {k: MOMENT_BITS for k in DESCRIBE_FIELDS}, True), step, 3)
    return exact


@dataclass(frozen=True)
class Carrier:
    """The exchange that carries a description (:func:`describe`): by default its own
    ``"describe"`` exchange; the election's ``"set_mask"`` carries it instead with ``kind``, its
    request ``meta`` and ``arrays`` (added to the request), ``unpack`` (finds the description in a
    reply), ``check_reply`` (validates the rest of a reply) and the budget ``step`` it is paid from
    under DP; ``stream``: the moments are running sums (:func:`describe_step`)."""

    kind: str = "describe"
    meta: Mapping[str, Any] | None = None
    arrays: Mapping[str, Any] | None = None
    unpack: Callable[[Message], Message] | None = None
    check_reply: Callable[[str, Message], Any] | None = None
    step: str = "training.describe"
    stream: bool = False


def describe(federation: Federation, features: list[str] | None, part: str, ledger: PrivacyLedger | None = None,
             *, on_error: Literal["raise", "skip"] | None = None, carrier: Carrier | None = None) -> Description:
    """The description exchange (its own ``"describe"``, or another exchange carrying it:
    ``carrier``, e.g. the election's ``"set_mask"``), on the run's strategy (:func:`run_strategy`).

    Raises:
        FederationError: a site failed or sent an implausible description (naming it).
        ValueError: DP without the run's accountant (``ledger``).
    """
    pair = describe_step(federation, features, part, carrier)
    return run_strategy(federation, ledger).run(federation, pair, on_error=on_error).result


def as_description(described: Any, features: list[str] | None, federation: Federation) -> Description:
    """A :class:`Description` from what a caller already gathered: a :class:`Description`, or the
    older ``{site: "describe" reply}`` (checked to describe ``features``).

    Raises:
        ValueError: no replies. FederationError: a reply describes other features.
    """
    if isinstance(described, Description):
        if features is not None and described.features != list(features):
            raise FederationError("the sites described other features than the ones to train on")
        return described
    if not described:
        raise ValueError("described holds no site replies")
    replies = {s: r for s, r in described.items() if s in federation.active}
    for name, reply in replies.items():
        if features is not None and reply.meta.get("features") != list(features):
            raise FederationError(f"site {name!r} described other features than the ones to train on")

    sums = {k: sum(np.asarray(r.arrays[k], dtype=np.float64) for r in replies.values()) for k in DESCRIBE_FIELDS}
    return _description_of(federation, Summed(sums, None, dict(replies), list(replies)), None, False)


def standardisation(federation: Federation, d: Description) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """``(mean, std, left out)`` of the training setup from the description, on the run's
    strategy: the pooled moments, or (robust) screened and capped per-site moments; DP: the
    mean/std are kept within the public bounds. Counts below 1 are noise (an exact count is
    an integer: 0 stays 0)."""
    count = np.where(d.count >= 1, d.count, 0.0)

    def pooled() -> tuple[np.ndarray, np.ndarray]:
        return pooled_standardisation(count, d.total, d.sumsq, floor=False)

    def robust() -> tuple[tuple[np.ndarray, np.ndarray], dict[str, str]]:
        kept, mean, var, left_out = _robust_moments(d.per_site, d.features, federation.options.max_site_share)
        mean = np.where(kept > 0, mean, 0.0)
        return (mean, np.sqrt(np.maximum(np.where(kept > 0, var, 0.0), 0.0))), left_out

    def within_bounds(ms: tuple[np.ndarray, np.ndarray], settings: Mapping[str, Any]
                      ) -> tuple[np.ndarray, np.ndarray]:
        if settings.get("bounds") is None:
            return ms
        lo, hi = column_bounds(settings, d.features)  # keep noisy moments within the bounds
        return np.clip(ms[0], lo, hi), np.minimum(ms[1], hi - lo)

    out = run_strategy(federation).reduce(Reduction(pooled, robust, within_bounds))
    mean, std = out.result
    std[~(std > 1e-12)] = 1.0
    return mean, std, out.measurements.left_out


def _robust_moments(moments: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]], feats: list[str],
                    max_site_share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, str]]:
    """(count, mean, var, left out) from per-site (count, sum, sumsq): screened, then capped shares."""
    summary = {name: moment_summaries(*m) for name, m in moments.items()}
    left_out = screen_sites({n: v[0] for n, v in summary.items()}, {n: v[1] for n, v in summary.items()},
                            columns=feats, what="describe")
    kept = [n for n in moments if n not in left_out]
    counts = np.stack([usable_counts(moments[n][0]) for n in kept])  # noisy (DP) counts below 1: none
    w = cap_weights(counts, max_site_share)
    m = np.nan_to_num(np.stack([summary[n][0] for n in kept]))
    sd = np.nan_to_num(np.stack([summary[n][1] for n in kept]))
    mean = (w * m).sum(axis=0)
    var = (w * (sd**2 + m**2)).sum(axis=0) - mean**2
    return counts.sum(axis=0), mean, var, {n: f"describe: {why}" for n, why in left_out.items()}
