"""The training workflow's server steps: each builds its request, validates every reply and
reduces — plain or secure sums (the run's strategy), robust reducers, DP post-processing.

A step is a pair, as in Flower's strategies: the request is built here, the site's handler
(:mod:`.site`) answers, and the reduction here validates before it reduces. The modes are the
run's options (``federation.options``), read once per step:

* **plain** — each reply validated against the agreed schema (counts are integers within the
  rows the site declared, parameters finite and of the model's shapes...), then summed;
* **secure** — the summed arrays travel masked (:func:`~fedtab.federation.protocol.exchange_sums`),
  the server validates what the sites sent in the clear and the totals;
* **DP** — the sites noise their releases on their own terms; noisy values cannot be checked
  against exact counts, so only their shapes and finiteness are, and counts below 1 are noise;
* **robust** — per-site values, reduced by the robust reducers of :mod:`fedtab.federation.reduce`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Literal, Mapping

import numpy as np

from ...learn.metrics import REGRESSION_SUMS, evaluation_scores, pooled_ranking, regression_scores
from ...learn.models import FederatedModel, LogisticRegressionModel, Params
from ...privacy.accountant import PrivacyLedger
from ...privacy.dp import DP_GD_LR, DP_GD_NOISE_SCALE, DP_GD_STEPS_PER_EPOCH, DP_META, column_bounds, dp_request
from ...privacy.gate import SMOOTHED
from ...privacy.secagg import MOMENT_BITS
from .. import validate
from ..messages import Message
from ..protocol import SECURE_SUM, Federation, FederationError, Summed, SumSpec
from ..protocol.modes import NoisyRelease, Reduction, SumStep, declare_modes, run_strategy
from ..reduce import cap_weights, moment_summaries, robust_params, screen_sites, site_median, usable_counts
from ..schema import sort_labels
from .site import PARAM, SETUP, params_from, params_to

__all__ = ["TRAINING_MODES", "EXACT_TRAINING_MODES", "LINEAR_MODES", "describe_step", "fit_step", "evaluate_step",
           "exact_moments", "noisy_moments", "dp_fit_release", "Description", "describe", "as_description", "describe_checker", "pooled_standardisation",
           "fit_round", "evaluate", "checked_sums", "pool_evaluations", "was_smoothed", "smoothed_sites", "dp_plan",
           "exact_statistics_checker", "DESCRIBE_FIELDS", "standardisation", "fit_request", "dp_fit_settings",
           "median_scores", "evaluate_regression", "evaluate_regression_step", "pool_regression", "NEWTON_FIELDS",
           "newton_request", "newton_step", "newton_round", "NewtonSums"]

#: the modes the training steps support (an exact-aggregation model: no DP release)
TRAINING_MODES = declare_modes("training", "secure", "dp", "robust")
EXACT_TRAINING_MODES = declare_modes("training.exact", "secure", "robust")
#: the modes of an exact regression model (``linear``): its evaluation has no DP release and its
#: statistics no robust screen
LINEAR_MODES = declare_modes("training.linear", "secure")

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


def dp_plan(fm: FederatedModel, rounds: int, local_epochs: int, eval_every: int, described: bool
            ) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per step, noise scale per step)`` of one DP training run, for the accountant.

    Logistic regression by Newton–Raphson: 2 releases (gradient, Hessian) per iteration, at most
    ``rounds``; by FedAvg: DP gradient descent (``DP_GD_STEPS_PER_EPOCH`` releases per
    local epoch, each at ``DP_GD_NOISE_SCALE`` × the base multiplier); other FedAvg models by
    DP-FedAvg (one release per round); the description is 3 releases (unless it came with the
    election), each evaluation one.
    """
    if fm.name == "gbdt":  # boosted trees: releases per depth level, not per FedAvg round
        from ..gbdt.server import dp_plan as gbdt_plan

        return gbdt_plan(fm.gbdt_params(), fm.gbdt_params().early_stopping_rounds is not None)
    n_evals = 1 + (sum(1 for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds) if eval_every else 0)
    if isinstance(fm, LogisticRegressionModel) and fm.newton:  # a gradient and a Hessian per iteration
        return ({"training.describe": 0 if described else 3, "training.fit": 2 * rounds, "training.evaluate": n_evals},
                {"training.fit": 1.0})
    steps = DP_GD_STEPS_PER_EPOCH * int(local_epochs) if isinstance(fm, LogisticRegressionModel) else 1
    plan = {"training.describe": 0 if described else 3, "training.fit": rounds * steps, "training.evaluate": n_evals}
    return plan, {"training.fit": DP_GD_NOISE_SCALE if steps > 1 else 1.0}


