"""The training workflow's site side: the handlers that fit a model.

Handlers (each declared once, with the release it makes, in :mod:`fedtab.federation.protocol.kinds`):

* ``"fit"`` — the local update from the global parameters; the first one carries the setup
  (features, classes, standardisation, model spec, part) that the site stores; a stand-alone
  ``"setup"`` request has the same effect;
* ``"newton"`` — a logistic model's log-loss gradient and Hessian summed over the training
  part at the server's coefficients (federated Newton–Raphson, :mod:`fedtab.learn.newton`); the
  first carries the setup as the first ``"fit"`` does.

The description (``"describe"``) and the evaluation (``"evaluate"``) that a training run also
asks for are shared steps (:mod:`fedtab.federation.steps.describe`,
:mod:`fedtab.federation.steps.evaluate`); the site's matrices are :mod:`fedtab.federation.site.matrices`.
Features a site does not hold, and missing cells, are filled with the global mean (0 after
standardisation). Nothing here knows which engine, strategy or mode the server runs: under DP the
kinds' mod (:func:`fedtab.federation.site.mods.dp_noise_param`, applied by ``Site.handle``) sets the
``noise`` parameter the update and the Newton sums are released under.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.site.mods import site_params
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import held_features, prepared_matrix
from fedtab.federation.steps.params import SETUP, params_from, params_to
from fedtab.learn.models import LogisticRegressionModel, make_model
from fedtab.privacy.dp import DP_GD_LR, DP_META, add_noise, clip_update, column_bounds, dp_logistic_update, noise_rng


def _store_setup(site: Site, meta: Mapping[str, Any], mean: Any, std: Any) -> None:
    site.state["train_setup"] = {
        "features": list(meta["features"]),
        "classes": list(meta["classes"]),
        "mean": np.asarray(mean, dtype=np.float64),
        "std": np.asarray(std, dtype=np.float64),
        "model": meta["model"],
        "part": str(meta.get("part", "train")),
        "task": "regression" if meta.get("task") == "regression" else "classes",
    }


@handler("setup")
def _setup(site: Site, request: Message) -> Message:
    _store_setup(site, request.meta, request.arrays["mean"], request.arrays["std"])
    return Message("setup", meta={"ok": True})


def _fit_part(site: Site, request: Message) -> str:
    carried = request.meta.get("setup")
    if isinstance(carried, dict):
        return str(carried.get("part", "train"))
    return str((site.state.get("train_setup") or {}).get("part", "train"))


def _fit_releases(request: Message) -> int:
    """Gaussian releases of one fit under DP: its gradient steps (DP gradient descent) or 1 (DP-FedAvg)."""
    steps = (request.meta.get(DP_META) or {}).get("steps", 1)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else 1


def _carried_setup(site: Site, request: Message) -> None:
    """Store the setup a request carries (the first training round's), if any."""
    carried = request.meta.get("setup")
    if carried is not None:  # the first round carries the setup (no separate exchange)
        if not isinstance(carried, dict):
            raise ValueError(f"{request.kind}: 'setup' must be a JSON object")
        _store_setup(site, carried, request.arrays[SETUP + "mean"], request.arrays[SETUP + "std"])
        if carried.get("part", "train") == "train":  # read the table once: the test rows' matrix rides in the
            try:  # state, so later fits and the evaluation need neither the file nor pandas
                prepared_matrix(site, "test")
            except ValueError:  # e.g. a test label outside the class list: the evaluation reports it
                pass


@handler("fit")
def _fit(site: Site, request: Message) -> Message:
    _carried_setup(site, request)
    setup = site.state.get("train_setup") or {}
    X, y = prepared_matrix(site, setup.get("part", "train"))
    model = make_model(site.state["train_setup"]["model"])
    params = params_from(request)
    noise = site_params(request).get("noise")  # the Gaussian release the update is made under (its DP mod)
    if noise is not None and model.exact:
        raise ValueError(f"differential privacy is not available for the exact-aggregation model {model.name!r}")
    if model.exact and not params:
        params = model.init(X.shape[1], len(site.state["train_setup"]["classes"]))
    if noise is not None and isinstance(model, LogisticRegressionModel):  # DP gradient descent
        params = dp_logistic_update(params, X, y, steps=int(noise.get("steps", 1)),
                                    lr=float(noise.get("lr", DP_GD_LR)), l2=model.l2, spec=noise, rng=noise_rng())
    else:
        received = params
        params = model.local_update(params, X, y, epochs=int(request.meta.get("epochs", 1)),
                                    seed=int(request.meta.get("seed", 0)))
        if noise is not None:  # DP-FedAvg: clip the update, add noise, before any masking
            params = clip_update(params, received, noise, noise_rng())
    if model.exact and "count" in params:  # per-class statistics: suppress small classes
        counts = np.asarray(params["count"])
        small = (counts > 0) & (counts < site.policy.min_rows)
        params = {k: np.where(small.reshape((-1,) + (1,) * (np.ndim(v) - 1)), 0, v) for k, v in params.items()}
    return Message("fit", params_to(params), {"n_samples": int(len(y))})


#: the largest |coefficient| (standardised columns) a site computes Newton sums at: beyond it the
#: per-row weights p(1 − p) approach a half-space indicator of the server's choosing
NEWTON_MAX_COEF = 1e3


@handler("newton")
def _newton(site: Site, request: Message) -> Message:
    """The log-loss gradient and Hessian sums (``grad``, ``hess``) of the set-up logistic model over
    the training part at the request's coefficients (``param:coef``, ``param:intercept``); under DP
    with the ``noise`` parameter (set by its DP mod, :func:`fedtab.federation.site.mods.dp_noise_param`)
    per-row gradients clipped to ``clip`` and rows to the bounds' radius, then Gaussian noise."""
    from fedtab.learn.newton import as_theta, dp_logistic_sums, hessian_sensitivity, logistic_sums, row_bound

    _carried_setup(site, request)
    setup = site.state.get("train_setup")
    if setup is None:
        raise ValueError("newton: training is not set up on this site (no setup received)")
    model = make_model(setup["model"])
    if not isinstance(model, LogisticRegressionModel):
        raise ValueError(f"newton: the set-up model {model.name!r} is not logistic regression")
    X, y = prepared_matrix(site, setup.get("part", "train"))
    theta = as_theta(params_from(request))
    k = 1 if len(setup["classes"]) == 2 else len(setup["classes"])
    if theta.shape != (k, X.shape[1] + 1):
        raise ValueError(f"newton: coefficients of shape {theta.shape}, expected {(k, X.shape[1] + 1)}")
    if not np.isfinite(theta).all() or np.abs(theta).max(initial=0.0) > NEWTON_MAX_COEF:
        raise ValueError(f"newton: coefficients must be finite and within ±{NEWTON_MAX_COEF:g}")
    noise = site_params(request).get("noise")  # the Gaussian release the sums are made under (its DP mod)
    if noise is None:
        grad, hess = logistic_sums(theta, X, y)
    else:
        feats = setup["features"]
        held = held_features(site)
        lo, hi = column_bounds(noise, feats, held=[f for f in feats if f in held])
        mean, std = setup["mean"], setup["std"]
        unheld = np.array([f not in held for f in feats])
        lo, hi = np.where(unheld, mean, lo), np.where(unheld, mean, hi)  # an absent column is z = 0
        radius = row_bound(lo, hi, mean, std)
        clip = float(noise.get("clip", 1.0))
        grad, hess = dp_logistic_sums(theta, X, y, clip=clip, radius=radius)
        rng = noise_rng()
        grad = add_noise(grad, 2.0 * clip, noise, rng)
        hess = add_noise(hess, hessian_sensitivity(k, radius), noise, rng, symmetric=True)
    return Message("newton", {"grad": grad, "hess": hess}, {"n_samples": int(len(y))})
