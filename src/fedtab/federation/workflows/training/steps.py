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
* **robust** — per-site values, reduced by the robust reducers of :mod:`fedtab.federation.protocol.reduce`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Literal, Mapping

import numpy as np

from fedtab.federation.protocol import Federation, FederationError, Summed, SumSpec, validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol.modes import MODES, NoisyRelease, SumStep, declare_modes, run_strategy
from fedtab.federation.protocol.reduce import (
    cap_weights,
    moment_summaries,
    robust_params,
    screen_sites,
    usable_counts,
)
from fedtab.federation.workflows.training.trainers import trainer_for
from fedtab.federation.steps.params import PARAM, SETUP, params_from, params_to
from fedtab.learn.models import FederatedModel, LogisticRegressionModel, Params
from fedtab.privacy.accountant import PrivacyLedger
from fedtab.privacy.dp import (
    DP_GD_LR,
    DP_GD_NOISE_SCALE,
    DP_GD_STEPS_PER_EPOCH,
    DP_META,
    dp_request,
)
from fedtab.privacy.secagg import MOMENT_BITS

__all__ = ["TRAINING_MODES", "NEWTON_MODES", "NEWTON_UNSERVED", "solver_for_modes", "EXACT_TRAINING_MODES", "LINEAR_MODES", "fit_step", "dp_fit_release", "FitRound", "fit_round", "dp_plan", "exact_statistics_checker", "fit_request", "dp_fit_settings", "NEWTON_FIELDS", "newton_request", "newton_step", "newton_round", "NewtonSums"]

#: the modes the training steps support (an exact-aggregation model: no DP release)
TRAINING_MODES = declare_modes("training", "secure", "dp", "robust")
EXACT_TRAINING_MODES = declare_modes("training.exact", "secure", "robust")
#: the modes of an exact regression model (``linear``): its evaluation has no DP release and its
#: statistics no robust screen
LINEAR_MODES = declare_modes("training.linear", "secure")
#: the modes federated Newton–Raphson serves (plain and secure sums); in another mode a logistic model
#: trains by FedAvg with that mode's own machinery (:func:`solver_for_modes`)
NEWTON_MODES = declare_modes("training.newton", "secure")
#: why Newton–Raphson does not serve a mode (benchmarks/README.md, "Robust mode under poisoning" and
#: "Privacy", has the measurements)
NEWTON_UNSERVED: dict[str, str] = {
    "dp": "a DP Newton release noises the Hessian sum with a sensitivity of the squared row bound, which "
          "swamps the curvature; DP gradient descent clips each row's gradient instead",
    "robust": "a lying site's Newton step is hard to screen against honest sites' own steps and its claimed rows "
              "weight the pooled sums; the coordinate-wise median of the sites' FedAvg parameters bounds it",
}


def solver_for_modes(fm: FederatedModel, modes: Collection[str]) -> tuple[FederatedModel, str | None]:
    """``(model, why)``: ``fm`` and ``None`` when its solver serves every mode in ``modes`` (names of
    :data:`~fedtab.federation.protocol.modes.MODES`); a logistic model by Newton–Raphson in a mode
    outside :data:`NEWTON_MODES` is returned as the same model by FedAvg (``solver = "fedavg"``, same
    ``l2``/``mu``), with the one-line reason. Pure: no exchange."""
    if not (isinstance(fm, LogisticRegressionModel) and fm.newton):
        return fm, None
    unserved = [m for m in modes if m in MODES and m not in NEWTON_MODES]
    if not unserved:
        return fm, None
    why = "; ".join(f"{m} mode: {NEWTON_UNSERVED.get(m, 'not declared by the Newton step')}" for m in unserved)
    return LogisticRegressionModel(l2=fm.l2, mu=fm.mu, solver="fedavg"), f"trained by FedAvg ({why})"



