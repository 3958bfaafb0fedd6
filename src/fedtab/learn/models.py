"""Models trained by FedAvg: parameters are dicts of numpy arrays.

A :class:`FederatedModel` is stateless: the server holds the global parameters,
each site calls :meth:`FederatedModel.local_update` on its own rows, and the server
combines the updates with :meth:`FederatedModel.aggregate` (sample-weighted mean by
default; models with an exact aggregation override it). Inputs to a model are
already standardised with the federation's global mean/std and have no NaN;
labels are class indices ``0..C-1`` of the class list agreed by all sites.

Register new models in :data:`MODELS`; the training workflow builds them by name.

:func:`model_cost` estimates, before anything is built, what a model spec costs a site
(:class:`Cost`: work and size), so a site can refuse a server-chosen spec that would hang it
or exhaust its memory (``DisclosurePolicy.max_work``/``max_size``), and a model file can be
refused before its model is allocated.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["Params", "Cost", "FederatedModel", "LogisticRegressionModel", "GradientBoostedTreesModel", "LinearRegressionModel", "MODELS",
           "make_model", "model_cost", "fedavg", "sigmoid", "STEP_OVERHEAD", "count_param", "driver"]

Params = dict[str, np.ndarray]

#: work charged for every optimiser step, iteration or estimator whatever its size (Python and
#: library overhead, about a millisecond): a spec asking for 10**9 tiny steps is not cheap.
STEP_OVERHEAD = 1e6


@dataclass(frozen=True)
class Cost:
    """A rough estimate of what a selector or model spec costs a site, known before it is built.

    Attributes:
        work: arithmetic operations of the whole computation (≈ multiply-adds: passes over
            the rows times the numbers each touches, plus :data:`STEP_OVERHEAD` per step,
            iteration or estimator).
        size: numbers held at once (parameters, tree nodes, ...).
        driver: the hyper-parameter that makes it large (the one most above its default,
            or ``"rows × features"`` when none is), named in a refusal.
    """

    work: float
    size: float
    driver: str

    def refusal(self, max_work: float, max_size: float, kind: str, spec: Any) -> str | None:
        """Why a site with these caps refuses to run ``spec`` (a ``kind`` = "selector"/"model"), or ``None``."""
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        what = f"{kind} {str(name)[:80]!r}"
        if not self.size <= max_size:
            return (f"{what} would hold ~{self.size:.1e} numbers (parameter {self.driver!r}), more than the site's "
                    f"cap max_size={max_size:g}")
        if not self.work <= max_work:
            return (f"{what} needs ~{self.work:.1e} operations (parameter {self.driver!r}), more than the site's "
                    f"cap max_work={max_work:g}")
        return None


def count_param(value: Any, what: str) -> float:
    """``value`` as a non-negative finite number (a size or count hyper-parameter); ``ValueError`` otherwise."""
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{what} must be a number, got {type(value).__name__}") from None
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{what} must be a finite non-negative number")
    return v


def driver(factors: Mapping[str, tuple[Any, Any]], fallback: str = "rows × features") -> str:
    """The name in ``factors`` (``{name: (value, default)}``) whose value is most above its
    default (ratio > 1), else ``fallback``. Used by the cost estimates to name their culprit."""
    best, ratio = fallback, 1.0
    for name, (value, default) in factors.items():
        try:
            r = float(value) / max(float(default), 1.0)
        except (TypeError, ValueError, OverflowError):
            continue
        if r > ratio:
            best, ratio = name, r
    return best


def fedavg(updates: Sequence[tuple[Params, int]]) -> Params:
    """Sample-weighted mean of parameter dicts: ``Σ n_i p_i / Σ n_i`` per array.

    Raises:
        ValueError: no updates, non-positive weights, or parameter names/shapes that differ.
    """
    if not updates:
        raise ValueError("fedavg needs at least one update")
    keys = set(updates[0][0])
    total = 0.0
    acc: Params = {k: np.zeros_like(v, dtype=np.float64) for k, v in updates[0][0].items()}
    for params, n in updates:
        if n <= 0:
            raise ValueError(f"update weight must be positive, got {n}")
        if set(params) != keys:
            raise ValueError(f"parameter names differ: {sorted(params)} vs {sorted(keys)}")
        for k, v in params.items():
            if v.shape != acc[k].shape:
                raise ValueError(f"parameter {k!r} has shape {v.shape}, expected {acc[k].shape}")
            acc[k] += n * np.asarray(v, dtype=np.float64)
        total += n
    return {k: v / total for k, v in acc.items()}


class FederatedModel(ABC):
    """Interface of a model trained across sites. Constructor args are hyper-parameters."""

    name = "model"
    #: ``True`` for models whose aggregation is exact (sites send sufficient statistics,
    #: one round gives the pooled fit); the training workflow then runs a single round.
    exact = False

    @abstractmethod
    def init(self, n_features: int, n_classes: int, seed: int = 0) -> Params:
        """Initial global parameters for ``n_features`` inputs and ``n_classes`` classes."""

    @abstractmethod
    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int, seed: int = 0) -> Params:
        """Train from ``params`` on ``X`` ``(n, d)`` float, ``y`` ``(n,)`` class indices; return new params."""

    @abstractmethod
    def predict(self, params: Params, X: np.ndarray) -> np.ndarray:
        """``(n,)`` predicted class indices."""

    def update_template(self, n_features: int, n_classes: int) -> dict[str, tuple[int, ...]]:
        """Names and shapes of what a site's :meth:`local_update` returns (used to validate replies).

        Defaults to the shapes of :meth:`init`; exact-aggregation models override it.
        """
        return {k: tuple(v.shape) for k, v in self.init(n_features, n_classes).items()}

    def aggregate(self, updates: Sequence[tuple[Params, int]]) -> Params:
        """Combine ``(params, n_samples)`` from the sites (FedAvg by default)."""
        return fedavg(updates)

    def n_params(self, n_features: int, n_classes: int) -> int:
        """Number of trainable parameters (what crosses the wire each round)."""
        return int(sum(v.size for v in self.init(n_features, n_classes).values()))

    def get_params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def cost(self, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
        """What ``epochs`` local epochs on ``n_rows`` rows cost (see :class:`Cost`).

        The default charges two passes per epoch over every parameter for every row; models
        override it with their own estimate (and must, when :meth:`init` would allocate a
        size the estimate exists to refuse)."""
        size = float(self.n_params(n_features, n_classes))
        return Cost(max(epochs, 1) * (2.0 * n_rows * size + STEP_OVERHEAD), size, driver({"epochs": (epochs, 1)}))


def model_cost(spec: Any, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
    """The :class:`Cost` of training ``spec`` (as :func:`make_model` takes it) for ``epochs``
    local epochs on ``n_rows`` rows of ``n_features`` inputs and ``n_classes`` classes.

    Pure: only the constructor runs (it stores hyper-parameters), nothing is allocated.

    Raises:
        ValueError: an unknown model, bad parameters, or a size that is not a finite number.
    """
    fm = make_model(spec)
    try:
        return fm.cost(int(n_features), int(n_classes), int(n_rows), int(epochs))
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"model {fm.name!r}: {exc}") from None


def sigmoid(z: np.ndarray) -> np.ndarray:
    """``1 / (1 + e^−z)`` without overflow for large ``|z|``."""
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _log_softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of ``z`` ``(n, C)`` (numpy; scipy.special costs ~0.4 s to import)."""
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


