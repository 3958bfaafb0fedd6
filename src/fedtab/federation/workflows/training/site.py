"""The training workflow's site side: the handlers that fit a model.

Handlers (each declared once, with the release it makes, in :mod:`fedtab.federation.protocol.kinds`):

* ``"fit"`` — the local update from the global parameters; the first one carries the setup
  (features, classes, standardisation, model spec, part) that the site stores; a stand-alone
  ``"setup"`` request has the same effect.

The description (``"describe"``) and the evaluation (``"evaluate"``) that a training run also
asks for are shared steps (:mod:`fedtab.federation.steps.describe`,
:mod:`fedtab.federation.steps.evaluate`); the site's matrices are :mod:`fedtab.federation.site.matrices`.
Features a site does not hold, and missing cells, are filled with the global mean (0 after
standardisation). Nothing here knows which engine, strategy or mode the server runs.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedtab.federation.protocol.messages import Message
from fedtab.federation.site.core import Site
from fedtab.federation.site.registry import handler
from fedtab.federation.site.matrices import prepared_matrix
from fedtab.federation.steps.params import SETUP, params_from, params_to
from fedtab.learn.models import LogisticRegressionModel, make_model
from fedtab.privacy.dp import DP_GD_LR, DP_META, clip_update, dp_logistic_update, noise_rng


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


@handler("fit")
def _fit(site: Site, request: Message) -> Message:
    carried = request.meta.get("setup")
    if carried is not None:  # the first round carries the setup (no separate exchange)
        if not isinstance(carried, dict):
            raise ValueError("fit: 'setup' must be a JSON object")
        _store_setup(site, carried, request.arrays[SETUP + "mean"], request.arrays[SETUP + "std"])
        if carried.get("part", "train") == "train":  # read the table once: the test rows' matrix rides in the
            try:  # state, so later fits and the evaluation need neither the file nor pandas
                prepared_matrix(site, "test")
            except ValueError:  # e.g. a test label outside the class list: the evaluation reports it
                pass
    setup = site.state.get("train_setup") or {}
    X, y = prepared_matrix(site, setup.get("part", "train"))
    model = make_model(site.state["train_setup"]["model"])
    params = params_from(request)
    dp = request.meta.get(DP_META)
    if dp is not None and model.exact:
        raise ValueError(f"differential privacy is not available for the exact-aggregation model {model.name!r}")
    if model.exact and not params:
        params = model.init(X.shape[1], len(site.state["train_setup"]["classes"]))
    if dp is not None and isinstance(model, LogisticRegressionModel):  # DP gradient descent
        params = dp_logistic_update(params, X, y, steps=int(dp.get("steps", 1)), lr=float(dp.get("lr", DP_GD_LR)),
                                    l2=model.l2, spec=dp, rng=noise_rng())
    else:
        received = params
        params = model.local_update(params, X, y, epochs=int(request.meta.get("epochs", 1)),
                                    seed=int(request.meta.get("seed", 0)))
        if dp is not None:  # DP-FedAvg: clip the update, add noise, before any masking
            params = clip_update(params, received, dp, noise_rng())
    if model.exact and "count" in params:  # per-class statistics: suppress small classes
        counts = np.asarray(params["count"])
        small = (counts > 0) & (counts < site.policy.min_rows)
        params = {k: np.where(small.reshape((-1,) + (1,) * (np.ndim(v) - 1)), 0, v) for k, v in params.items()}
    return Message("fit", params_to(params), {"n_samples": int(len(y))})






