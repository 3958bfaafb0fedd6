"""The model file's imputer network run in numpy: ``fedtab predict`` fills cells without torch.

Importing torch costs about 1.9 CPU-s, most of ``fedtab predict`` on a small table; the
network (:class:`fedtab.impute.model.GNNImputer`, eval mode) is a few small dense maps and two
sparse ``(F, F)`` products per layer, so the read path evaluates it here from the file's
arrays. Same arithmetic as the torch module in float64 (the weights are float32): predictions
agree with it to float32 rounding, which ``tests/job/test_imputer_net.py`` checks for every
configuration the module has (prior, ``block_unavailable``, layers), together with the weight
names and shapes (:func:`weight_shapes` equals the torch module's ``state_dict``). GELU's
``erf`` is :func:`scipy.special.erf` (scipy is a dependency; it costs ~0.2 s, torch ~1.9 s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

__all__ = ["NetConfig", "NumpyImputerNet", "net_config", "weight_shapes"]

#: :class:`fedtab.impute.model.GNNConfig`'s fields and defaults (the torch-free read path's copy)
CONFIG_DEFAULTS: dict[str, Any] = {"hidden_dim": 64, "n_layers": 3, "dropout": 0.0, "block_unavailable": False,
                                   "prior_rank": 0, "prior_clip": 5.0}


@dataclass(frozen=True)
class NetConfig:
    """The architecture a file's ``imputer.model_config`` describes (dropout is inactive when predicting)."""

    n_features: int
    hidden_dim: int
    n_layers: int
    block_unavailable: bool
    prior_rank: int
    prior_clip: float | None


def _count(doc: Mapping[str, Any], key: str, low: int) -> int:
    v = doc[key]
    if not isinstance(v, int) or isinstance(v, bool) or v < low:
        raise ValueError(f"{key} must be an integer >= {low}, got {v!r}")
    return v


def net_config(doc: Mapping[str, Any]) -> NetConfig:
    """Parse ``model_config`` as :class:`~fedtab.impute.model.GNNConfig` takes it.

    Raises:
        ValueError: an unknown or missing setting, or a value of the wrong type or range.
    """
    if not isinstance(doc, Mapping):
        raise ValueError("model_config must be an object")
    unknown = sorted(set(doc) - set(CONFIG_DEFAULTS) - {"n_features"})
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}")
    if "n_features" not in doc:
        raise ValueError("n_features is missing")
    d = {**CONFIG_DEFAULTS, **doc}
    clip = d["prior_clip"]
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not np.isfinite(clip)):
        raise ValueError(f"prior_clip must be a finite number or null, got {clip!r}")
    if not isinstance(d["block_unavailable"], bool):
        raise ValueError("block_unavailable must be true or false")
    return NetConfig(_count(d, "n_features", 1), _count(d, "hidden_dim", 1), _count(d, "n_layers", 0),
                     d["block_unavailable"], _count(d, "prior_rank", 0), None if clip is None else float(clip))


