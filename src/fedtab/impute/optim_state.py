"""A torch optimizer's state as flat numpy arrays, and back (no pickle).

A site keeps its Adam moments between FedAvg rounds. On engines that start a fresh
process per message (a Flower SuperNode runs every message in a new ClientApp
process) that state must travel through the engine's per-site store, which takes
arrays and JSON only. :func:`optimizer_to_numpy` flattens
``optimizer.state_dict()["state"]`` to ``{"<param index>/<name>": array}`` (0-d values,
such as Adam's ``step``, as 1-element arrays keyed ``"<index>/<name>#scalar"``, because
some stores turn 0-d arrays into 1-d ones);
:func:`numpy_to_optimizer` loads it into an optimizer built the same way over the
same parameters (hyper-parameters come from that optimizer, not from the arrays).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

__all__ = ["optimizer_to_numpy", "numpy_to_optimizer"]


def optimizer_to_numpy(optimizer: torch.optim.Optimizer) -> dict[str, np.ndarray]:
    """Per-parameter state (e.g. Adam's ``step``, ``exp_avg``, ``exp_avg_sq``) as arrays.

    Keys are ``"<index of the parameter in the optimizer>/<state name>"``, with the suffix
    ``#scalar`` for 0-d values (stored with shape ``(1,)``); tensors are copied to numpy
    with their dtype. Empty before the first step.
    """
    out: dict[str, np.ndarray] = {}
    for idx, entry in optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            arr = value.detach().cpu().numpy() if torch.is_tensor(value) else np.asarray(value)
            if arr.ndim == 0:
                out[f"{idx}/{name}#scalar"] = arr.reshape(1).copy()
            else:
                out[f"{idx}/{name}"] = np.array(arr, copy=True)
    return out


def numpy_to_optimizer(optimizer: torch.optim.Optimizer, arrays: Mapping[str, np.ndarray]) -> None:
    """Load :func:`optimizer_to_numpy` output into ``optimizer`` (same parameters, same order).

    Raises:
        ValueError: a key is malformed or names a parameter the optimizer does not have,
            or a moment's shape differs from its parameter's.
    """
    sd = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in arrays.items():
        idx_text, _, name = key.partition("/")
        if not idx_text.isdigit() or not name:
            raise ValueError(f"optimizer state key {key!r} is not '<index>/<name>'")
        idx = int(idx_text)
        if idx >= len(params):
            raise ValueError(f"optimizer state names parameter {idx}, the optimizer has {len(params)}")
        arr = np.asarray(value)
        if name.endswith("#scalar"):
            if arr.size != 1:
                raise ValueError(f"optimizer state {key!r} should hold one value, has shape {arr.shape}")
            name, arr = name[: -len("#scalar")], arr.reshape(())
        elif arr.shape != tuple(params[idx].shape):
            raise ValueError(f"optimizer state {key!r} has shape {arr.shape}, parameter has {tuple(params[idx].shape)}")
        state.setdefault(idx, {})[name] = torch.as_tensor(arr.copy())
    sd["state"] = state
    optimizer.load_state_dict(sd)
