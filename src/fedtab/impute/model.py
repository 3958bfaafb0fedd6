"""GNN imputer over the global feature graph (plain PyTorch).

Each table row is one graph whose nodes are the global columns. Node input:
``embedding(feature id) + MLP([z-value or 0, observed flag, available flag])``.
Several residual signed message-passing layers follow, then a head predicts every
node's z-scored value. Messages flow into *every* node, including missing and
structurally unavailable ones: that is how an unavailable column learns from the
columns the site does have. ``block_unavailable=True`` reproduces the reference
behaviour (unavailable nodes are zeroed, so they neither send nor receive) and is
kept only as an ablation.

Linear prior (``prior_rank > 0``): the model holds a factor model ``z = W f + e``
(:mod:`.prior`, fitted by the server from pooled correlations; non-persistent buffers
set with :meth:`GNNImputer.set_prior`, so they never travel with the weights). Per row
it computes every node's Gaussian conditional mean and std given the entries the model
is given, feeds them (and the given entries' residuals from the prior mean) as extra
node inputs, and predicts ``prior mean + correction``. The correction head starts at
zero, so an untrained model *is* the linear model and training learns non-linear
corrections. With ``block_unavailable`` the prior of unavailable nodes is zeroed too.

Tensors are node-major: hidden states are ``(F, B, d)`` so one sparse ``(F, F)``
adjacency multiplies a whole batch at once. The message passing is two sparse products per
layer written in plain torch (it was a PyTorch Geometric ``MessagePassing`` layer with the same
arithmetic): predicting with an imputer imports no PyTorch Geometric, which costs seconds of
start-up and leaves a generated file in the temporary folder of every process that imports it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import Tensor, nn

from .graph import FeatureGraph

__all__ = ["GNNConfig", "SignedGraphConv", "GNNImputer", "graph_tensors", "state_to_numpy", "numpy_to_state"]


@dataclass
class GNNConfig:
    """Architecture of :class:`GNNImputer` (JSON-able; sent to the sites)."""

    n_features: int
    hidden_dim: int = 64
    n_layers: int = 3
    dropout: float = 0.0
    block_unavailable: bool = False
    prior_rank: int = 0
    prior_clip: float | None = 5.0

    def to_dict(self) -> dict:
        return asdict(self)


class SignedGraphConv(nn.Module):
    """Gated, signed, weighted mean of neighbour messages.

    ``agg_i = sum_j s_ij w_ij g_j W x_j / sum_j w_ij g_j`` over the incoming edges of i,
    where ``w_ij = |r_ij|``, ``s_ij`` its sign and ``g_j = sigmoid(a . x_j)`` a learned
    gate that lets a node ignore uninformative senders (e.g. neighbours that are
    themselves missing). The gate depends only on the sender, so the whole layer is two
    sparse ``(F, F)`` products.

    Node dimension is 0: ``x`` is ``(F, B, d)``; ``adj`` is the signed adjacency from
    :func:`graph_tensors` (``adj[i, j] = s_ij w_ij``), ``adj_abs`` its absolute value.
    Passing an ``edge_index`` (2, E) (row 0 the senders ``j``, row 1 the receivers ``i``) plus
    ``edge_weight`` (E,) instead runs a gather/scatter over the edges (same result up to the
    order of float sums, for checking); dense ``(F, F)`` adjacencies run plain matrix products
    (same result; what per-example gradients under ``torch.func.vmap`` need, see :mod:`.dp_train`).
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, 1)

    def forward(self, x: Tensor, adj: Tensor, adj_abs: Tensor | None = None, edge_weight: Tensor | None = None) -> Tensor:
        g = torch.sigmoid(self.gate(x))  # (F, B, 1)
        if adj_abs is not None and adj.layout == torch.strided:  # dense (F, F): works under torch.func.vmap
            return torch.einsum("ij,jbd->ibd", adj, self.lin(x) * g) / (torch.einsum("ij,jbd->ibd", adj_abs, g) + 1e-3)
        if adj_abs is None:  # edge_index path
            if edge_weight is None:
                raise ValueError("an edge_index needs its edge_weight")
            num = _scatter_edges(adj, self.lin(x) * g, edge_weight)
            den = _scatter_edges(adj, g, edge_weight.abs())
        else:
            num = _sparse_mm(adj, self.lin(x) * g)
            den = _sparse_mm(adj_abs, g)
        return num / (den + 1e-3)


