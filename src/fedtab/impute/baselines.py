"""Baselines for heterogeneous-schema imputation, all behind one interface.

Every method is ``fn(train, columns, queries, seed) -> predictions``:

* ``train``: one DataFrame per site (its own columns, NaN = missing), z-scored;
* ``columns``: the global schema (F names);
* ``queries``: one DataFrame per site (its own columns, NaN = cells to fill);
* returns one (n_query_s, F) float array per site: a prediction for every cell of
  the global schema (observed cells may be predicted too; the harness scores only
  the hidden ones).

Federated: global mean, Fed-DAE (FedAvg of a denoising autoencoder), low-rank
Gaussian (factor analysis) by federated EM on pooled expected sufficient statistics,
Not federated: local mean. (FedHF-Impute itself, its ablation and the local-only GNN
run the federated workflow, so their adapters live with the benchmark in
``benchmarks/impute_methods.py``; this module imports no engine.)
Centralised upper-bound references on pooled rows: MICE (IterativeImputer), kNN.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "Method", "to_global", "global_mean", "local_mean", "low_rank_em", "LowRankGaussian", "fed_dae",
    "mice", "knn", "METHODS",
]

Method = Callable[[Sequence[pd.DataFrame], list[str], Sequence[pd.DataFrame], int], list[np.ndarray]]


def to_global(table: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """(n, F) float array over the global schema; NaN for missing and absent columns."""
    pos = {c: i for i, c in enumerate(columns)}
    out = np.full((len(table), len(columns)), np.nan)
    out[:, [pos[str(c)] for c in table.columns]] = table.to_numpy(dtype=np.float64, na_value=np.nan)
    return out


def _pooled_mean(train: Sequence[pd.DataFrame], columns: list[str]) -> np.ndarray:
    x = np.vstack([to_global(t, columns) for t in train])
    cnt = (~np.isnan(x)).sum(0)
    return np.where(cnt > 0, np.nansum(x, 0) / np.maximum(cnt, 1), 0.0)


def global_mean(train, columns, queries, seed=0):
    """Pooled (federated) column means for every cell."""
    m = _pooled_mean(train, columns)
    return [np.tile(m, (len(q), 1)) for q in queries]


def local_mean(train, columns, queries, seed=0):
    """Each site's own column means; columns it lacks get the pooled mean."""
    g = _pooled_mean(train, columns)
    out = []
    for t, q in zip(train, queries):
        m = g.copy()
        x = to_global(t, columns)
        cnt = (~np.isnan(x)).sum(0)
        m = np.where(cnt > 0, np.nansum(x, 0) / np.maximum(cnt, 1), m)
        out.append(np.tile(m, (len(q), 1)))
    return out