class LogisticRegressionModel(FederatedModel):
    """(Multinomial) logistic regression with L2 penalty.

    Trained by federated Newton–Raphson (``solver="newton"``, the default: each round the sites
    sum the log-loss's gradient and Hessian at the server's coefficients, :mod:`fedtab.learn.newton`,
    and the server steps to the pooled penalised maximum-likelihood fit itself) or by FedAvg
    (``solver="fedavg"``, or any ``mu > 0``: FedProx).

    Binary problems use one weight vector (``coef`` ``(1, d)``, ``intercept`` ``(1,)``);
    C > 2 classes use softmax (``(C, d)``, ``(C,)``). A local update runs ``epochs``
    L-BFGS iterations (:func:`~fedtab.learn.lbfgs.minimize_lbfgs`; each at least one full
    pass over the site's rows) on the mean log-loss
    ``+ l2/2·||coef||²  + mu/2·||θ − θ_global||²`` (``mu`` > 0 gives FedProx).

    Args:
        l2: L2 strength on the coefficients (per sample, like ``1/(C·n)`` in scikit-learn).
        mu: FedProx proximal strength (0 = plain FedAvg).
        solver: ``"newton"`` (federated Newton–Raphson on pooled sums) or ``"fedavg"``.

    Raises:
        ValueError: a negative ``l2``/``mu``, an unknown solver.
    """

    name = "logistic"
    SOLVERS = ("newton", "fedavg")

    def __init__(self, l2: float = 1e-3, mu: float = 0.0, solver: str = "newton"):
        if l2 < 0 or mu < 0:
            raise ValueError("l2 and mu must be non-negative")
        if solver not in self.SOLVERS:
            raise ValueError(f"logistic solver must be one of {list(self.SOLVERS)}, got {solver!r}")
        self.l2 = l2
        self.mu = mu
        self.solver = solver

    @property
    def newton(self) -> bool:
        """Whether the training workflow fits it by federated Newton–Raphson (not FedProx)."""
        return getattr(self, "solver", "fedavg") == "newton" and not self.mu  # subclasses (sgd) keep FedAvg

    def init(self, n_features: int, n_classes: int, seed: int = 0) -> Params:
        if n_classes < 2:
            raise ValueError(f"logistic regression needs at least 2 classes, got {n_classes}")
        k = 1 if n_classes == 2 else n_classes
        return {"coef": np.zeros((k, n_features)), "intercept": np.zeros(k)}

    def _logits(self, params: Params, X: np.ndarray) -> np.ndarray:
        return X @ params["coef"].T + params["intercept"]

    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int, seed: int = 0) -> Params:
        coef0, b0 = params["coef"], params["intercept"]
        k, d = coef0.shape
        theta0 = np.concatenate([coef0.ravel(), b0])
        y = np.asarray(y, dtype=np.int64)
        n = max(len(y), 1)
        if k == 1:
            t = y.astype(np.float64)
        else:
            onehot = np.zeros((len(y), k))
            onehot[np.arange(len(y)), y] = 1.0

        from .lbfgs import minimize_lbfgs  # numpy only: scipy.optimize costs 0.5-0.9 s per ClientApp process

        def loss_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
            W = theta[: k * d].reshape(k, d)
            b = theta[k * d :]
            z = X @ W.T + b
            if k == 1:
                z = z[:, 0]
                loss = np.logaddexp(0, z).sum() - (t * z).sum()
                r = (sigmoid(z) - t)[:, None]
            else:
                lsm = _log_softmax(z)
                loss = -(onehot * lsm).sum()
                r = np.exp(lsm) - onehot
            gW = r.T @ X / n + self.l2 * W
            gb = r.sum(axis=0) / n
            loss = loss / n + 0.5 * self.l2 * (W * W).sum()
            g = np.concatenate([gW.ravel(), gb])
            if self.mu:
                diff = theta - theta0
                loss += 0.5 * self.mu * diff @ diff
                g += self.mu * diff
            return float(loss), g

        theta = minimize_lbfgs(loss_grad, theta0, maxiter=max(int(epochs), 1))
        return {"coef": theta[: k * d].reshape(k, d), "intercept": theta[k * d :].copy()}

    def cost(self, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
        """FedAvg/FedProx: per epoch one L-BFGS iteration, about two loss-and-gradient passes over
        the rows (``4·n·size``). Newton (:attr:`newton`): one reply is the gradient and Hessian sums
        over the rows (:func:`fedtab.learn.newton.logistic_sums`), ``2·n·size²`` for the Hessian's
        products plus ``4·n·size``; it holds the ``size × size`` Hessian. A Newton model's setup can
        also be asked for a local L-BFGS fit (``fit``, a local baseline, selection chains), so its
        work is the larger of the two. ``size = k·(d + 1)`` (``k`` = 1 for two classes, else the classes)."""
        size = float((1 if n_classes == 2 else n_classes) * (n_features + 1))
        iterations = max(int(epochs), 1)
        fedavg = iterations * (4.0 * n_rows * size + STEP_OVERHEAD)
        if not self.newton:
            return Cost(fedavg, size, driver({"epochs": (epochs, 1)}))
        newton = 2.0 * n_rows * size * size + 4.0 * n_rows * size + STEP_OVERHEAD
        return Cost(max(newton, fedavg), size * size + size,
                    driver({"features": (n_features, 10)}) if newton >= fedavg else driver({"epochs": (epochs, 1)}))

    def predict_proba(self, params: Params, X: np.ndarray) -> np.ndarray:
        z = self._logits(params, X)
        if z.shape[1] == 1:
            p1 = sigmoid(z[:, 0])
            return np.column_stack([1 - p1, p1])
        return np.exp(_log_softmax(z))

    def predict(self, params: Params, X: np.ndarray) -> np.ndarray:
        z = self._logits(params, X)
        if z.shape[1] == 1:
            return (z[:, 0] > 0).astype(np.int64)
        return np.argmax(z, axis=1)


class GradientBoostedTreesModel(FederatedModel):
    """Histogram gradient-boosted trees (:mod:`fedtab.learn.gbdt`) under the model interface.

    Not trained by FedAvg: the training workflow hands a ``"gbdt"`` model to the federated
    boosting workflow (:func:`fedtab.federation.workflows.gbdt.run_gbdt`), which grows the trees level by
    level from summed histograms. Parameters are the model's arrays
    (:meth:`fedtab.learn.gbdt.GBDTModel.to_arrays`); :meth:`local_update` boosts on one site's
    rows only (the local-only baseline), :meth:`predict`/:meth:`predict_proba` read the arrays.

    Args:
        **params: :class:`fedtab.learn.gbdt.GBDTParams` fields (``n_trees``, ``max_depth``, …);
            unknown names raise ``ValueError``.
    """

    name = "gbdt"

    def __init__(self, **params: Any):
        from .gbdt import GBDTParams

        self._params = GBDTParams.from_dict(params)

    def get_params(self) -> dict[str, Any]:
        return self._params.to_dict()

    def gbdt_params(self, n_classes: int | None = None) -> Any:
        """The :class:`~fedtab.learn.gbdt.GBDTParams`, multiclass when ``n_classes > 2``."""
        from dataclasses import replace

        p = self._params
        if n_classes is not None and p.objective != "regression" and n_classes > 2:
            p = replace(p, objective="multiclass", n_classes=int(n_classes))
        return p

    def init(self, n_features: int, n_classes: int, seed: int = 0) -> Params:
        return {}

    def cost(self, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
        """Boosting ``n_trees`` rounds (one tree per class for multiclass): per level a site adds
        each row's gradients into ``max_bins`` bins of every feature, so the work is about
        ``trees × groups × (max_depth + 1) × rows × features`` plus the split search over the
        bins, and a fixed :data:`STEP_OVERHEAD` per level of a tree; the model holds at most
        ``2^(max_depth+1)`` nodes per tree (fewer than the rows)."""
        p = self.gbdt_params(n_classes)
        groups = p.n_classes if p.objective == "multiclass" else 1
        trees = float(p.n_trees) * groups
        levels = p.max_depth + 1
        nodes = min(2.0 ** levels, 2.0 * max(n_rows, 1))
        work = trees * levels * (float(n_rows) * n_features + nodes * n_features * p.max_bins + STEP_OVERHEAD)
        return Cost(work, trees * nodes * 4, driver({"n_trees": (p.n_trees, 100), "max_depth": (p.max_depth, 6)}))

    def _model(self, params: Params, n_features: int, n_classes: int) -> Any:
        from .gbdt import GBDTModel
        from .gbdt.model import FORMAT, VERSION

        manifest = {"format": FORMAT, "version": VERSION, "params": self.gbdt_params(n_classes).to_dict(),
                    "feature_names": [f"f{i}" for i in range(n_features)], "best_iteration": None}
        return GBDTModel.from_arrays(manifest, params)

    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int, seed: int = 0) -> Params:
        from .gbdt import fit_gbdt_pooled

        y = np.asarray(y, dtype=np.int64)
        p = self.gbdt_params(int(y.max()) + 1 if y.size else 2)
        if p.objective == "binary" and y.size and y.max() < 1:
            p = self._params  # one class seen: still a binary model
        return fit_gbdt_pooled(np.asarray(X, dtype=np.float64), y, p).to_arrays()

    def predict_proba(self, params: Params, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        K = np.asarray(params["base_margin"]).size
        return self._model(params, X.shape[1], K if K > 1 else 2).predict_proba(X)

    def predict(self, params: Params, X: np.ndarray) -> np.ndarray:
        return np.argmax(self.predict_proba(params, X), axis=1)


class LinearRegressionModel(FederatedModel):
    """Least squares (ridge ``l2`` per row) on a numeric target, aggregated exactly.

    ``exact = True``: a site's update is its sufficient statistics over its training rows —
    ``count`` ``(1,)``, ``xtx`` ``(d+1, d+1)`` = ``Aᵀ A`` and ``xty`` ``(d+1,)`` = ``Aᵀ y`` with
    ``A = [1, X]`` — and :meth:`aggregate` solves the pooled normal equations
    ``(Σ AᵀA + l2·n·I₀) w = Σ Aᵀy`` (``I₀``: the identity without the intercept). One round
    gives the model least squares fits on the pooled rows (up to float rounding), whatever the
    sites' split. Parameters: ``coef`` ``(d,)``, ``intercept`` ``(1,)``; :meth:`predict`
    returns numbers, not class indices; ``y`` is the target itself (float), not class indices.
    """

    name = "linear"
    exact = True

    def __init__(self, l2: float = 1e-6):
        l2 = count_param(l2, "l2")
        self.l2 = l2

    def init(self, n_features: int, n_classes: int = 1, seed: int = 0) -> Params:
        return {"coef": np.zeros(n_features), "intercept": np.zeros(1)}

    def update_template(self, n_features: int, n_classes: int = 1) -> dict[str, tuple[int, ...]]:
        return {"count": (1,), "xtx": (n_features + 1, n_features + 1), "xty": (n_features + 1,)}

    def cost(self, n_features: int, n_classes: int = 1, n_rows: int = 1, epochs: int = 1) -> Cost:
        """One pass over the rows (``Aᵀ A``: ``(d+1)²`` per row), whatever ``epochs``."""
        size = float((n_features + 1) ** 2)
        return Cost(n_rows * size + STEP_OVERHEAD, size, "rows × features")

    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int = 1, seed: int = 0) -> Params:
        """The statistics of ``(X (n, d), y (n,) float)`` (the incoming ``params`` are not used)."""
        A = np.hstack([np.ones((X.shape[0], 1)), np.asarray(X, dtype=np.float64)])
        t = np.asarray(y, dtype=np.float64)
        return {"count": np.array([float(len(t))]), "xtx": A.T @ A, "xty": A.T @ t}

    @staticmethod
    def check_statistics(p: Params, n: int) -> None:
        """Raise ``ValueError`` unless ``p`` is a consistent update over at most ``n`` rows
        (count an integer ``≤ n``, ``xtx`` symmetric with ``xtx[0, 0] = count`` and a
        non-negative diagonal, everything finite)."""
        count = float(np.asarray(p["count"]).ravel()[0])
        xtx = np.asarray(p["xtx"], dtype=np.float64)
        if not (count.is_integer() and 0 <= count <= n):
            raise ValueError(f"the row count must be an integer in 0..{n}")
        if not (np.isfinite(xtx).all() and np.isfinite(np.asarray(p["xty"])).all()):
            raise ValueError("the normal-equation statistics are not finite")
        if xtx[0, 0] != count or (np.diag(xtx) < 0).any():
            raise ValueError("the normal-equation statistics are inconsistent with the row count")
        if not np.allclose(xtx, xtx.T, rtol=1e-9, atol=1e-9 * max(1.0, float(np.abs(xtx).max()))):
            raise ValueError("the normal-equation statistics are not symmetric")

    def aggregate(self, updates: Sequence[tuple[Params, int]]) -> Params:
        """Solve the pooled normal equations of the summed statistics (least-norm when singular).

        Raises:
            ValueError: no updates, or no rows in them.
        """
        if not updates:
            raise ValueError("linear regression needs at least one update")
        xtx = sum(np.asarray(p["xtx"], dtype=np.float64) for p, _ in updates)
        xty = sum(np.asarray(p["xty"], dtype=np.float64) for p, _ in updates)
        n = float(sum(float(np.asarray(p["count"]).ravel()[0]) for p, _ in updates))
        if not n > 0:
            raise ValueError("linear regression: the summed statistics hold no rows")
        penalty = np.eye(len(xty)) * self.l2 * n
        penalty[0, 0] = 0.0
        w = np.linalg.lstsq(xtx + penalty, xty, rcond=None)[0]
        return {"coef": w[1:], "intercept": w[:1]}

    def predict(self, params: Params, X: np.ndarray) -> np.ndarray:
        """``(n,)`` predicted values (float64)."""
        return np.asarray(X, dtype=np.float64) @ np.asarray(params["coef"]) + float(np.asarray(params["intercept"])[0])


#: name -> model class (``gnb``, ``sgd`` and ``mlp`` are registered by ``fedtab.learn``).
MODELS: dict[str, type[FederatedModel]] = {LogisticRegressionModel.name: LogisticRegressionModel,
                                           GradientBoostedTreesModel.name: GradientBoostedTreesModel,
                                           LinearRegressionModel.name: LinearRegressionModel}


def make_model(spec: Any) -> FederatedModel:
    """A model from a name, ``{"name": ..., "params": {...}}``, or a :class:`FederatedModel`.

    Raises:
        ValueError: unknown name (listing the known ones) or bad parameters.
    """
    if isinstance(spec, FederatedModel):
        return spec
    params: dict[str, Any] = {}
    if isinstance(spec, dict):
        params = dict(spec.get("params") or {})
        spec = spec.get("name")
    cls = MODELS.get(str(spec))
    if cls is None:
        raise ValueError(f"unknown model {spec!r}; known: {sorted(MODELS)}")
    try:
        return cls(**params)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"bad parameters for model {spec!r}: {exc}") from None
