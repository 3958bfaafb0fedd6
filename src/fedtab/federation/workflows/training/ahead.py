"""The first Newton iteration asked ahead, riding on the exchange before training (issue 31).

A logistic model trained by federated Newton–Raphson starts at a point fixed before any reply
(:meth:`~fedtab.learn.models.LogisticRegressionModel.init`: zero coefficients), over the elected
columns. Its first request depends only on the mask — except for the standardisation, which the
description riding on the same ``set_mask`` exchange is still gathering. So the first iteration is
asked ahead over a *reference* standardisation the server already holds (the imputation's pooled
means and standard deviations, the profile's ranges, or none) and rewritten afterwards for the
pooled standardisation (:func:`fedtab.learn.newton.restandardise`): exact when the rows have no
missing cell (after imputation), otherwise a start that later iterations correct.

:func:`ride_first_newton` queues the request (:func:`fedtab.federation.protocol.riders.ride_step`,
plain runs only: under secure sums the first iteration keeps its own exchange) as an independent
part (its failure at a site does not stop the part it rides on); the training loop
uses the answer (:func:`ahead_point`) only when it was asked for exactly the run's setup, start point
and sites, and starts from zero as before otherwise.

The iteration at zero rides one exchange earlier still, on the **ballot**
(:func:`ride_candidates`): at ``θ = 0`` every logit is 0 whatever the columns, so the gradient and
Hessian over any column subset are exact sub-blocks of those over all the election's candidate columns
(:func:`fedtab.learn.newton.sub_block`). After the vote the server cuts out the elected block, rewrites
it for the standardisation the ``set_mask`` iteration is asked in and takes a Newton step
(:func:`elected_start`: θ1, a start point — its penalty is the reference standardisation's, not yet the
pooled one); the iteration at θ1 rides on ``set_mask`` (:func:`ride_first_newton` with ``theta``), and
the training loop goes on from θ1 rewritten for the pooled standardisation (:func:`ahead_point`).
Only for candidates within the Newton width (:data:`~fedtab.federation.workflows.training.server.NEWTON_MAX_PARAMS`
coefficients) and in plain runs; otherwise the zero start rides on ``set_mask`` as before.

Privacy: the request is an ordinary ``"newton"`` request — a setup (the server chooses the
standardisation today too) and a point — answered through the site's one release path, so the site
releases nothing it would not release to the same request sent alone. The ballot's request asks the
sums at zero over every candidate column: in a plain run the server picks the mask, so a curious server
could already obtain exactly these sums by sending ``set_mask`` of all columns and its first Newton
iteration; asking them on the ballot releases nothing a plain run did not already allow. The site
answers it under the ``"newton"`` kind's own rules (its policy's feature and model caps, its
``max_rounds`` count): a site whose policy refuses so wide a request refuses it, and the ballot it rides
on goes on. Under secure sums, DP or robust reducers nothing rides (each iteration keeps its exchange).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from fedtab.learn.models import LogisticRegressionModel, make_model
from fedtab.learn.newton import as_theta, newton_update, restandardise, sub_block
from fedtab.federation.protocol import Federation
from fedtab.federation.workflows.training.steps import NewtonSums, newton_request, newton_step

__all__ = ["AheadPoint", "NewtonAhead", "ahead_point", "elected_start", "reference_standardisation", "ride_candidates",
           "ride_first_newton", "settle"]


@dataclass
class NewtonAhead:
    """The first Newton iteration asked ahead: the ``setup`` sent (``features``, ``classes``,
    ``model`` spec, ``part``), the point asked ``theta`` ``(k, d + 1)``, the reference standardisation
    ``mean``/``std`` ``(d,)``; ``sums`` and ``sites`` once answered (``None`` before, or when the
    riding part failed); ``start`` the model's start point the iterations began from (``(k, d + 1)``,
    ``theta`` itself when the point asked is the start), in the same reference standardisation."""

    setup: dict[str, Any]
    theta: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    sums: NewtonSums | None = None
    sites: frozenset[str] = field(default_factory=frozenset)
    start: np.ndarray | None = None
    replies: dict[str, Any] | None = None


@dataclass(frozen=True)
class AheadPoint:
    """What an iteration asked ahead gives the training loop, in the pooled standardisation: the point
    ``theta`` ``(k, d + 1)`` the ``sums`` were taken at and the norms of the ``steps`` that led there
    from the run's start (empty when ``theta`` is the start)."""

    theta: np.ndarray
    sums: NewtonSums
    steps: tuple[float, ...]


