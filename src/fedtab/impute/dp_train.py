"""Differentially private local training of the GNN imputer (DP gradient descent).

Why not clip the whole model update (DP-FedAvg's user-level recipe)? Replacing one row
of a site can move that site's locally trained weights anywhere within the clip ``C``,
so the noise must be ``z · 2C`` *per parameter*; over the GNN's ~10⁴ parameters that is
hundreds of times the clipped update itself, and the model is destroyed at any ε (we
measured RMSE ≈ 10⁴ in z-space). Here each row's influence is bounded instead:

every step computes the per-row gradients of the self-supervised loss (a row's loss is
the mean squared error over its own hidden entries; rows are independent graphs, so a
row's gradient depends on that row only) with :func:`torch.func.vmap`, clips each to L2
norm ``C`` over all parameters jointly, sums them, adds ``N(0, (z · 2C)²)`` per
coordinate (a replaced row moves the sum by at most ``2C``), divides by the row count
(public) and lets the site's optimiser take the step. The noise per parameter shrinks
as ``1/n``. Each step is one Gaussian release for the accountant
(:mod:`fedtab.privacy.accountant`); the weights sent afterwards are post-processing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import torch
from torch import Tensor

from ..privacy.dp import add_noise
from .model import GNNImputer
from .train import Masking, hide_entries

__all__ = ["DPSteps", "per_example_grads", "clipped_gradient_sum", "dp_local_train"]

#: largest (rows × parameters) held at once by the per-example gradients (float32: 4 bytes each).
_CHUNK_FLOATS = 2 * 10**7


def _dense(adj: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    return tuple(a.to_dense() if a.layout != torch.strided else a for a in adj)  # type: ignore[return-value]


def per_example_grads(model: GNNImputer, values: Tensor, given: Tensor, available: Tensor, hidden: Tensor,
                      adj: tuple[Tensor, Tensor]) -> dict[str, Tensor]:
    """Gradient of each row's loss (mean squared error over its ``hidden`` entries; 0 for
    a row with none) with respect to every trainable parameter.

    Args:
        values: (B, F) float32 z-values (0 where unknown). given, available, hidden: (B, F) bool.
        adj: the adjacency pair of :func:`~fedtab.impute.model.graph_tensors` (sparse or dense).

    Returns:
        ``{parameter name: (B, *shape)}``.
    """
    from torch.func import functional_call, grad, vmap

    dense = _dense(adj)
    params = {k: p.detach() for k, p in model.named_parameters() if p.requires_grad}
    buffers = dict(model.named_buffers())

    def row_loss(p: dict[str, Tensor], x: Tensor, g: Tensor, a: Tensor, h: Tensor) -> Tensor:
        pred = functional_call(model, (p, buffers), (x[None], g[None], a[None], dense))[0]
        d = (pred - x) * h
        return (d * d).sum() / h.sum().clamp(min=1.0)

    n_params = sum(p.numel() for p in params.values())
    chunk = max(1, min(len(values), _CHUNK_FLOATS // max(n_params, 1)))
    fn = vmap(grad(row_loss), in_dims=(None, 0, 0, 0, 0), chunk_size=chunk, randomness="different")
    return fn(params, values, given, available, hidden.to(values.dtype))


def clipped_gradient_sum(model: GNNImputer, values: Tensor, given: Tensor, available: Tensor, hidden: Tensor,
                         adj: tuple[Tensor, Tensor], clip: float) -> Tensor:
    """Sum over rows of the per-row gradients (:func:`per_example_grads`), each clipped to
    L2 norm ``clip`` over all trainable parameters jointly: a flat vector in
    ``model.named_parameters()`` order. Replacing one row moves it by at most ``2 * clip``."""
    grads = per_example_grads(model, values, given, available, hidden, adj)
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    n = len(values)
    norms = torch.sqrt(sum((grads[k].reshape(n, -1) ** 2).sum(1) for k in names))
    factor = torch.clamp(float(clip) / norms.clamp(min=1e-12), max=1.0)
    return torch.cat([torch.einsum("b,b...->...", factor, grads[k]).reshape(-1) for k in names])


@dataclass(frozen=True)
class DPSteps:
    """The DP gradient-descent steps :func:`dp_local_train` takes.

    Attributes:
        steps: number of steps (each one Gaussian release of sensitivity ``2C``).
        spec: the request's ``meta["dp"]``: ``z`` (noise multiplier of each step), ``clip`` (C).
        noise: the generator of the Gaussian noise (OS entropy, :func:`fedtab.privacy.dp.noise_rng`).
    """

    steps: int
    spec: Mapping[str, Any]
    noise: np.random.Generator


def dp_local_train(model: GNNImputer, optimizer: torch.optim.Optimizer, values: np.ndarray, available: np.ndarray,
                   adj: tuple[Tensor, Tensor], *, dp: DPSteps, masking: Masking, rng: np.random.Generator) -> int:
    """``dp.steps`` DP gradient-descent steps on all of one site's rows (module docstring).

    Args:
        values: (n, F) z-values over the global schema (NaN = missing or unavailable).
        available: (F,) bool, the site's columns.
        dp: the number of steps, the DP spec and the noise generator (:class:`DPSteps`).
        masking: what each step hides (:class:`~fedtab.impute.train.Masking`).
        rng: the site's (seeded) generator for the self-supervision masks.

    Returns:
        The number of steps taken (each one Gaussian release of sensitivity ``2C``).
    """
    steps, spec, noise = dp.steps, dp.spec, dp.noise
    mask_fraction, structural_share = masking.fraction, masking.structural_share
    n, f = values.shape
    if n == 0:
        return 0
    clip = float(spec.get("clip", 1.0))
    obs_all = ~np.isnan(values) & available[None, :]
    x = torch.as_tensor(np.nan_to_num(values).astype(np.float32))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(int(steps)):
        hidden, as_unavail = hide_entries(obs_all, mask_fraction, structural_share, rng)
        given = torch.as_tensor(obs_all & ~hidden)
        avail = torch.as_tensor(np.broadcast_to(available, (n, f)) & ~as_unavail)
        total = clipped_gradient_sum(model, x, given, avail, torch.as_tensor(hidden), adj, clip)
        noisy = add_noise(total.double().numpy(), 2.0 * clip, spec, noise) / n
        optimizer.zero_grad(set_to_none=True)
        offset = 0
        for p in params:
            p.grad = torch.as_tensor(noisy[offset:offset + p.numel()], dtype=p.dtype).view_as(p)
            offset += p.numel()
        optimizer.step()
    return int(steps)
