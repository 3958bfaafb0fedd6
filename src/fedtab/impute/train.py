"""Local self-supervised training of the GNN imputer, prediction, and FedAvg.

Training at a site (``local_train``): for each batch of rows, hide a random fraction
of the entries that are observed in available columns and minimise the MSE of their
prediction. A share of the hidden entries is presented to the model as *structurally
unavailable* (available flag 0) rather than as missing cells, so the model also
learns to predict a column it is not given at all from the columns it shares with
other sites: that is the signal structural imputation needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from .model import GNNImputer

__all__ = ["Masking", "Schedule", "hide_entries", "auto_batch_size", "local_train", "predict", "fedavg", "masked_sq_errors",
           "set_threads"]


def set_threads(n: int | None = None) -> None:
    """Use ``n`` intra-op threads (default 1).

    The model's matrices are small (F x batch x hidden); on a 2-core machine a second
    intra-op thread made each step up to 30x slower in our measurements, so one thread
    is the default. Pass ``n`` to override.
    """
    torch.set_num_threads(max(1, int(n or 1)))


#: ``batch_size=None``: a site makes about this many optimiser steps per epoch ...
AUTO_STEPS_PER_EPOCH = 8
#: ... in batches of this many rows at least and at most.
AUTO_BATCH_RANGE = (32, 256)


def auto_batch_size(n_rows: int) -> int:
    """Rows per batch when none is given: ``n_rows / AUTO_STEPS_PER_EPOCH`` rounded up, within
    :data:`AUTO_BATCH_RANGE` (32 to 256 rows).

    A step on a few rows costs mostly autograd and optimiser overhead, not arithmetic (on
    AirQuality's 13 columns a 64-row step took a third of the CPU of a 256-row one), so a big
    site takes big batches; a small site keeps small ones, because with one or two steps per
    round the model stops improving (SECOM, issue 31). The floor is 32 rows (64 before the
    default became 3 rounds of 8 epochs): a site of a few dozen rows (the heart small sites)
    then takes 2 or 3 steps per epoch instead of 1, which is what lets the 3 rounds match the
    earlier 20 (issue 31, ``benchmarks/README.md``).

    Raises:
        ValueError: ``n_rows`` is negative.
    """
    if n_rows < 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    lo, hi = AUTO_BATCH_RANGE
    return int(min(hi, max(lo, -(-n_rows // AUTO_STEPS_PER_EPOCH))))


def hide_entries(
    observed: np.ndarray, fraction: float, structural_share: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Pick entries to hide for self-supervision.

    Args:
        observed: (B, F) bool, entries with a known value in an available column.
        fraction: mean probability that such an entry is hidden, in ``(0, 1]``; each
            row draws its own rate uniformly from ``[0, min(2 * fraction, 0.95)]`` so the
            model sees both light and heavy masking.
        structural_share: of the hidden entries, the share flagged unavailable.
        rng: random generator.

    Returns:
        ``(hidden, as_unavailable)``: two (B, F) bool arrays, ``as_unavailable`` ⊆ ``hidden``.
    """
    rate = rng.uniform(0.0, min(2.0 * fraction, 0.95), size=(observed.shape[0], 1))
    hidden = observed & (rng.random(observed.shape) < rate)
    as_unavail = hidden & (rng.random(observed.shape) < structural_share)
    return hidden, as_unavail


@dataclass(frozen=True)
class Masking:
    """How self-supervision hides a site's entries (:func:`hide_entries`).

    Attributes:
        fraction: mean probability that an observed entry is hidden, in ``(0, 1]``.
        structural_share: of the hidden entries, the share shown to the model as structurally
            unavailable (available flag 0) rather than as missing cells, in ``[0, 1]``.
    """

    fraction: float = 0.3
    structural_share: float = 0.5


@dataclass(frozen=True)
class Schedule:
    """How many optimiser steps :func:`local_train` takes.

    Attributes:
        epochs: passes over the site's rows (each in a fresh random order).
        batch_size: rows per step; ``None``: :func:`auto_batch_size` of the site's rows.
        max_steps: optional cap on optimiser steps over all epochs (keeps rounds short on big
            sites); ``None``: no cap.
    """

    epochs: int = 1
    batch_size: int | None = 64
    max_steps: int | None = None


def local_train(
    model: GNNImputer,
    optimizer: torch.optim.Optimizer,
    values: np.ndarray,
    available: np.ndarray,
    adj: Tensor,
    *,
    rng: np.random.Generator,
    schedule: Schedule = Schedule(),
    masking: Masking = Masking(),
) -> tuple[float, int]:
    """Train ``model`` in place on one site's rows.

    Args:
        values: (n, F) z-scored values over the global schema, NaN = missing or
            unavailable.
        available: (F,) bool, the columns this site has.
        adj: the sparse adjacency pair from :func:`fedtab.impute.model.graph_tensors`.
        rng: the site's (seeded) generator of the row order and the masks.
        schedule: epochs, rows per step and the step cap (:class:`Schedule`).
        masking: what each step hides (:class:`Masking`; see the module docstring).

    Returns:
        ``(mean loss over steps, number of steps)``; loss is MSE in z-space.
    """
    epochs, batch_size, max_steps = schedule.epochs, schedule.batch_size, schedule.max_steps
    mask_fraction, structural_share = masking.fraction, masking.structural_share
    n, f = values.shape
    if batch_size is None:
        batch_size = auto_batch_size(n)
    obs_all = ~np.isnan(values) & available[None, :]
    vals = torch.from_numpy(np.nan_to_num(values).astype(np.float32))  # converted once, rows gathered per batch
    params = [p for p in model.parameters() if p.requires_grad]  # listed once, not per step
    model.train()
    losses: list[Tensor] = []  # kept as tensors: one synchronising float() at the end, not one per step
    avail_t = torch.as_tensor(available)
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            if max_steps is not None and len(losses) >= max_steps:
                break
            idx = order[start : start + batch_size]
            obs = obs_all[idx]
            hidden, as_unavail = hide_entries(obs, mask_fraction, structural_share, rng)
            if not hidden.any():
                continue
            x = vals[torch.from_numpy(idx)]
            inp_obs = torch.from_numpy(obs & ~hidden)
            inp_avail = avail_t.expand(len(idx), f) & ~torch.from_numpy(as_unavail)
            pred = model(x, inp_obs, inp_avail, adj)
            loss = ((pred - x)[torch.from_numpy(hidden)] ** 2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 5.0, foreach=True)
            optimizer.step()
            losses.append(loss.detach())
    return (float(torch.stack(losses).double().mean()) if losses else float("nan")), len(losses)


@torch.no_grad()
def predict(
    model: GNNImputer, values: np.ndarray, available: np.ndarray, adj: Tensor, batch_size: int = 512
) -> np.ndarray:
    """(n, F) z-space predictions for every cell; input NaN = not given to the model.

    ``available`` is (F,) or (n, F) bool.
    """
    model.eval()
    n, f = values.shape
    avail = np.broadcast_to(np.asarray(available, dtype=bool), (n, f))
    obs = ~np.isnan(values) & avail
    vals = np.nan_to_num(values).astype(np.float32)
    out = np.empty((n, f), dtype=np.float64)
    for start in range(0, n, batch_size):
        sl = slice(start, start + batch_size)
        p = model(torch.as_tensor(vals[sl]), torch.as_tensor(obs[sl]), torch.as_tensor(np.ascontiguousarray(avail[sl])), adj)
        out[sl] = p.numpy()
    return out


def masked_sq_errors(pred: np.ndarray, truth: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column sum of squared errors and counts over ``mask`` (all (n, F))."""
    d = np.where(mask, pred - np.nan_to_num(truth), 0.0)
    return (d * d).sum(0), mask.sum(0).astype(np.float64)


def fedavg(weights: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float]) -> dict[str, np.ndarray]:
    """Average parameter dicts weighted by ``sizes`` (e.g. training rows).

    Raises:
        ValueError: empty input, non-positive total size, or mismatched keys/shapes.
    """
    if not weights:
        raise ValueError("nothing to average")
    sizes = np.asarray(sizes, dtype=np.float64)
    if sizes.shape != (len(weights),) or np.any(sizes < 0) or sizes.sum() <= 0:
        raise ValueError(f"bad FedAvg sizes {sizes.tolist()}")
    keys = set(weights[0])
    for w in weights[1:]:
        if set(w) != keys:
            raise ValueError("sites sent different parameter names")
    out = {}
    for k in weights[0]:
        shapes = {np.shape(w[k]) for w in weights}
        if len(shapes) != 1:
            raise ValueError(f"parameter {k!r} has different shapes across sites: {shapes}")
        out[k] = (sum(s * np.asarray(w[k], dtype=np.float64) for s, w in zip(sizes, weights)) / sizes.sum()).astype(
            np.float32
        )
    return out