def _sparse_mm(adj: Tensor, x: Tensor) -> Tensor:
    """``(F, B, d)``: the sparse ``(F, F)`` ``adj`` times every batch column of ``x`` ``(F, B, d)``."""
    f, b, d = x.shape
    return torch.sparse.mm(adj, x.reshape(f, b * d)).view(f, b, d)


def _scatter_edges(edge_index: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """``out[i] = sum over edges (j, i) of weight · x[j]`` for ``x`` ``(F, B, d)``."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    return torch.zeros_like(x).index_add_(0, dst, x[src] * weight.view(-1, 1, 1).to(x.dtype))


def graph_tensors(graph: FeatureGraph) -> tuple[Tensor, Tensor]:
    """Sparse ``(F, F)`` adjacencies: signed ``adj[i, j] = sign_ij |r_ij|`` and ``|adj|``,
    for every edge ``j -> i``."""
    f = graph.n_nodes
    src, tgt = graph.edge_index
    idx = torch.as_tensor(np.stack([tgt, src]), dtype=torch.long)
    w = torch.as_tensor((graph.sign * graph.weight).astype(np.float32))
    adj = torch.sparse_coo_tensor(idx, w, (f, f), check_invariants=False).coalesce()
    adj_abs = torch.sparse_coo_tensor(idx, w.abs(), (f, f), check_invariants=False).coalesce()
    return adj, adj_abs


class _Layer(nn.Module):
    def __init__(self, d: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.conv = SignedGraphConv(d)
        self.self_lin = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.GELU(), nn.Dropout(dropout), nn.Linear(d, d))

    def forward(self, h: Tensor, adj: tuple[Tensor, Tensor]) -> Tensor:
        z = self.norm(h)
        return h + self.ff(self.self_lin(z) + self.conv(z, *adj))


class GNNImputer(nn.Module):
    """Predicts every node's z-scored value from a partially observed row.

    ``forward(values, observed, available, adj)``:
        values: (B, F) float, z-scored; anything at unobserved positions is ignored.
        observed: (B, F) bool, the value is known and given to the model.
        available: (B, F) or (F,) bool, the column exists at the row's site.
        adj: the pair of sparse adjacencies from :func:`graph_tensors`.
    Returns (B, F) predictions in z-space. With ``prior_rank > 0`` the prior must be
    installed first (:meth:`set_prior`); it conditions on ``observed & available``.
    """

    def __init__(self, config: GNNConfig) -> None:
        super().__init__()
        self.config = config
        d = config.hidden_dim
        k = int(config.prior_rank)
        self.embed = nn.Embedding(config.n_features, d)
        self.inp = nn.Sequential(nn.Linear(6 if k > 0 else 3, d), nn.GELU(), nn.Linear(d, d))
        self.layers = nn.ModuleList(_Layer(d, config.dropout) for _ in range(config.n_layers))
        self.out_norm = nn.LayerNorm(d)
        self.head = nn.Sequential(nn.Linear(2 * d, d), nn.GELU(), nn.Linear(d, 1))
        nn.init.normal_(self.embed.weight, std=0.1)
        if k > 0:
            nn.init.zeros_(self.head[-1].weight)
            nn.init.zeros_(self.head[-1].bias)
            self.register_buffer("prior_w", torch.zeros(config.n_features, k), persistent=False)
            self.register_buffer("prior_psi", torch.ones(config.n_features), persistent=False)
        self.has_prior = False

    def set_prior(self, w: np.ndarray, psi: np.ndarray) -> None:
        """Install the factor prior: ``w`` (F, prior_rank), ``psi`` (F,) positive.

        Raises:
            ValueError: the model has no prior path, or shapes / values are bad.
        """
        k = int(self.config.prior_rank)
        if k == 0:
            raise ValueError("this model was built without a prior (prior_rank=0)")
        w, psi = np.asarray(w, np.float64), np.asarray(psi, np.float64)
        if w.shape != (self.config.n_features, k) or psi.shape != (self.config.n_features,):
            raise ValueError(f"prior has shapes W {w.shape}, psi {psi.shape}; expected "
                             f"({self.config.n_features}, {k}) and ({self.config.n_features},)")
        if not (np.all(np.isfinite(w)) and np.all(np.isfinite(psi)) and np.all(psi > 0)):
            raise ValueError("prior must be finite with positive noise variances")
        self.prior_w.copy_(torch.as_tensor(w, dtype=torch.float32))
        self.prior_psi.copy_(torch.as_tensor(psi, dtype=torch.float32))
        self.has_prior = True

    def prior(self, values: Tensor, given: Tensor) -> tuple[Tensor, Tensor]:
        """(B, F) conditional mean and std of every node given ``given`` entries."""
        from .prior import gaussian_conditional

        if not self.has_prior:
            raise RuntimeError("call set_prior(W, psi) before using a model with prior_rank > 0")
        return gaussian_conditional(self.prior_w, self.prior_psi, values, given, clip=self.config.prior_clip)

    def forward(self, values: Tensor, observed: Tensor, available: Tensor, adj: tuple[Tensor, Tensor]) -> Tensor:
        b, f = values.shape
        if available.dim() == 1:
            available = available.expand(b, f)
        obs = observed & available
        v = torch.where(obs, values, torch.zeros_like(values))
        cols = [v, obs.float(), available.float()]
        base = None
        if self.config.prior_rank > 0:
            mu, sd = self.prior(v, obs)
            if self.config.block_unavailable:
                mu = mu * available
            base = mu
            resid = torch.where(obs, v - mu, torch.zeros_like(v)).clamp(-5.0, 5.0)
            cols += [mu, sd, resid]
        feats = torch.stack(cols, dim=-1).transpose(0, 1)  # (F, B, 3 or 6)
        emb = self.embed.weight.unsqueeze(1)  # (F, 1, d)
        h = emb + self.inp(feats)
        gate = available.T.unsqueeze(-1).float() if self.config.block_unavailable else None
        if gate is not None:
            h = h * gate
        for layer in self.layers:
            h = layer(h, adj)
            if gate is not None:
                h = h * gate
        out = self.head(torch.cat([self.out_norm(h), emb.expand_as(h)], dim=-1)).squeeze(-1).T  # (B, F)
        return out if base is None else base + out


def state_to_numpy(model: nn.Module) -> dict[str, np.ndarray]:
    """Model parameters and buffers as float32 numpy arrays (what travels in a Message)."""
    return {k: v.detach().cpu().numpy().astype(np.float32, copy=True) for k, v in model.state_dict().items()}


def numpy_to_state(model: nn.Module, arrays: dict[str, np.ndarray]) -> None:
    """Load :func:`state_to_numpy` output; raises ``ValueError`` on missing keys or shapes."""
    own = model.state_dict()
    missing = set(own) - set(arrays)
    if missing:
        raise ValueError(f"weights are missing {sorted(missing)[:5]}")
    new = {}
    for k, ref in own.items():
        a = np.asarray(arrays[k])
        if a.shape != tuple(ref.shape):
            raise ValueError(f"weight {k!r} has shape {a.shape}, expected {tuple(ref.shape)}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"weight {k!r} is not finite")
        new[k] = torch.as_tensor(a, dtype=ref.dtype)
    model.load_state_dict(new)