# ----------------------------------------------------------------------------- describe
@dataclass
class Description:
    """The pooled description of the training features: what the setup is made from.

    Attributes:
        features: the columns described; classes: the agreed class labels (sorted union).
        count / total / sumsq: ``(d,)`` pooled per-feature moments.
        per_site: ``{site: (count, sum, sumsq)}`` (empty when the sums were secure).
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


def describe_step(federation: Federation, features: list[str] | None, part: str, *, kind: str = "describe",
                  meta: Mapping[str, Any] | None = None, unpack: Callable[[Message], Message] | None = None,
                  step: str = "training.describe", check_reply: Callable[[str, Message], Any] | None = None,
                  request_arrays: Mapping[str, Any] | None = None) -> SumStep[Description]:
    """The description's configure/aggregate pair (see :func:`describe`); its DP release is 3
    releases of ``step``'s budget, its robust reduction the same description (the moments are
    screened when standardising: :func:`standardisation`)."""
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

        return SumStep(Message(kind, dict(request_arrays or {}), meta=body), SumSpec(dict(bits)), checked,
                       aggregate, robust=lambda summed: (aggregate(summed), {}), kind=kind)

    exact = pair(exact_moments, DESCRIBE_FIELDS, False)
    exact.noisy = NoisyRelease(pair(noisy_moments, {k: MOMENT_BITS for k in DESCRIBE_FIELDS}, True), step, 3)
    return exact


def describe(federation: Federation, features: list[str] | None, part: str, ledger: PrivacyLedger | None = None,
             *, kind: str = "describe", meta: Mapping[str, Any] | None = None,
             unpack: Callable[[Message], Message] | None = None, step: str = "training.describe",
             check_reply: Callable[[str, Message], Any] | None = None,
             on_error: Literal["raise", "skip"] | None = None,
             arrays: Mapping[str, Any] | None = None) -> Description:
    """The description exchange (``kind`` ``"describe"``, or the election's ``"set_mask"``
    carrying it: ``meta`` and ``arrays`` add to the request, ``unpack`` finds the description in a
    reply, ``check_reply`` validates the rest of it), on the run's strategy (:func:`run_strategy`).

    Raises:
        FederationError: a site failed or sent an implausible description (naming it).
        ValueError: DP without the run's accountant (``ledger``).
    """
    pair = describe_step(federation, features, part, kind=kind, meta=meta, unpack=unpack, step=step,
                         check_reply=check_reply, request_arrays=arrays)
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


# ----------------------------------------------------------------------------- fit
def exact_statistics_checker(n_classes: int, n_features: int) -> Callable[[Params, int], None]:
    """Validator of exact-aggregation updates ``{"count": (C,), "sum": (C, d), "sumsq": (C, d)}``."""

    def check(p: Params, n: int) -> None:
        count = validate.counts(p["count"], n, "class counts")
        if count.sum() > n:  # less when the site suppressed a class below its min_rows
            raise ValueError(f"class counts sum to {count.sum():g}, more than the {n} rows declared")
        for c in range(n_classes):
            validate.moments(np.full(n_features, count[c]), p["sum"][c], p["sumsq"][c], "class moments")

    return check


def fit_step(federation: Federation, fm: FederatedModel, request: Message, template: Mapping[str, tuple[int, ...]],
             part: str, *, max_param_abs: float, n_classes: int, round_: int, dp_fit: Mapping[str, Any] | None = None
             ) -> SumStep[Params]:
    """One fit round's configure/aggregate pair: ``request`` (:func:`fit_request`), the
    sample-weighted sum of the updates (an exact model: the summed statistics); robust: the
    coordinate-wise median of the updates (an exact model: screened and capped statistics);
    DP (``dp_fit``: :func:`dp_fit_settings`, ``None`` when the model has no DP release): the
    updates are checked for shape and finiteness only (they are noisy by design)."""
    exact_check = None if not fm.exact else getattr(fm, "check_statistics", None) \
        or exact_statistics_checker(n_classes, template["sum"][1])  # a model may check its own statistics
    accepted: dict[str, tuple[Params, int]] = {}
    names = [PARAM + k for k in template]
    if fm.exact:
        spec = SumSpec({n: (0 if n == PARAM + "count" else MOMENT_BITS) for n in names}, drop_meta=("n_samples",))
    else:
        spec = SumSpec({n: None for n in names}, weighted=tuple(names), weight="n_samples")

    def checker(max_abs: float, statistics: Callable[[Params, int], None] | None) -> Callable[[str, Message], None]:
        def check_fit(site: str, reply: Message) -> None:
            assert federation.schema is not None
            if "n_samples" in reply.meta:
                n = validate.integer(reply.meta.get("n_samples"), "n_samples", equal=federation.schema.rows(site, part))
                if n == 0:
                    raise ValueError(f"has no {part} rows to train on")
            else:
                n = federation.schema.rows(site, part)
            if not any(k.startswith(PARAM) for k in reply.arrays):
                return  # masked: checked as a sum
            p = validate.parameters(params_from(reply), template, what="parameter", max_abs=max_abs)
            if statistics is not None:
                statistics(p, n)
            accepted[site] = (p, n)

        return check_fit

    def aggregate(summed: Summed) -> Params:
        if fm.exact:
            update = {k[len(PARAM):]: v for k, v in summed.sums.items()}
        else:
            n = summed.weight
            if n is None or not n > 0:
                raise FederationError("the summed sample count of the fit round is not positive")
            update = {k[len(PARAM):]: summed.sums[k] / n for k in names}
        if any(tuple(update[k].shape) != tuple(shape) for k, shape in template.items()):
            raise FederationError("the summed model update does not have the model's shapes")
        return fm.aggregate([(update, 1)])

    def robust(summed: Summed) -> tuple[Params, dict[str, str]]:
        updates = [accepted[s] for s in summed.replies]
        if fm.exact:
            params, dropped = _robust_exact(fm, updates, list(summed.replies), federation.options.max_site_share)
            return params, {n: f"fit round {round_}: {why}" for n, why in dropped.items()}
        return robust_params([p for p, _ in updates]), {}

    pair = SumStep(request, spec, checker(np.inf if fm.exact else max_param_abs, exact_check), aggregate, robust,
                   kind="fit")
    if dp_fit is not None:
        noisy = SumStep(request, spec, checker(np.inf, None), aggregate, robust, kind="fit")
        pair.noisy = NoisyRelease(noisy, "training.fit", int(dp_fit["steps"]),
                                  extra={"steps": dp_fit["steps"], "lr": dp_fit["lr"]})
    return pair


def fit_round(federation: Federation, fm: FederatedModel, request: Message, template: Mapping[str, tuple[int, ...]],
              part: str, *, max_param_abs: float, n_classes: int, round_: int,
              on_error: Literal["raise", "skip"] | None = None, ledger: PrivacyLedger | None = None,
              dp_fit: Mapping[str, Any] | None = None) -> tuple[Params, dict[str, str], dict[str, Message]]:
    """One FedAvg round (or an exact model's one round) on the run's strategy:
    ``(parameters, left out, replies)`` (see :func:`fit_step`); under DP the round's releases
    are spent from ``ledger`` before the request goes out.

    Raises:
        FederationError: no valid update; the summed update does not fit the template.
    """
    pair = fit_step(federation, fm, request, template, part, max_param_abs=max_param_abs, n_classes=n_classes,
                    round_=round_, dp_fit=dp_fit)
    out = run_strategy(federation, ledger).run(federation, pair, on_error=on_error)
    assert out.summed is not None
    return out.result, out.measurements.left_out, out.summed.replies


def _robust_exact(fm: FederatedModel, updates: list[tuple[Params, int]], names: list[str], max_site_share: float,
                  ) -> tuple[Params, dict[str, str]]:
    """An exact model's statistics (sums over rows), screened per class and with capped site shares."""
    per = {}
    for name, (p, _) in zip(names, updates):
        c = np.asarray(p["count"], dtype=np.float64)[:, None]
        per[name] = moment_summaries(np.broadcast_to(c, p["sum"].shape).ravel(), np.ravel(p["sum"]),
                                     np.ravel(p["sumsq"]))
    left_out = screen_sites({n: v[0] for n, v in per.items()}, {n: v[1] for n, v in per.items()}, what="fit")
    kept = [(p, n) for name, (p, n) in zip(names, updates) if name not in left_out]
    rows = np.array([float(usable_counts(p["count"]).sum()) for p, _ in kept])
    share = cap_weights(rows, max_site_share)
    scale = share * rows.sum() / np.maximum(rows, 1e-300)
    scaled = [({k: np.asarray(v, dtype=np.float64) * f for k, v in p.items()}, n) for (p, n), f in zip(kept, scale)]
    return fm.aggregate(scaled), left_out


def fit_request(params: Params, fm: FederatedModel, *, epochs: int, round_: int, seed: int,
                setup: Mapping[str, Any] | None, mean: np.ndarray, std: np.ndarray,
                dp_fit: Mapping[str, Any] | None) -> Message:
    """The round's ``"fit"`` request; the first carries the setup (meta + ``setup:`` arrays)."""
    down = {} if fm.exact else params_to(params)
    meta: dict[str, Any] = {"epochs": int(epochs), "round": round_, "seed": seed + round_}
    if dp_fit is not None:
        meta[DP_META] = dict(dp_fit)
    if setup is not None:
        return Message("fit", {**down, SETUP + "mean": mean, SETUP + "std": std}, {**meta, "setup": dict(setup)})
    return Message("fit", down, meta)


def dp_fit_release(fm: FederatedModel, local_epochs: int) -> dict[str, Any]:
    """How a fit round of ``fm`` releases under DP: ``{"steps": gradient steps (the accountant's
    releases), "lr": step size}`` (the noise multiplier is the accountant's)."""
    steps = DP_GD_STEPS_PER_EPOCH * int(local_epochs) if isinstance(fm, LogisticRegressionModel) else 1
    return {"steps": steps, "lr": DP_GD_LR}


def dp_fit_settings(federation: Federation, fm: FederatedModel, ledger: PrivacyLedger, local_epochs: int
                    ) -> dict[str, Any]:
    """The DP settings of a fit request: the step's multiplier, gradient steps and step size."""
    steps = DP_GD_STEPS_PER_EPOCH * int(local_epochs) if isinstance(fm, LogisticRegressionModel) else 1
    return {**dp_request(federation.options.dp, ledger.multiplier("training.fit")), "steps": steps, "lr": DP_GD_LR}


# ----------------------------------------------------------------------------- Newton–Raphson
#: the Newton reply's summed arrays and their fixed-point bits under secure sums (the aggregator's
#: default 2**-24: the pooled fit to ~1e-9, where 2**-16 stalls the steps near 1e-5)
NEWTON_FIELDS: dict[str, int | None] = {"grad": None, "hess": None}


@dataclass
class NewtonSums:
    """One Newton exchange reduced: ``grad`` ``(k(d+1),)`` and ``hess`` ``(k(d+1),)²`` summed (or,
    robust, a capped-share weighted mean scaled back to ``n`` rows) over ``n`` rows."""

    grad: np.ndarray
    hess: np.ndarray
    n: float


def newton_request(theta: np.ndarray, *, round_: int, setup: Mapping[str, Any] | None, mean: np.ndarray,
                   std: np.ndarray) -> Message:
    """The ``"newton"`` request at coefficients ``theta`` ``(k, d + 1)``; the first carries the setup."""
    from ...learn.newton import from_theta

    arrays = params_to(from_theta(theta))
    meta: dict[str, Any] = {"round": int(round_)}
    if setup is not None:
        return Message("newton", {**arrays, SETUP + "mean": mean, SETUP + "std": std}, {**meta, "setup": dict(setup)})
    return Message("newton", arrays, meta)


def _newton_checker(federation: Federation, size: int, k: int, part: str, exact: bool,
                    accepted: dict[str, tuple[np.ndarray, np.ndarray, int]]) -> Callable[[str, Message], None]:
    """Validator of ``"newton"`` replies: the rows the site declared for ``part``; when sent in the clear,
    a finite ``grad`` ``(size,)`` and ``hess`` ``(size, size)`` and, for exact sums, a symmetric Hessian
    with a non-negative diagonal and (two classes) its intercept entry ``Σ p(1 − p) ≤ n/4``, the
    intercept's gradient ``|Σ (p − y)| ≤ n``."""

    def check(site: str, reply: Message) -> None:
        assert federation.schema is not None
        n = validate.integer(reply.meta.get("n_samples"), "n_samples", equal=federation.schema.rows(site, part))
        if n == 0:
            raise ValueError(f"has no {part} rows to train on")
        if "grad" not in reply.arrays and "hess" not in reply.arrays:
            return  # masked: checked as a sum
        g = validate.bounded(validate.array(reply, "grad", (size,)), "gradient sums")
        H = validate.bounded(validate.array(reply, "hess", (size, size)), "Hessian sums")
        if exact:
            scale = 1e-9 * max(1.0, float(np.abs(H).max(initial=0.0)))
            if np.abs(H - H.T).max(initial=0.0) > scale or (np.diag(H) < -scale).any():
                raise ValueError("Hessian sums are not symmetric with a non-negative diagonal")
            if k == 1 and (H[-1, -1] > n / 4 * (1 + 1e-9) + 1e-9 or abs(g[-1]) > n * (1 + 1e-9) + 1e-9):
                raise ValueError("Newton sums are impossible for the rows declared")
        accepted[site] = (g, H, n)

    return check


def _psd_hessian(message: Message) -> tuple[Message, int]:
    """Post-processing of a noisy Hessian: symmetrised, negative eigenvalues set to 0 (``(message,
    eigenvalues floored)``)."""
    H = np.asarray(message.arrays["hess"], dtype=np.float64)
    w, V = np.linalg.eigh(0.5 * (H + H.T))
    arrays = dict(message.arrays)
    arrays["hess"] = (V * np.maximum(w, 0.0)) @ V.T
    return Message(message.kind, arrays, dict(message.meta)), int((w < 0).sum())


def newton_step(federation: Federation, request: Message, k: int, n_features: int, part: str, *, round_: int
                ) -> SumStep[NewtonSums]:
    """One Newton iteration's configure/aggregate pair: ``request`` (:func:`newton_request`), the
    summed gradient and Hessian over the rows of the sites in the sum; robust: each site's per-row
    mean with capped site shares (``max_site_share``), scaled to the pooled rows; DP: two Gaussian
    releases of ``"training.fit"``, checked for shape and finiteness, the Hessian made positive
    semi-definite (:func:`_psd_hessian`)."""
    size = k * (n_features + 1)
    schema = federation.schema
    assert schema is not None

    def pair(exact: bool) -> SumStep[NewtonSums]:
        accepted: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}

        def aggregate(summed: Summed) -> NewtonSums:
            n = float(sum(schema.rows(s, part) for s in summed.sites))
            if not n > 0:
                raise FederationError("the Newton sums cover no training rows")
            g, H = summed.sums["grad"], summed.sums["hess"]
            if g.shape != (size,) or H.shape != (size, size):
                raise FederationError("the summed Newton sums do not have the model's shapes")
            return NewtonSums(g, H, n)

        def robust(summed: Summed) -> tuple[NewtonSums, dict[str, str]]:
            names = [s for s in summed.replies if s in accepted]
            if not names:
                raise FederationError("no site's Newton sums to reduce")
            rows = np.array([float(accepted[s][2]) for s in names])
            share = cap_weights(rows, federation.options.max_site_share)
            n = float(rows.sum())
            g = sum(w * accepted[s][0] / accepted[s][2] for w, s in zip(share, names)) * n
            H = sum(w * accepted[s][1] / accepted[s][2] for w, s in zip(share, names)) * n
            return NewtonSums(np.asarray(g), np.asarray(H), n), {}

        return SumStep(request, SumSpec(dict(NEWTON_FIELDS)), _newton_checker(federation, size, k, part, exact,
                                                                                accepted),
                       aggregate, robust, kind="newton")

    exact = pair(True)
    exact.noisy = NoisyRelease(pair(False), "training.fit", 2, denoise=_psd_hessian)
    return exact