def dp_plan(fm: FederatedModel, rounds: int, local_epochs: int, eval_every: int, described: bool
            ) -> tuple[dict[str, int], dict[str, float]]:
    """``(releases per step, noise scale per step)`` of one DP training run, for the accountant.

    Logistic regression (by FedAvg under DP whatever its solver: :func:`solver_for_modes`) by DP
    gradient descent (``DP_GD_STEPS_PER_EPOCH`` releases per local epoch, each at
    ``DP_GD_NOISE_SCALE`` × the base multiplier); other FedAvg models by DP-FedAvg (one release per
    round); the description is 3 releases (unless it came with the election), each evaluation one.
    """
    trainer = trainer_for(fm)
    if trainer is not None:  # e.g. boosted trees: releases per depth level, not per FedAvg round
        return trainer.dp_plan(fm)
    fm = solver_for_modes(fm, ("dp",))[0]
    n_evals = 1 + (sum(1 for r in range(1, rounds + 1) if r % eval_every == 0 or r == rounds) if eval_every else 0)
    steps = DP_GD_STEPS_PER_EPOCH * int(local_epochs) if isinstance(fm, LogisticRegressionModel) else 1
    plan = {"training.describe": 0 if described else 3, "training.fit": rounds * steps, "training.evaluate": n_evals}
    return plan, {"training.fit": DP_GD_NOISE_SCALE if steps > 1 else 1.0}












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


@dataclass(frozen=True)
class FitRound:
    """One fit round as :func:`fit_round` runs it: the ``request`` (:func:`fit_request`), the
    update's ``template`` (``{name: shape}``), the row ``part`` the sites train on, the largest
    accepted ``|entry|`` of an update (``max_param_abs``), the number of classes, the round's number
    (``round_``, from 1) and how it releases under DP (``dp_fit``: :func:`dp_fit_release`, ``None``
    when the model has no DP release)."""

    request: Message
    template: Mapping[str, tuple[int, ...]]
    part: str
    max_param_abs: float
    n_classes: int
    round_: int
    dp_fit: Mapping[str, Any] | None = None


def fit_round(federation: Federation, fm: FederatedModel, fit: FitRound, *,
              on_error: Literal["raise", "skip"] | None = None, ledger: PrivacyLedger | None = None,
              ) -> tuple[Params, dict[str, str], dict[str, Message]]:
    """One FedAvg round (or an exact model's one round) on the run's strategy:
    ``(parameters, left out, replies)`` (see :func:`fit_step`); under DP the round's releases
    are spent from ``ledger`` before the request goes out.

    Raises:
        FederationError: no valid update; the summed update does not fit the template.
    """
    pair = fit_step(federation, fm, fit.request, fit.template, fit.part, max_param_abs=fit.max_param_abs,
                    n_classes=fit.n_classes, round_=fit.round_, dp_fit=fit.dp_fit)
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
    from fedtab.learn.newton import from_theta

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


def newton_step(federation: Federation, request: Message, k: int, n_features: int, part: str, *, round_: int,
                l2: float = 0.0) -> SumStep[NewtonSums]:
    """One Newton iteration's configure/aggregate pair: ``request`` (:func:`newton_request`), the
    summed gradient and Hessian over the rows of the sites in the sum (plain or secure sums; the step
    has no robust reducer and no DP release: :data:`NEWTON_MODES`, :func:`solver_for_modes`)."""
    size = k * (n_features + 1)
    schema = federation.schema
    assert schema is not None
    accepted: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}

    def aggregate(summed: Summed) -> NewtonSums:
        n = float(sum(schema.rows(s, part) for s in summed.sites))
        if not n > 0:
            raise FederationError("the Newton sums cover no training rows")
        g, H = summed.sums["grad"], summed.sums["hess"]
        if g.shape != (size,) or H.shape != (size, size):
            raise FederationError("the summed Newton sums do not have the model's shapes")
        return NewtonSums(g, H, n)

    return SumStep(request, SumSpec(dict(NEWTON_FIELDS)), _newton_checker(federation, size, k, part, True, accepted),
                   aggregate, kind="newton")


def newton_round(federation: Federation, request: Message, k: int, n_features: int, part: str, *, round_: int,
                 ledger: PrivacyLedger | None = None, on_error: Literal["raise", "skip"] | None = None,
                 l2: float = 0.0) -> tuple[NewtonSums, dict[str, str]]:
    """One Newton exchange on the run's strategy: ``(sums, left out)`` (see :func:`newton_step`).

    Raises:
        ValueError: the run has a mode outside :data:`NEWTON_MODES` (train by FedAvg then).
    """
    strategy = run_strategy(federation, ledger)
    strategy.check_supported(NEWTON_MODES, "federated Newton-Raphson")
    pair = newton_step(federation, request, k, n_features, part, round_=round_, l2=l2)
    out = strategy.run(federation, pair, on_error=on_error)
    return out.result, {s: f"newton round {round_}: {why}" for s, why in out.measurements.left_out.items()}
