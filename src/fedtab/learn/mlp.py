"""Multi-layer perceptron in PyTorch, trained locally with Adam and globally by FedAvg.

PyTorch is imported only when the model trains or predicts, so ``import fedtab``
works without it. Parameters travel as float32 numpy arrays named like the
``torch.nn.Sequential`` state dict (``"0.weight"``, ``"0.bias"``, ...).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import numpy as np

from .models import STEP_OVERHEAD, Cost, FederatedModel, Params, driver
from .torch_threads import torch_threads

__all__ = ["MLPModel"]


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the 'mlp' model needs PyTorch: pip install 'fedtab[torch]'") from exc
    return torch


class MLPModel(FederatedModel):
    """ReLU MLP ``d -> hidden... -> C`` with cross-entropy (C outputs, also for two classes).

    Args:
        hidden: sizes of the hidden layers.
        lr: Adam learning rate (the optimiser state restarts each round, as in FedAvg).
        weight_decay: Adam's L2 term.
        batch_size: rows per step.
        max_steps: cap on optimiser steps per local update (``None`` = all epochs).
        mu: FedProx proximal strength.
        n_threads: PyTorch threads while training/predicting (1 is fastest for small nets).
    """

    name = "mlp"

    def __init__(self, hidden: Sequence[int] = (64,), lr: float = 1e-2, weight_decay: float = 1e-4,
                 batch_size: int = 64, max_steps: int | None = None, mu: float = 0.0,
                 n_threads: int | None = 1):
        hidden = [int(h) for h in hidden]
        if any(h < 1 for h in hidden) or lr <= 0 or weight_decay < 0 or batch_size < 1 or mu < 0:
            raise ValueError("invalid MLP hyper-parameters")
        self.hidden = hidden
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.mu = mu
        self.n_threads = n_threads

    def _net(self, n_features: int, n_classes: int) -> Any:
        nn = _torch().nn
        layers: list[Any] = []
        width = n_features
        for h in self.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_classes))
        return nn.Sequential(*layers)

    def _load(self, params: Params) -> Any:
        torch = _torch()
        first = params["0.weight"]
        last = params[f"{2 * len(self.hidden)}.weight"]
        with torch.random.fork_rng(), warnings.catch_warnings():  # do not consume the caller's RNG
            warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
            net = self._net(first.shape[1], last.shape[0])
        net.load_state_dict({k: torch.as_tensor(np.asarray(v, dtype=np.float32)) for k, v in params.items()})
        return net

    @staticmethod
    def _dump(net: Any) -> Params:
        return {k: v.detach().cpu().numpy().astype(np.float32) for k, v in net.state_dict().items()}

    def init(self, n_features: int, n_classes: int, seed: int = 0) -> Params:
        if n_classes < 2:
            raise ValueError(f"an MLP classifier needs at least 2 classes, got {n_classes}")
        torch = _torch()
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Initializing zero-element tensors")  # 0 features
            torch.manual_seed(seed)
            return self._dump(self._net(n_features, n_classes))

    def n_params(self, n_features: int, n_classes: int) -> int:
        sizes = [n_features, *self.hidden, n_classes]
        return int(sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:])))

    def cost(self, n_features: int, n_classes: int, n_rows: int = 1, epochs: int = 1) -> Cost:
        """Per step a forward and backward pass of ``batch_size`` rows (≈ 4 operations per
        parameter and row, in torch's BLAS) and a fixed cost of :data:`STEP_OVERHEAD` / 4;
        ``epochs · ceil(n_rows / batch_size)`` steps, at most ``max_steps``."""
        size = float(self.n_params(n_features, n_classes))
        batch = max(float(self.batch_size), 1.0)
        steps = max(int(epochs), 1) * max(math.ceil(n_rows / batch), 1)
        if self.max_steps is not None:
            steps = min(steps, max(int(self.max_steps), 0))
        work = steps * (4.0 * min(batch, max(n_rows, 1)) * size + STEP_OVERHEAD / 4)
        widest = max(self.hidden, default=0)
        return Cost(work, size, driver({"hidden": (widest * max(len(self.hidden), 1), 64), "epochs": (epochs, 1),
                                        "batch_size": (batch, 64)}))

    def local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int, seed: int = 0) -> Params:
        with torch_threads(self.n_threads):
            return self._local_update(params, X, y, epochs=epochs, seed=seed)

    def _local_update(self, params: Params, X: np.ndarray, y: np.ndarray, *, epochs: int, seed: int) -> Params:
        torch = _torch()
        net = self._load(params)
        if len(y) == 0:
            return self._dump(net)
        global_w = [p.detach().clone() for p in net.parameters()] if self.mu else None
        Xt = torch.as_tensor(np.asarray(X, dtype=np.float32))
        yt = torch.as_tensor(np.asarray(y, dtype=np.int64))
        opt = torch.optim.Adam(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        gen = torch.Generator().manual_seed(int(seed))
        loss_fn = torch.nn.CrossEntropyLoss()
        steps = 0
        net.train()
        for _ in range(max(int(epochs), 1)):
            order = torch.randperm(len(yt), generator=gen)
            for start in range(0, len(yt), self.batch_size):
                if self.max_steps is not None and steps >= self.max_steps:
                    break
                idx = order[start : start + self.batch_size]
                opt.zero_grad()
                loss = loss_fn(net(Xt[idx]), yt[idx])
                if global_w is not None:
                    loss = loss + 0.5 * self.mu * sum(((p - g) ** 2).sum() for p, g in zip(net.parameters(), global_w))
                loss.backward()
                opt.step()
                steps += 1
        return self._dump(net)

    def predict_proba(self, params: Params, X: np.ndarray) -> np.ndarray:
        torch = _torch()
        net = self._load(params).eval()
        with torch.no_grad(), torch_threads(self.n_threads):
            return torch.softmax(net(torch.as_tensor(np.asarray(X, dtype=np.float32))), dim=1).numpy()

    def predict(self, params: Params, X: np.ndarray) -> np.ndarray:
        return np.argmax(self.predict_proba(params, X), axis=1)

    def aggregate(self, updates: Sequence[tuple[Params, int]]) -> Params:
        from .models import fedavg

        return {k: v.astype(np.float32) for k, v in fedavg(updates).items()}
