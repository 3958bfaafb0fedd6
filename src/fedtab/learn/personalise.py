"""Per-site personalisation of a federated logistic model, and prediction with it.

A federated model ignores how sites differ (case mix, measurement habits); each site can
adapt it on its own rows without sending them. Modes, simplest first (:data:`MODES`):

* ``"none"`` — the federated model as it is;
* ``"intercept"`` — a per-site shift ``δ`` ``(k,)`` of the logits (the site's base rate);
* ``"calibration"`` — per-site Platt scaling ``a·z + δ`` of the logits (``a`` scalar);
* ``"finetune:<mu>"`` — the site's own coefficients, trained from the federated ones with a
  proximal pull ``mu/2·||θ − θ_fed||²`` towards them (FedProx / Ditto style);
* ``"local"`` — the site's own model trained on its rows alone (no federation), the
  reference every site can reach by itself.

Each adaptation is fitted on the site's own rows (standardised with the federation's
mean/std, missing cells at 0); the small ones are shrunk towards "no change" by one
pseudo-row of weight (``shrink / n``). Pure numpy over arrays: no federation here.

:func:`personalised_predict` applies a stored personalised model (:data:`PersonalisedModel`,
the structure a model file keeps) to raw rows of a named site.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .lbfgs import minimize_lbfgs
from .models import LogisticRegressionModel, Params, _log_softmax, sigmoid

__all__ = ["MODES", "check_mode", "mode_order", "logits", "proba_from_logits", "log_loss_sum", "personalise",
           "personalised_proba", "personalised_predict", "PersonalisedModel", "LOG_LOSS_EPS"]

#: the modes :func:`personalise` fits, simplest first (``finetune`` takes a strength: ``"finetune:0.1"``)
MODES = ("none", "intercept", "calibration", "finetune", "local")
#: probabilities are clipped to ``[eps, 1 - eps]`` in the log-loss (as scikit-learn's ``log_loss`` did)
LOG_LOSS_EPS = 1e-15

#: A personalised model as a model file stores it (JSON-able once arrays are lists):
#: ``{"features": [...], "classes": [...], "mean": (d,), "std": (d,), "params": {"coef": (k, d),
#: "intercept": (k,)}, "personalisation": {"mode": str, "sites": {site: params}}}`` where a site's
#: params are ``{"shift": (k,)}`` (intercept), ``{"scale": (1,), "shift": (k,)}`` (calibration)
#: or ``{"coef", "intercept"}`` (finetune / local).
PersonalisedModel = Mapping[str, Any]


def check_mode(mode: str) -> str:
    """``mode`` if it names a mode of :data:`MODES` (``finetune:<mu>`` with ``mu > 0``).

    Raises:
        ValueError: an unknown mode or a non-positive / non-numeric strength.
    """
    if not isinstance(mode, str):
        raise ValueError(f"a personalisation mode is a string, got {type(mode).__name__}")
    if mode.startswith("finetune:"):
        try:
            mu = float(mode.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"personalisation {mode!r}: the strength after 'finetune:' must be a number") from None
        if not (np.isfinite(mu) and mu > 0):
            raise ValueError(f"personalisation {mode!r}: the strength must be positive")
        return mode
    if mode not in MODES or mode == "finetune":
        raise ValueError(f"unknown personalisation {mode!r}; known: none, intercept, calibration, finetune:<mu>, "
                         "local")
    return mode


def mode_order(mode: str) -> float:
    """A complexity rank of ``mode`` (smaller = simpler): none < intercept < calibration <
    finetune (strong pull first: ``finetune:1`` < ``finetune:0.1``) < local."""
    check_mode(mode)
    if mode.startswith("finetune:"):
        return 3.0 + 1.0 / (1.0 + float(mode.split(":", 1)[1]))
    return {"none": 0.0, "intercept": 1.0, "calibration": 2.0, "local": 5.0}[mode]


def logits(params: Params, Z: np.ndarray) -> np.ndarray:
    """``(n, k)`` logits of a logistic model on standardised rows ``Z`` ``(n, d)``."""
    return Z @ np.asarray(params["coef"]).T + np.asarray(params["intercept"])


def proba_from_logits(z: np.ndarray) -> np.ndarray:
    """``(n, C)`` class probabilities from ``(n, k)`` logits (``k = 1``: binary)."""
    if z.shape[1] == 1:
        p1 = sigmoid(z[:, 0])
        return np.column_stack([1 - p1, p1])
    return np.exp(_log_softmax(z))


def log_loss_sum(y: np.ndarray, proba: np.ndarray) -> float:
    """``Σ_i −log p_i(y_i)`` with probabilities clipped to ``[eps, 1 − eps]`` (:data:`LOG_LOSS_EPS`)."""
    y = np.asarray(y, dtype=np.int64)
    if not len(y):
        return 0.0
    p = np.clip(proba[np.arange(len(y)), y], LOG_LOSS_EPS, 1 - LOG_LOSS_EPS)
    return float(-np.log(p).sum())


def _mean_loss_grad(z: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean log-loss of logits ``z`` ``(n, k)`` and its gradient with respect to ``z``."""
    n = max(len(y), 1)
    if z.shape[1] == 1:
        t = y.astype(np.float64)
        zz = z[:, 0]
        loss = float((np.logaddexp(0, zz) - t * zz).sum()) / n
        return loss, ((sigmoid(zz) - t) / n)[:, None]
    lsm = _log_softmax(z)
    onehot = np.zeros_like(z)
    onehot[np.arange(len(y)), y] = 1.0
    return float(-(onehot * lsm).sum()) / n, (np.exp(lsm) - onehot) / n