def weight_shapes(cfg: NetConfig) -> dict[str, tuple[int, ...]]:
    """The network's weight names and shapes, as the torch module's ``state_dict`` has them."""
    d, f = cfg.hidden_dim, cfg.n_features
    shapes: dict[str, tuple[int, ...]] = {
        "embed.weight": (f, d), "inp.0.weight": (d, 6 if cfg.prior_rank > 0 else 3), "inp.0.bias": (d,),
        "inp.2.weight": (d, d), "inp.2.bias": (d,)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        shapes.update({p + "norm.weight": (d,), p + "norm.bias": (d,), p + "conv.lin.weight": (d, d),
                       p + "conv.gate.weight": (1, d), p + "conv.gate.bias": (1,), p + "self_lin.weight": (d, d),
                       p + "self_lin.bias": (d,), p + "ff.2.weight": (d, d), p + "ff.2.bias": (d,)})
    shapes.update({"out_norm.weight": (d,), "out_norm.bias": (d,), "head.0.weight": (d, 2 * d), "head.0.bias": (d,),
                   "head.2.weight": (1, d), "head.2.bias": (1,)})
    return shapes


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit

    return expit(x)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


class NumpyImputerNet:
    """``GNNImputer`` in eval mode over numpy arrays (float64).

    Args:
        cfg: the architecture (:func:`net_config`).
        weights: name -> array, exactly :func:`weight_shapes` (finite).
        edge_index: (2, E) int, row 0 the senders ``j``, row 1 the receivers ``i``.
        edge_value: (E,) the signed edge weight ``sign_ij * |r_ij|``.
        prior: ``(W (F, k), psi (F,))`` when ``cfg.prior_rank > 0``, else ``None``.

    Raises:
        ValueError: weights missing, extra, mis-shaped or not finite; a prior missing or bad.
    """

    def __init__(self, cfg: NetConfig, weights: Mapping[str, np.ndarray], edge_index: np.ndarray,
                 edge_value: np.ndarray, prior: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        want = weight_shapes(cfg)
        got = {k: tuple(np.shape(v)) for k, v in weights.items()}
        if got != want:
            bad = sorted(set(want) ^ set(got)) or sorted(k for k in want if got[k] != want[k])
            raise ValueError(f"weights do not match the network: {bad[:5]}")
        self.cfg = cfg
        # float32 first: the torch module holds float32 weights and buffers
        self.w = {k: np.asarray(v, np.float32).astype(np.float64) for k, v in weights.items()}
        if not all(np.all(np.isfinite(v)) for v in self.w.values()):
            raise ValueError("weights are not finite")
        self.src, self.dst = np.asarray(edge_index[0], np.int64), np.asarray(edge_index[1], np.int64)
        self.edge = np.asarray(edge_value, np.float32).astype(np.float64)
        self.prior = None
        if cfg.prior_rank > 0:
            if prior is None:
                raise ValueError(f"a network with prior_rank {cfg.prior_rank} needs its prior")
            pw, psi = (np.asarray(a, np.float32).astype(np.float64) for a in prior)
            if pw.shape != (cfg.n_features, cfg.prior_rank) or psi.shape != (cfg.n_features,) \
                    or not (np.all(np.isfinite(pw)) and np.all(np.isfinite(psi)) and np.all(psi > 0)):
                raise ValueError("the prior must be finite, W (F, k) and psi (F,) positive")
            self.prior = (pw, psi)

    def _lin(self, x: np.ndarray, name: str, bias: bool = True) -> np.ndarray:
        out = x @ self.w[name + ".weight"].T
        return out + self.w[name + ".bias"] if bias else out

    def _spmm(self, x: np.ndarray, value: np.ndarray) -> np.ndarray:
        """``out[i] = sum over edges (j -> i) of value · x[j]`` for ``x`` ``(F, B, d)``."""
        out = np.zeros_like(x)
        np.add.at(out, self.dst, x[self.src] * value[:, None, None])
        return out

    def _prior(self, x: np.ndarray, given: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, F) conditional mean and std (:func:`fedtab.impute.prior.gaussian_conditional`)."""
        w, psi = self.prior
        k = w.shape[1]
        wp = w / psi[:, None]
        o = given.astype(np.float64)
        x = np.where(given, x, 0.0)
        if self.cfg.prior_clip is not None:
            x = np.clip(x, -self.cfg.prior_clip, self.cfg.prior_clip)
        m = np.eye(k) + np.einsum("bf,fa,fc->bac", o, wp, w)
        chol = np.linalg.cholesky(m)
        ef = np.linalg.solve(m, (x @ wp)[..., None])[..., 0]
        li = np.linalg.solve(chol, np.broadcast_to(w.T, (len(x), k, w.shape[0])))
        return ef @ w.T, np.sqrt((li * li).sum(1) + psi)

    def forward(self, values: np.ndarray, observed: np.ndarray, available: np.ndarray) -> np.ndarray:
        """(B, F) z-space predictions; ``values`` (B, F), ``observed`` and ``available`` (B, F) bool."""
        cfg = self.cfg
        obs = observed & available
        v = np.where(obs, values, 0.0)
        cols = [v, obs.astype(np.float64), available.astype(np.float64)]
        base = None
        if cfg.prior_rank > 0:
            mu, sd = self._prior(v, obs)
            if cfg.block_unavailable:
                mu = mu * available
            base = mu
            cols += [mu, sd, np.clip(np.where(obs, v - mu, 0.0), -5.0, 5.0)]
        feats = np.stack(cols, axis=-1).transpose(1, 0, 2)  # (F, B, 3 or 6)
        emb = self.w["embed.weight"][:, None, :]  # (F, 1, d)
        h = emb + self._lin(_gelu(self._lin(feats, "inp.0")), "inp.2")
        gate = available.T[..., None].astype(np.float64) if cfg.block_unavailable else None
        if gate is not None:
            h = h * gate
        for i in range(cfg.n_layers):
            p = f"layers.{i}."
            z = _layer_norm(h, self.w[p + "norm.weight"], self.w[p + "norm.bias"])
            g = _sigmoid(self._lin(z, p + "conv.gate"))  # (F, B, 1)
            conv = self._spmm(self._lin(z, p + "conv.lin", bias=False) * g, self.edge) \
                / (self._spmm(g, np.abs(self.edge)) + 1e-3)
            h = h + self._lin(_gelu(self._lin(z, p + "self_lin") + conv), p + "ff.2")
            if gate is not None:
                h = h * gate
        top = np.concatenate([_layer_norm(h, self.w["out_norm.weight"], self.w["out_norm.bias"]),
                              np.broadcast_to(emb, h.shape)], axis=-1)
        out = self._lin(_gelu(self._lin(top, "head.0")), "head.2")[..., 0].T  # (B, F)
        return out if base is None else base + out

    def predict(self, values: np.ndarray, available: np.ndarray, batch_size: int = 512) -> np.ndarray:
        """(n, F) z-space predictions for every cell; input NaN = not given to the model
        (:func:`fedtab.impute.train.predict`'s contract). ``available`` is (F,) or (n, F) bool."""
        n, f = values.shape
        avail = np.broadcast_to(np.asarray(available, dtype=bool), (n, f))
        obs = ~np.isnan(values) & avail
        vals = np.nan_to_num(values).astype(np.float32).astype(np.float64)
        out = np.empty((n, f), dtype=np.float64)
        for start in range(0, n, batch_size):
            sl = slice(start, start + batch_size)
            out[sl] = self.forward(vals[sl], obs[sl], avail[sl])
        return out