def newton_round(federation: Federation, request: Message, k: int, n_features: int, part: str, *, round_: int,
                 ledger: PrivacyLedger | None = None, on_error: Literal["raise", "skip"] | None = None
                 ) -> tuple[NewtonSums, dict[str, str]]:
    """One Newton exchange on the run's strategy: ``(sums, left out)`` (see :func:`newton_step`)."""
    pair = newton_step(federation, request, k, n_features, part, round_=round_)
    out = run_strategy(federation, ledger).run(federation, pair, on_error=on_error)
    return out.result, {s: f"newton round {round_}: {why}" for s, why in out.measurements.left_out.items()}


# ----------------------------------------------------------------------------- evaluate
def _counts(value: Any, shape: tuple[int, int]) -> np.ndarray | None:
    """``value`` as int64 counts of ``shape``, or None when it is not (negative, fractional, NaN)."""
    a = np.asarray(value) if value is not None else np.zeros(0)
    if a.shape != shape or not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        return None
    if not np.isfinite(a).all() or (a < 0).any() or (a != np.round(a)).any():
        return None
    return a.astype(np.int64)


def checked_sums(name: str, reply: Message, n_classes: int, bins: int | None) -> tuple[np.ndarray, Any, Any, Any]:
    """``(confusion, score_hist or None, brier_sum or None, rank_pairs or None)`` of a site's
    evaluation reply.

    Raises:
        FederationError: naming ``name``, when the confusion matrix is not ``(C, C)``
            non-negative integer counts, or a score histogram / Brier sum / rank pairs do not
            match it (shape, counts per class, range ``0 ≤ brier_sum ≤ 2·n``).
    """
    cm = _counts(reply.arrays.get("confusion"), (n_classes, n_classes))
    if cm is None:
        shape = np.shape(reply.arrays.get("confusion"))
        raise FederationError(f"site {name!r}: invalid confusion matrix of shape {shape}, expected "
                              f"({n_classes}, {n_classes}) non-negative counts")
    hist = brier = None
    if bins is not None and "score_hist" in reply.arrays:
        # counts spread evenly over runs of bins by the site's release gate: non-negative, not integers
        h = np.asarray(reply.arrays["score_hist"])
        totals = cm.sum(axis=1)
        ok = (n_classes == 2 and h.shape == (2, bins) and h.dtype.kind in "iuf" and bool(np.isfinite(h).all())
              and not (h < 0).any()
              # a secure sum rounds each bin to 2**-16: within 1e-3 over 1,000s of bins
              and bool(np.all(np.abs(h.sum(axis=1, dtype=np.float64) - totals) <= 1e-6 * np.maximum(totals, 1)
                              + bins * 2.0 ** -MOMENT_BITS)))
        if not ok:
            raise FederationError(f"site {name!r}: score histogram of shape {h.shape} does not match its confusion "
                                  f"matrix (expected (2, {bins}) non-negative counts with the same class totals)")
        hist = h.astype(np.float64)
    if bins is not None and "brier_sum" in reply.arrays:
        b = np.asarray(reply.arrays["brier_sum"], dtype=np.float64)
        if b.shape != (1,) or not np.isfinite(b).all() or not 0 <= b[0] <= 2 * cm.sum() + 1e-9:
            raise FederationError(f"site {name!r}: invalid Brier sum {b.tolist()} for {int(cm.sum())} rows")
        brier = float(b[0])
    pairs = None
    if hist is not None and "rank_pairs" in reply.arrays:
        r = np.asarray(reply.arrays["rank_pairs"], dtype=np.float64)
        most = float(cm[1].sum()) * float(cm[0].sum())
        if r.shape != (1,) or not np.isfinite(r).all() or not -1e-9 <= r[0] <= most * (1 + 1e-12) + 1e-9:
            raise FederationError(f"site {name!r}: invalid rank pairs for {int(cm[1].sum())} positives and "
                                  f"{int(cm[0].sum())} negatives")
        pairs = float(r[0])
    return cm, hist, brier, pairs