# ------------------------------------------------------------------ low-rank Gaussian EM
class LowRankGaussian:
    """Factor analysis ``x = mu + W z + e``, ``z ~ N(0, I_k)``, ``e ~ N(0, diag(psi))``,
    fitted by EM where each site computes expected sufficient statistics of its rows
    (:meth:`site_stats`) and the server sums them and solves the M-step
    (:meth:`m_step`). Missing and absent cells are simply unobserved dimensions.

    Args:
        rank: number of factors ``k``. n_iter: EM iterations. min_psi: noise floor.
    """

    def __init__(self, rank: int = 4, n_iter: int = 50, min_psi: float = 1e-3) -> None:
        self.rank, self.n_iter, self.min_psi = rank, n_iter, min_psi

    def _posterior(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        obs = ~np.isnan(x)
        xc = np.where(obs, x - self.mu_, 0.0)
        wp = self.W_ / self.psi_[:, None]  # (F, k)
        k = self.rank
        # M_r = I + W^T diag(o_r / psi) W
        m = np.eye(k) + np.einsum("rf,fa,fb->rab", obs.astype(np.float64), wp, self.W_, optimize=True)
        minv = np.linalg.inv(m)
        ez = np.einsum("rab,rb->ra", minv, xc @ wp)
        return obs, ez, minv

    def site_stats(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """E-step at one site: per feature ``A`` (F, k+1, k+1), ``b`` (F, k+1), ``c`` (F,), ``n`` (F,)."""
        obs, ez, minv = self._posterior(x)
        n = len(x)
        zt = np.hstack([ez, np.ones((n, 1))])
        ezz = np.einsum("ra,rb->rab", zt, zt)
        ezz[:, : self.rank, : self.rank] += minv
        o = obs.astype(np.float64)
        xv = np.where(obs, x, 0.0)
        a = np.einsum("rf,rab->fab", o, ezz, optimize=True)
        b = np.einsum("rf,ra->fa", xv, zt)
        return a, b, (xv * xv).sum(0), o.sum(0)

    def m_step(self, a: np.ndarray, b: np.ndarray, c: np.ndarray, n: np.ndarray) -> None:
        """Server M-step from pooled statistics (sums over sites)."""
        reg = 1e-6 * np.eye(self.rank + 1)
        theta = np.linalg.solve(a + reg, b[..., None])[..., 0]  # (F, k+1)
        self.W_, self.mu_ = theta[:, : self.rank], theta[:, self.rank]
        psi = (c - np.einsum("fa,fa->f", theta, b)) / np.maximum(n, 1)
        self.psi_ = np.maximum(psi, self.min_psi)

    def fit(self, site_arrays: Sequence[np.ndarray], corr: np.ndarray | None = None, seed: int = 0) -> "LowRankGaussian":
        """Fit on per-site (n_s, F) arrays in the global schema (NaN = unobserved).

        ``corr``: optional (F, F) pooled correlation used for a PCA start.
        """
        f = site_arrays[0].shape[1]
        rng = np.random.default_rng(seed)
        self.mu_ = np.zeros(f)
        if corr is not None:
            c = np.nan_to_num(corr)
            np.fill_diagonal(c, 1.0)
            val, vec = np.linalg.eigh(c)
            top = np.argsort(val)[::-1][: self.rank]
            self.W_ = vec[:, top] * np.sqrt(np.maximum(val[top], 1e-3)) * 0.9
        else:
            self.W_ = rng.normal(scale=0.5, size=(f, self.rank))
        self.psi_ = np.full(f, 0.5)
        for _ in range(self.n_iter):
            parts = [self.site_stats(x) for x in site_arrays]
            self.m_step(*(sum(p[i] for p in parts) for i in range(4)))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Conditional mean ``E[x | observed part]`` for every cell of (n, F) ``x``."""
        _, ez, _ = self._posterior(x)
        return self.mu_ + ez @ self.W_.T


def low_rank_em(train, columns, queries, seed=0, rank: int | None = None, n_iter: int = 50):
    """Federated low-rank Gaussian; rank defaults to ``min(10, max(2, F // 4))``."""
    from .stats import pool_stats, site_stats

    arrays = [to_global(t, columns) for t in train]
    corr = pool_stats([site_stats(a, columns) for a in arrays]).corr
    k = rank or min(10, max(2, len(columns) // 4))
    model = LowRankGaussian(rank=k, n_iter=n_iter).fit(arrays, corr=corr, seed=seed)
    return [model.predict(to_global(q, columns)) for q in queries]


# --------------------------------------------------------------------------- Fed-DAE
def fed_dae(train, columns, queries, seed=0, rounds: int = 20, width: int = 128, lr: float = 2e-3,
            batch_size: int = 64, mask_fraction: float = 0.4):
    """FedAvg of a denoising autoencoder over the global schema.

    Input per row: ``[value or 0, observed flag]`` for every column (2F); output F.
    Trained like FedHF-Impute (hide observed entries, MSE), one local epoch per round.
    """
    import torch
    from torch import nn

    from .model import numpy_to_state, state_to_numpy
    from .train import fedavg, hide_entries

    torch.manual_seed(seed)
    f = len(columns)

    def make():
        return nn.Sequential(nn.Linear(2 * f, width), nn.GELU(), nn.Linear(width, width), nn.GELU(),
                             nn.Linear(width, f))

    def run(model, x, obs):
        return model(torch.cat([torch.where(obs, x, torch.zeros_like(x)), obs.float()], dim=1))

    rng = np.random.default_rng(seed)
    arrays = [to_global(t, columns) for t in train]
    models = [make() for _ in arrays]
    opts = [torch.optim.Adam(m.parameters(), lr=lr) for m in models]
    weights = state_to_numpy(models[0])
    for _ in range(rounds):
        new = []
        for m, opt, a in zip(models, opts, arrays):
            numpy_to_state(m, weights)
            obs_all = ~np.isnan(a)
            vals = np.nan_to_num(a).astype(np.float32)
            for idx in np.array_split(rng.permutation(len(a)), max(1, len(a) // batch_size)):
                hidden, _ = hide_entries(obs_all[idx], mask_fraction, 0.0, rng)
                if not hidden.any():
                    continue
                x = torch.as_tensor(vals[idx])
                pred = run(m, x, torch.as_tensor(obs_all[idx] & ~hidden))
                loss = ((pred - x)[torch.as_tensor(hidden)] ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
            new.append(state_to_numpy(m))
        weights = fedavg(new, [len(a) for a in arrays])
    model = make()
    numpy_to_state(model, weights)
    model.eval()
    out = []
    with torch.no_grad():
        for q in queries:
            a = to_global(q, columns)
            out.append(run(model, torch.as_tensor(np.nan_to_num(a).astype(np.float32)),
                           torch.as_tensor(~np.isnan(a))).numpy().astype(np.float64))
    return out


# ------------------------------------------------------------------ centralised references
def _pooled_train(train, columns):
    x = np.vstack([to_global(t, columns) for t in train])
    return x


def mice(train, columns, queries, seed=0, max_iter: int = 10, n_nearest_features: int | None = 30):
    """Centralised MICE (IterativeImputer, BayesianRidge, float64) on pooled training rows."""
    from sklearn.experimental import enable_iterative_imputer  # noqa: F401
    from sklearn.impute import IterativeImputer

    x = _pooled_train(train, columns)
    nnf = None if n_nearest_features is None or n_nearest_features >= len(columns) else n_nearest_features
    imp = IterativeImputer(max_iter=max_iter, n_nearest_features=nnf, random_state=seed, keep_empty_features=True,
                           tol=1e-3)
    imp.fit(x)
    return [imp.transform(to_global(q, columns)) for q in queries]


def knn(train, columns, queries, seed=0, n_neighbors: int = 10):
    """Centralised kNN imputation (KNNImputer) with pooled training rows as donors."""
    from sklearn.impute import KNNImputer

    x = _pooled_train(train, columns)
    imp = KNNImputer(n_neighbors=n_neighbors, keep_empty_features=True).fit(x)
    out = []
    for q in queries:
        a = to_global(q, columns)
        res = imp.transform(a)
        # rows with no usable donor distance keep NaN-free output thanks to column means
        out.append(np.where(np.isnan(res), np.nanmean(x, 0), res))
    return out


METHODS: dict[str, Method] = {
    "fed_dae": fed_dae,
    "lowrank_em": low_rank_em,
    "global_mean": global_mean,
    "local_mean": local_mean,
    "mice_central": mice,
    "knn_central": knn,
}