def _fit_affine(z: np.ndarray, y: np.ndarray, scale: bool, shrink: float) -> dict[str, np.ndarray]:
    """``{"shift"}`` (and ``{"scale"}``) minimising the mean log-loss of ``a·z + δ`` plus
    ``shrink/(2n)·((a − 1)² + ||δ||²)``."""
    k = z.shape[1]
    lam = shrink / max(len(y), 1)

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        a = theta[0] if scale else 1.0
        d = theta[-k:]
        loss, g = _mean_loss_grad(a * z + d, y)
        grad_d = g.sum(axis=0) + lam * d
        loss += 0.5 * lam * float(d @ d)
        if not scale:
            return loss, grad_d
        loss += 0.5 * lam * (a - 1.0) ** 2
        return loss, np.concatenate([[float((g * z).sum()) + lam * (a - 1.0)], grad_d])

    theta0 = np.concatenate([[1.0] if scale else [], np.zeros(k)])
    theta = minimize_lbfgs(fun, theta0, maxiter=50)
    out = {"shift": theta[-k:].copy()}
    if scale:
        out["scale"] = theta[:1].copy()
    return out


def personalise(mode: str, params: Params, Z: np.ndarray, y: np.ndarray, *, l2: float = 1e-3, epochs: int = 50,
                shrink: float = 1.0) -> dict[str, np.ndarray]:
    """A site's adaptation of the federated ``params`` on its rows ``(Z, y)`` (see the module).

    Args:
        mode: one of :data:`MODES` (``"finetune:<mu>"``); ``"none"`` returns ``{}``.
        Z: ``(n, d)`` standardised rows (no NaN); y: ``(n,)`` class indices.
        l2: the model's L2 strength (finetune / local); epochs: L-BFGS iterations (finetune / local).
        shrink: pseudo-rows pulling an intercept / calibration towards no change.

    Returns:
        the site's params (see :data:`PersonalisedModel`); with no rows, "no change".
    """
    mode = check_mode(mode)
    y = np.asarray(y, dtype=np.int64)
    k = np.asarray(params["intercept"]).shape[0]
    if mode == "none":
        return {}
    if not len(y):  # nothing to adapt on: the federated model unchanged
        if mode in ("intercept", "calibration"):
            return {"shift": np.zeros(k), **({"scale": np.ones(1)} if mode == "calibration" else {})}
        return {"coef": np.array(params["coef"], dtype=np.float64), "intercept": np.array(params["intercept"],
                                                                                             dtype=np.float64)}
    if mode in ("intercept", "calibration"):
        return _fit_affine(logits(params, Z), y, mode == "calibration", shrink)
    if mode == "local":
        model = LogisticRegressionModel(l2=l2)
        start = {"coef": np.zeros_like(np.asarray(params["coef"], dtype=np.float64)), "intercept": np.zeros(k)}
    else:
        model = LogisticRegressionModel(l2=l2, mu=float(mode.split(":", 1)[1]))
        start = {"coef": np.asarray(params["coef"], dtype=np.float64),
                 "intercept": np.asarray(params["intercept"], dtype=np.float64)}
    return model.local_update(start, Z, y, epochs=int(epochs))


def personalised_proba(mode: str, params: Params, site_params: Mapping[str, Any] | None, Z: np.ndarray) -> np.ndarray:
    """``(n, C)`` probabilities of the federated ``params`` adapted by ``site_params`` (from
    :func:`personalise` with ``mode``) on standardised rows ``Z``; ``site_params=None`` or
    mode ``"none"``: the federated model."""
    check_mode(mode)
    if mode == "none" or site_params is None:
        return proba_from_logits(logits(params, Z))
    sp = {k: np.asarray(v, dtype=np.float64) for k, v in site_params.items()}
    if "coef" in sp:
        return proba_from_logits(logits(sp, Z))
    z = logits(params, Z)
    scale = float(sp["scale"][0]) if "scale" in sp else 1.0
    return proba_from_logits(scale * z + sp["shift"])


def personalised_predict(model: PersonalisedModel, X: np.ndarray, site: str | None = None) -> np.ndarray:
    """``(n, C)`` class probabilities of a stored personalised model on raw rows of ``site``.

    Args:
        model: a :data:`PersonalisedModel` (as :func:`fedtab.federation.workflows.selection.select_model`
            returns it in ``SelectionOutcome.model``, and a model file stores it).
        X: ``(n, d)`` raw values of ``model["features"]`` in that order; NaN = missing
            (predicted at the federation's mean, as in training).
        site: the site whose personalised model to use; ``None``: the federated model.

    Raises:
        ValueError: ``X`` of the wrong width, or a site the model has no personalisation for
            (naming the known ones) when the model is personalised.
    """
    feats = list(model["features"])
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[1] != len(feats):
        raise ValueError(f"X must be (n, {len(feats)}) over the model's features, got shape {X.shape}")
    mean, std = np.asarray(model["mean"], np.float64), np.asarray(model["std"], np.float64)
    Z = (X - mean) / std
    Z[np.isnan(Z)] = 0.0
    params = {k: np.asarray(v, dtype=np.float64) for k, v in model["params"].items()}
    pers = model.get("personalisation") or {"mode": "none", "sites": {}}
    mode = str(pers.get("mode", "none"))
    if site is None or mode == "none":
        return personalised_proba("none", params, None, Z)
    sites = pers.get("sites") or {}
    if site not in sites:
        raise ValueError(f"the model has no personalisation for site {site!r}; known: {sorted(sites)}")
    return personalised_proba(mode, params, sites[site], Z)