def pool_evaluations(sums: Mapping[str, tuple[Any, ...]], smoothed: bool | Collection[str] = False
                     ) -> dict[str, Any]:
    """``{"pooled", "per_site"}`` of :func:`~fedtab.learn.metrics.evaluation_scores` from the sites'
    checked sums ``(confusion, score_hist, brier_sum[, rank_pairs])``; a ranking or Brier metric is
    pooled only when every site sent its sum.

    The pooled AUROC / PR-AUC come with ``*_bounds`` ``[lo, hi]`` that hold
    (:func:`~fedtab.learn.metrics.pooled_ranking`): pairs of rows inside a site that sent its
    exact ``rank_pairs`` count exactly, every other pair from the histograms' bins, or — for a
    site whose release gate smoothed its histogram (:func:`fedtab.privacy.gate.smooth_histogram`)
    — from its runs of bins (a pair whose two runs overlap is unknown, between 0 and 1).

    ``smoothed``: the names of the sites whose histograms were smoothed (:func:`smoothed_sites`),
    or one flag for all (``True`` is always safe: runs are then inferred from every histogram,
    bounds are only wider).
    """
    flags = {name: (bool(smoothed) if isinstance(smoothed, bool) else name in smoothed) for name in sums}
    per_site = {name: evaluation_scores(*s[:4], smoothed=flags[name]) for name, s in sums.items()}
    parts = list(zip(*sums.values()))
    pooled = [sum(p[1:], p[0]) if all(v is not None for v in p) else None for p in parts]
    out = {"pooled": evaluation_scores(pooled[0], None, *pooled[2:3]), "per_site": per_site}
    if len(parts) > 1 and pooled[1] is not None:
        pairs = parts[3] if len(parts) > 3 else [None] * len(sums)
        out["pooled"].update(pooled_ranking(parts[1], pairs, [flags[n] for n in sums]))
    return out