def reference_standardisation(features: Sequence[str], known: Mapping[str, tuple[float, float]]
                              ) -> tuple[np.ndarray, np.ndarray]:
    """``(mean, std)`` ``(d,)`` for ``features`` from ``known`` ``{column: (centre, scale)}``; a column
    not known, or with a scale that is not positive and finite, gets ``(0, 1)``."""
    mean, std = np.zeros(len(features)), np.ones(len(features))
    for j, f in enumerate(features):
        c, s = known.get(f, (0.0, 1.0))
        if np.isfinite(c) and np.isfinite(s) and s > 0:
            mean[j], std[j] = float(c), float(s)
    return mean, std


def _asked(model: Any, features: Sequence[str], classes: Sequence[str], mean: np.ndarray, std: np.ndarray, *,
           seed: int, part: str, theta: np.ndarray | None = None
           ) -> tuple[LogisticRegressionModel, NewtonAhead, Any] | None:
    """``(model, holder, request)`` of a Newton iteration of a logistic ``model`` over ``features`` and
    ``classes`` at ``theta`` (default: the model's start point), standardised with ``mean``/``std``;
    ``None`` for a model that does not train by Newton, fewer than two classes or no feature.

    Raises:
        ValueError: a ``theta`` that does not have the model's shape ``(k, d + 1)`` or is not finite.
    """
    fm = make_model(model)
    if not (isinstance(fm, LogisticRegressionModel) and fm.newton) or len(classes) < 2 or not features:
        return None
    start = as_theta(fm.init(len(features), len(classes), seed))
    theta = start if theta is None else np.asarray(theta, dtype=np.float64)
    if theta.shape != start.shape or not np.isfinite(theta).all():
        raise ValueError(f"a Newton point of shape {theta.shape}, expected finite {start.shape}")
    setup = {"features": list(features), "classes": list(classes), "model": {"name": fm.name, "params": fm.get_params()},
             "part": str(part)}
    held = NewtonAhead(setup, theta, np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64),
                       start=start)
    return fm, held, newton_request(theta, round_=1, setup=setup, mean=held.mean, std=held.std)


def ride_first_newton(federation: Federation, features: Sequence[str], classes: Sequence[str], model: Any, *,
                      mean: np.ndarray, std: np.ndarray, seed: int = 0, part: str = "train",
                      theta: np.ndarray | None = None) -> NewtonAhead | None:
    """Queue a Newton iteration of a logistic ``model`` over ``features`` and ``classes`` (the
    agreed class labels, sorted as the description sorts them) at ``theta`` (default: the model's start
    point; e.g. :func:`elected_start`'s θ1), standardised with the reference ``mean``/``std``, to ride on
    the next exchange. Returns the holder, or ``None`` (nothing queued) for a model that does not train
    by Newton, fewer than two classes, or a run that is not plain
    (:func:`~fedtab.federation.protocol.riders.ride_step`).

    Raises:
        ValueError: a ``theta`` that does not have the model's shape ``(k, d + 1)`` or is not finite.
    """
    from fedtab.federation.protocol.riders import ride_step

    asked = _asked(model, features, classes, mean, std, seed=seed, part=part, theta=theta)
    if asked is None:
        return None
    fm, held, request = asked
    step = newton_step(federation, request, held.theta.shape[0], len(features), str(part), round_=1, l2=fm.l2)

    def keep(sums: NewtonSums) -> None:
        held.sums = sums

    def aggregate(summed: Any) -> NewtonSums:  # remember which sites the sums cover
        held.sites = frozenset(summed.sites)
        return step.aggregate(summed)

    return held if ride_step(federation, replace(step, aggregate=aggregate), keep, independent=True) else None


