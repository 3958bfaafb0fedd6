"""Linear classifier (log-loss) trained by mini-batch SGD locally and FedAvg globally.

The counterpart of :class:`sklearn.linear_model.SGDClassifier(loss="log_loss")`, but
multinomial (softmax) for more than two classes so that one parameter set is averaged.
"""

from __future__ import annotations

import math

import numpy as np

from .models import STEP_OVERHEAD, Cost, LogisticRegressionModel, Params, driver

__all__ = ["SGDClassifierModel"]


class SGDClassifierModel(LogisticRegressionModel):
    """Log-loss linear model; each local epoch is one shuffled pass of mini-batch SGD.

    Parameters have the shapes of :class:`~fedtab.learn.models.LogisticRegressionModel`
    (``coef`` ``(k, d)``, ``intercept`` ``(k,)``, ``k = 1`` for two classes).

    Args:
        lr: constant step size.
        alpha: L2 penalty on the coefficients (as ``SGDClassifier.alpha``).
        batch_size: rows per step.
        mu: FedProx proximal strength (0 = plain FedAvg).
        l1: L1 penalty on the coefficients, applied by a proximal (soft-threshold) step
            after each gradient step, so coefficients become exactly zero
            (federated L1-logistic regression).
    """

    name = "sgd"

    def __init__(self, lr: float = 0.05, alpha: float = 1e-4, batch_size: int = 32, mu: float = 0.0,
                 l1: float = 0.0):
        if lr <= 0 or alpha < 0 or batch_size < 1 or mu < 0 or l1 < 0:
            raise ValueError("need lr > 0, alpha >= 0, batch_size >= 1, mu >= 0, l1 >= 0")
        self.l1 = l1
        self.lr = lr
        self.alpha = alpha
        self.batch_size = batch_size
        self.mu = mu
        self.l2 = alpha  # predict/logits of the parent only use the parameters

    def get_params(self) -> dict:
        p = super().get_params()
        p.pop("l2", None)
        return p

    def cost(self, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
        """Per epoch one pass over the rows in ``ceil(n_rows / batch_size)`` steps, each with a
        fixed cost of :data:`STEP_OVERHEAD` / 20 (a numpy step, ~50 µs)."""
        size = float((1 if n_classes == 2 else n_classes) * (n_features + 1))
        steps = max(int(epochs), 1) * max(math.ceil(n_rows / max(float(self.batch_size), 1.0)), 1)
        work = max(int(epochs), 1) * 2.0 * n_rows * size + steps * STEP_OVERHEAD / 20
        return Cost(work, size, driver({"epochs": (epochs, 1), "batch_size": (32, self.batch_size)}))

    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int, seed: int = 0) -> Params:
        W = np.array(params["coef"], dtype=np.float64)
        b = np.array(params["intercept"], dtype=np.float64)
        W0, b0 = W.copy(), b.copy()
        k = W.shape[0]
        y = np.asarray(y, dtype=np.int64)
        n = len(y)
        if n == 0:
            return {"coef": W, "intercept": b}
        rng = np.random.default_rng(seed)
        lr = self.lr
        if k > 1:
            from scipy.special import softmax  # here, not at import: scipy.special costs ~0.5 s per process
        for _ in range(max(int(epochs), 1)):
            order = rng.permutation(n)
            for start in range(0, n, self.batch_size):
                idx = order[start : start + self.batch_size]
                Xb, yb = X[idx], y[idx]
                z = Xb @ W.T + b
                if k == 1:
                    r = (1.0 / (1.0 + np.exp(-np.clip(z[:, 0], -35, 35))) - yb)[:, None]
                else:
                    r = softmax(z, axis=1)
                    r[np.arange(len(yb)), yb] -= 1.0
                gW = r.T @ Xb / len(yb) + self.alpha * W
                gb = r.mean(axis=0)
                if self.mu:
                    gW += self.mu * (W - W0)
                    gb += self.mu * (b - b0)
                W -= lr * gW
                b -= lr * gb
                if self.l1:
                    W = np.sign(W) * np.maximum(np.abs(W) - lr * self.l1, 0.0)
        return {"coef": W, "intercept": b}