def was_smoothed(replies: Mapping[str, Message]) -> bool:
    """Whether any reply says its release gate smoothed a histogram."""
    return any(r.meta.get(SMOOTHED) is True for r in replies.values())


def smoothed_sites(replies: Mapping[str, Message]) -> set[str]:
    """The sites whose reply says their release gate smoothed a histogram."""
    return {s for s, r in replies.items() if r.meta.get(SMOOTHED) is True}


def _tidy_total(message: Message) -> Message:
    """A summed evaluation as counts: the confusion matrix rounded (a secure sum's fixed point),
    the other sums floored at 0; a site's exact reply (validated counts) is unchanged."""
    return Message("evaluate", {k: np.rint(v) if k == "confusion" else np.maximum(v, 0.0)
                                for k, v in message.arrays.items()}, dict(message.meta))


def _noisy_confusion(message: Message) -> tuple[Message, int]:
    """Post-processing of a noisy confusion matrix: rounded, floored at 0 (``(message, cells floored)``)."""
    cm = np.rint(np.asarray(message.arrays["confusion"], dtype=np.float64))
    return Message("evaluate", {"confusion": np.maximum(cm, 0)}), int((cm < 0).sum())


def evaluate_step(federation: Federation, params: Params, n_classes: int, part: str = "test",
                  bins: int | None = None, *, has_proba: bool = False, kind: str = "evaluate") -> SumStep[dict[str, Any]]:
    """The evaluation's configure/aggregate pair (see :func:`evaluate`)."""

    def pair(bins: int | None, check_counts: bool) -> SumStep[dict[str, Any]]:
        meta: dict[str, Any] = {"part": part}
        if bins is not None:
            meta["score_bins"] = bins

        def check(site: str, reply: Message) -> None:
            assert federation.schema is not None
            n = federation.schema.rows(site, part)
            validate.integer(reply.meta.get("n"), "evaluated rows", equal=n)
            if "confusion" in reply.arrays:
                validate.confusion_matrix(reply, n_classes, n)  # sums to the rows the site declared
                checked_sums(site, reply, n_classes, bins)

        def check_shape(site: str, reply: Message) -> None:
            if "confusion" in reply.arrays:  # masked under secure aggregation: the sum is checked
                validate.array(reply, "confusion", (n_classes, n_classes))  # noisy: shape and finiteness only

        fields: dict[str, int | None] = {"confusion": 0 if check_counts else MOMENT_BITS}
        if bins is not None and has_proba:
            fields["brier_sum"] = MOMENT_BITS
            if n_classes == 2:  # smoothed by the sites' release gates: fractional counts
                fields["score_hist"] = MOMENT_BITS

        def aggregate(summed: Summed) -> dict[str, Any]:
            parts = {k: _tidy_total(m) if k not in summed.replies else m for k, m in summed.parts.items()}
            smoothed = {k for k in parts if any(summed.replies[s].meta.get(SMOOTHED) is True
                                                for s in ([k] if k in summed.replies else summed.sites)
                                                if s in summed.replies)}
            metrics = pool_evaluations({k: checked_sums(k, m, n_classes, bins) for k, m in parts.items()},
                                       smoothed=smoothed)
            metrics["per_site"] = {k: v for k, v in metrics["per_site"].items() if k in summed.replies}
            return metrics

        def robust(summed: Summed) -> tuple[dict[str, Any], dict[str, str]]:
            metrics = aggregate(summed)
            metrics["pooled"] = {**metrics["pooled"], **median_scores(metrics["per_site"])}
            return metrics, {}

        return SumStep(Message(kind, params_to(params), meta), SumSpec(fields),
                       check if check_counts else check_shape, aggregate, robust, kind=kind)

    exact = pair(bins, True)
    exact.noisy = NoisyRelease(pair(None, False), "training.evaluate", denoise=_noisy_confusion)  # no histograms
    return exact