def ride_candidates(federation: Federation, candidates: Sequence[str], classes: Sequence[str], model: Any, *,
                    mean: np.ndarray, std: np.ndarray, max_params: int, seed: int = 0, part: str = "train"
                    ) -> NewtonAhead | None:
    """Queue the Newton iteration at zero over all the election's ``candidates`` to ride on the ballot,
    standardised with the reference ``mean``/``std`` ``(len(candidates),)``; ``classes`` as the training
    will sort them. Only a logistic model trained by Newton that starts at zero, a width ``k·(d + 1)`` over
    the candidates within ``max_params`` (the Newton width,
    :data:`~fedtab.federation.workflows.training.server.NEWTON_MAX_PARAMS`), and a plain run; ``None`` when
    nothing was queued.

    The ballot may be the exchange that agrees the schema, whose row counts the replies are checked
    against: the replies are kept as they come and checked and summed by :func:`settle` once the schema
    is agreed. The part is optional (:func:`~fedtab.federation.protocol.piggyback.ride`): when a site
    refuses it (a policy's ``max_size`` below the candidates' width), fails it or does not answer it,
    nothing is kept and the training starts at zero as it would without it."""
    from fedtab.federation.protocol.piggyback import ride
    from fedtab.federation.protocol.riders import plain_run

    k = 1 if len(classes) <= 2 else len(classes)
    if k * (len(candidates) + 1) > max_params or not plain_run(federation):
        return None
    asked = _asked(model, candidates, classes, mean, std, seed=seed, part=part)
    if asked is None or np.any(asked[1].theta != 0):
        return None  # the sub-blocks are exact only at zero
    _, held, request = asked

    def keep(replies: dict[str, Any]) -> None:
        held.replies = dict(replies)

    # optional: a site whose policy refuses so wide a model (or fails it) leaves the run on the zero start
    ride(federation, request, None, keep, step="newton", optional=True)
    return held


def settle(federation: Federation, held: NewtonAhead | None) -> None:
    """Check and sum the replies :func:`ride_candidates` kept, now that the schema is agreed: each reply
    validated as a ``"newton"`` reply (the rows the site declared, finite sums of the model's shapes, a
    symmetric Hessian, sums possible for those rows); a reply that fails follows the failure policy of
    the run (:class:`~fedtab.federation.protocol.FederationError` naming the site unless a quorum lets it
    be dropped). Sets ``held.sums`` and ``held.sites``; nothing when nothing was kept.

    Raises:
        FederationError: a site's sums are invalid and no quorum lets the run go on without it.
    """
    from fedtab.federation.protocol.exchange import _apply_failure_policy
    from fedtab.federation.protocol.summing import Summed, _plain_sums

    if held is None or held.replies is None or held.sums is not None or federation.schema is None:
        return
    k, m = held.theta.shape
    request = newton_request(held.theta, round_=1, setup=held.setup, mean=held.mean, std=held.std)
    step = newton_step(federation, request, k, m - 1, str(held.setup["part"]), round_=1)
    good: dict[str, Any] = {}
    bad: dict[str, str] = {}
    for site, reply in held.replies.items():
        try:
            step.check(site, reply)
            good[site] = reply
        except (ValueError, KeyError, TypeError) as e:
            bad[site] = f"newton sums on the ballot: {e}"
    held.replies = None
    if bad:
        _apply_failure_policy(federation, "newton", good, bad, {}, None)
    if not good:
        return
    sums, weight = _plain_sums(good, step.spec)
    held.sums = step.aggregate(Summed(sums, weight, dict(good), list(good)))
    held.sites = frozenset(good)


