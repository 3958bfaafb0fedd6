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
uses the answer (:func:`first_sums`) only when it was asked for exactly the run's setup, start point
and sites, and starts from zero as before otherwise.

Privacy: the request is an ordinary ``"newton"`` request — a setup (the server chooses the
standardisation today too) and a point — answered through the site's one release path, so the site
releases nothing it would not release to the same request sent alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import numpy as np

from fedtab.learn.models import LogisticRegressionModel, make_model
from fedtab.learn.newton import as_theta, restandardise
from fedtab.federation.protocol import Federation
from fedtab.federation.workflows.training.steps import NewtonSums, newton_request, newton_step

__all__ = ["NewtonAhead", "first_sums", "reference_standardisation", "ride_first_newton"]


@dataclass
class NewtonAhead:
    """The first Newton iteration asked ahead: the ``setup`` sent (``features``, ``classes``,
    ``model`` spec, ``part``), the start point ``theta`` ``(k, d + 1)``, the reference standardisation
    ``mean``/``std`` ``(d,)``; ``sums`` and ``sites`` once answered (``None`` before, or when the
    riding part failed)."""

    setup: dict[str, Any]
    theta: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    sums: NewtonSums | None = None
    sites: frozenset[str] = field(default_factory=frozenset)


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


def ride_first_newton(federation: Federation, features: Sequence[str], classes: Sequence[str], model: Any, *,
                      mean: np.ndarray, std: np.ndarray, seed: int = 0, part: str = "train") -> NewtonAhead | None:
    """Queue the first Newton iteration of a logistic ``model`` over ``features`` and ``classes`` (the
    agreed class labels, sorted as the description sorts them) at the model's start point, standardised
    with the reference ``mean``/``std``, to ride on the next exchange. Returns the holder, or ``None``
    (nothing queued) for a model that does not train by Newton, fewer than two classes, or a run that
    is not plain (:func:`~fedtab.federation.protocol.riders.ride_step`)."""
    from fedtab.federation.protocol.riders import ride_step

    fm = make_model(model)
    if not (isinstance(fm, LogisticRegressionModel) and fm.newton) or len(classes) < 2 or not features:
        return None
    d = len(features)
    spec = {"name": fm.name, "params": fm.get_params()}
    theta = as_theta(fm.init(d, len(classes), seed))
    setup = {"features": list(features), "classes": list(classes), "model": spec, "part": str(part)}
    held = NewtonAhead(setup, theta, np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64))
    request = newton_request(theta, round_=1, setup=setup, mean=held.mean, std=held.std)
    step = newton_step(federation, request, theta.shape[0], d, str(part), round_=1, l2=fm.l2)

    def keep(sums: NewtonSums) -> None:
        held.sums = sums

    def aggregate(summed: Any) -> NewtonSums:  # remember which sites the sums cover
        held.sites = frozenset(summed.sites)
        return step.aggregate(summed)

    return held if ride_step(federation, replace(step, aggregate=aggregate), keep, independent=True) else None


def first_sums(ahead: NewtonAhead | None, setup: Mapping[str, Any], theta: np.ndarray, mean: np.ndarray,
               std: np.ndarray, sites: Sequence[str]) -> NewtonSums | None:
    """The first iteration's sums for the run's ``setup``, start point ``theta`` and pooled
    standardisation ``mean``/``std``, rewritten from ``ahead`` (:func:`~fedtab.learn.newton.restandardise`),
    or ``None`` when ``ahead`` was not answered or was asked for another setup, point or set of ``sites``
    (a site left out since, or a step between that changed the columns)."""
    if ahead is None or ahead.sums is None:
        return None
    if dict(ahead.setup) != dict(setup) or ahead.sites != frozenset(sites):
        return None
    if ahead.theta.shape != np.shape(theta):
        return None
    at, grad, hess = restandardise(ahead.theta, ahead.sums.grad, ahead.sums.hess, ahead.mean, ahead.std, mean, std)
    if not (np.isfinite(grad).all() and np.isfinite(hess).all()) or not np.allclose(at, theta, rtol=0, atol=1e-12):
        return None  # the sums were taken at another point than the run's start
    return NewtonSums(grad, hess, ahead.sums.n)