def evaluate(federation: Federation, params: Params, n_classes: int, part: str = "test", bins: int | None = None,
             *, has_proba: bool = False, ledger: PrivacyLedger | None = None,
             on_error: Literal["raise", "skip"] | None = None, kind: str = "evaluate") -> dict[str, Any]:
    """The evaluation exchange on the run's strategy: ``{"pooled", "per_site"}`` metrics
    (:func:`pool_evaluations`).

    ``kind``: the request's kind (another workflow's handler that replies the same sums, e.g.
    ``"gbdt_evaluate"``).

    Plain: per site and pooled. Secure: the pooled sums only (``per_site`` is empty). DP: the
    confusion matrices are noisy releases (rounded and floored at 0 here); no histograms.
    Robust: every scalar pooled metric is the median over the sites (:func:`median_scores`).

    Raises:
        ValueError: DP without the run's accountant (``ledger``).
    """
    pair = evaluate_step(federation, params, n_classes, part, bins, has_proba=has_proba, kind=kind)
    return run_strategy(federation, ledger).run(federation, pair, on_error=on_error).result


def median_scores(per_site: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Robust pooled scores: every scalar metric's median over the sites that scored rows
    (one vote per site; a metric some site lacks is left out); ``n`` is their total. The AUROC's
    and PR-AUC's ``*_bounds`` are the medians of the sites' bounds (they hold the median of the
    sites' exact values)."""
    scored = [m for m in per_site.values() if m["n"] > 0] or list(per_site.values())
    out: dict[str, Any] = {}
    for k in scored[0]:
        values = [m.get(k) for m in scored]
        if k != "n" and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[k] = float(site_median(np.array(values, dtype=np.float64)))
    for k in ("auroc", "pr_auc"):  # the median is monotone: medians of the bounds bound the median
        bounds = [m.get(f"{k}_bounds") for m in scored]
        if k in out and all(isinstance(b, list) and len(b) == 2 for b in bounds):
            lo, hi = (float(site_median(np.array(v, dtype=np.float64))) for v in zip(*bounds))
            out[f"{k}_bounds"], out[f"{k}_error_bound"] = [lo, hi], max(out[k] - lo, hi - out[k])
    out["n"] = int(sum(m["n"] for m in scored))
    return out


# ----------------------------------------------------------------------------- regression
def pool_regression(sums: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """``{"pooled", "per_site"}`` RMSE / MAE / R² / n from per-site ``{sse, sae, sum_y, sum_y2, n}``
    (:func:`fedtab.learn.metrics.regression_scores`): pooled = the scores of the summed terms,
    i.e. exactly the metrics of every site's test rows together. A :data:`SECURE_SUM` entry
    is the total (no per-site scores); a site with no rows in the part has none either."""
    total = {k: float(sum(s[k] for s in sums.values())) for k in (*REGRESSION_SUMS, "n")}
    pooled = regression_scores(total["sse"], total["sae"], total["sum_y"], total["sum_y2"], total["n"])
    per_site = {site: regression_scores(s["sse"], s["sae"], s["sum_y"], s["sum_y2"], s["n"])
                for site, s in sums.items() if site != SECURE_SUM and s["n"] > 0}  # a site with no rows: no scores
    return {"pooled": pooled, "per_site": per_site}


def regression_checker(federation: Federation, part: str) -> Callable[[str, Message], None]:
    """Validator of regression sums: the rows the site declared for ``part``, and (sent in the
    clear) finite sums with ``sse, sae, sum_y2 >= 0``, ``sae² <= n·sse`` and ``sum_y² <= n·sum_y2``."""

    def check(site: str, reply: Message) -> None:
        assert federation.schema is not None
        n = validate.integer(reply.meta.get("n"), "evaluated rows", equal=federation.schema.rows(site, part))
        if not all(k in reply.arrays for k in REGRESSION_SUMS):
            return  # masked: the total is checked
        v = {k: validate.array(reply, k, (1,))[0] for k in REGRESSION_SUMS}
        _check_regression_sums(v, n)

    return check


def _check_regression_sums(v: Mapping[str, float], n: float) -> None:
    if not all(np.isfinite(float(x)) for x in v.values()):
        raise ValueError("regression sums must be finite")
    tol = 1e-9 * max(1.0, abs(float(v["sse"])), abs(float(v["sum_y2"])), float(v["sae"]) ** 2)
    if min(v["sse"], v["sae"], v["sum_y2"]) < -tol or v["sae"] ** 2 > n * v["sse"] + tol * max(n, 1) \
            or v["sum_y"] ** 2 > n * v["sum_y2"] + tol * max(n, 1):
        raise ValueError("regression sums are inconsistent (negative or impossible for the rows)")


def evaluate_regression_step(federation: Federation, params: Params, part: str = "test", *,
                             kind: str = "regression_evaluate", meta: Mapping[str, Any] | None = None
                             ) -> SumStep[dict[str, Any]]:
    """The regression evaluation's configure/aggregate pair (see :func:`evaluate_regression`);
    no DP release (the run's noisy strategy refuses it)."""
    assert federation.schema is not None
    schema = federation.schema

    def aggregate(summed: Summed) -> dict[str, Any]:
        sums: dict[str, dict[str, float]] = {}
        for key, reply in summed.parts.items():
            if key in summed.replies:  # one site's own sums
                sums[key] = {**{k: float(reply.arrays[k][0]) for k in REGRESSION_SUMS}, "n": float(reply.meta["n"])}
            else:  # the secure total over the sites that answered
                total = {k: float(np.asarray(reply.arrays[k]).ravel()[0]) for k in REGRESSION_SUMS}
                n = float(sum(schema.rows(s, part) for s in summed.replies))
                _check_regression_sums(total, n)
                sums[SECURE_SUM] = {**total, "n": n}
        return pool_regression(sums)

    def robust(summed: Summed) -> tuple[dict[str, Any], dict[str, str]]:
        return aggregate(summed), {}  # sums of a fixed part: no outlier-robust reduction here

    return SumStep(Message(kind, params_to(params), {"part": part, **dict(meta or {})}),
                   SumSpec({k: MOMENT_BITS for k in REGRESSION_SUMS}), regression_checker(federation, part),
                   aggregate, robust, kind=kind)


def evaluate_regression(federation: Federation, params: Params, part: str = "test", *,
                        kind: str = "regression_evaluate", meta: Mapping[str, Any] | None = None,
                        on_error: Literal["raise", "skip"] | None = None) -> dict[str, Any]:
    """The regression evaluation exchange on the run's strategy (``kind``:
    ``"regression_evaluate"`` or GBDT's ``"gbdt_score"``): ``{"pooled", "per_site"}`` RMSE /
    MAE / R² (:func:`pool_regression`).

    Plain: per site and pooled; secure: the pooled sums only (``per_site`` empty); robust: the
    pooled sums too (sums of squares of a fixed part have no outlier-robust reduction here).

    Raises:
        ValueError: under DP (the step has no noisy release: the run's noisy strategy refuses it
            before the request goes out).
        FederationError: as the exchange.
    """
    pair = evaluate_regression_step(federation, params, part, kind=kind, meta=meta)
    return run_strategy(federation, None).run(federation, pair, on_error=on_error).result