def elected_start(held: NewtonAhead | None, elected: Sequence[str], classes: Sequence[str], mean: np.ndarray,
                  std: np.ndarray, sites: Sequence[str]) -> np.ndarray | None:
    """θ1 over the ``elected`` columns, standardised with ``mean``/``std`` ``(len(elected),)`` (the
    standardisation the next iteration is asked in) and ``classes`` (as the training sorts them): the elected sub-block (intercept included) of the
    sums ``held`` took at zero over the candidates (:func:`ride_candidates`), rewritten for ``mean``/``std``
    (:func:`~fedtab.learn.newton.restandardise`), then one Newton step from zero with the model's penalty
    in that standardisation (the pooled one is not known yet: θ1 is only a start point).

    ``None`` (no start: the caller asks at zero) when ``held`` is missing or unanswered, was answered by
    other ``sites`` than the ones active now or for other classes, was not asked at zero, an elected
    column is not a candidate, nothing was elected, or the step is not finite."""
    if held is None or held.sums is None or held.sites != frozenset(sites) or not elected:
        return None
    if list(held.setup["classes"]) != list(classes):
        return None
    if np.any(held.theta != 0):
        return None
    pos = {f: j for j, f in enumerate(held.setup["features"])}
    if any(f not in pos for f in elected) or len(set(elected)) != len(elected):
        return None
    fm = make_model(held.setup["model"])
    assert isinstance(fm, LogisticRegressionModel)
    cols = [pos[f] for f in elected]
    theta, grad, hess = sub_block(held.theta, held.sums.grad, held.sums.hess, cols)
    theta, grad, hess = restandardise(theta, grad, hess, held.mean[cols], held.std[cols], mean, std)
    if not (np.isfinite(grad).all() and np.isfinite(hess).all()):
        return None
    try:
        theta1, _ = newton_update(theta, grad, hess, held.sums.n, fm.l2)
    except ValueError:
        return None
    return theta1 if np.isfinite(theta1).all() else None


def ahead_point(ahead: NewtonAhead | None, setup: Mapping[str, Any], theta: np.ndarray, mean: np.ndarray,
                std: np.ndarray, sites: Sequence[str]) -> AheadPoint | None:
    """The point ``ahead`` was asked at and its sums, rewritten for the run's pooled standardisation
    ``mean``/``std`` (:func:`~fedtab.learn.newton.restandardise`: the same model in both), with the norm of
    the step from the run's start ``theta`` to it (none when it is the start) — or ``None`` when
    ``ahead`` was not answered or was asked for another ``setup``, start or set of ``sites`` (a site
    left out since, or a step between that changed the columns)."""
    if ahead is None or ahead.sums is None:
        return None
    if dict(ahead.setup) != dict(setup) or ahead.sites != frozenset(sites):
        return None
    start = ahead.theta if ahead.start is None else ahead.start
    if ahead.theta.shape != np.shape(theta) or start.shape != np.shape(theta):
        return None
    at, grad, hess = restandardise(ahead.theta, ahead.sums.grad, ahead.sums.hess, ahead.mean, ahead.std, mean, std)
    began, _, _ = restandardise(start, np.zeros_like(grad), np.zeros_like(hess), ahead.mean, ahead.std, mean, std)
    if not (np.isfinite(grad).all() and np.isfinite(hess).all() and np.isfinite(at).all()):
        return None
    if not np.allclose(began, theta, rtol=0, atol=1e-12):
        return None  # the iterations began at another point than the run's start
    moved = float(np.linalg.norm(at - np.asarray(theta, dtype=np.float64)))
    return AheadPoint(at, NewtonSums(grad, hess, ahead.sums.n), (moved,) if ahead.start is not None
                      and not np.array_equal(ahead.theta, start) else ())
