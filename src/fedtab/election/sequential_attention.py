"""Sequential Attention (Yasuda et al., ICLR 2023) for feature selection, in PyTorch.

A trainable logit per feature; the MLP sees ``x ⊙ a`` with attention
``a = 1[selected] + softmax(logits over the unselected)`` (selected features pass
through unchanged). Network and logits are trained jointly by Adam; at the end of each
phase the unselected features with the largest logits are added to the selection,
and training continues (warm start) with the next phase, until ``k`` are selected.

The logits are an ``nn.Parameter`` in the optimiser (the FLASH version never updates
them); after :meth:`~SequentialAttentionSelector.select` their final values are in
``logits_`` and the order of selection in ``order_``.

Scores: the j-th selected feature (0-based) scores ``2 − j/k`` (so earlier picks score
higher, all in (1, 2]); unselected features score their final attention weight (< 1).
PyTorch is imported when :meth:`select` runs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..learn.models import STEP_OVERHEAD, Cost, count_param, driver
from .selector_base import Selection, Selector, check_xy, is_regression

__all__ = ["SequentialAttentionSelector"]


class SequentialAttentionSelector(Selector):
    """Select ``k`` features in ``n_phases`` phases of joint MLP + attention training.

    Args:
        k: features to select (int, a fraction in (0, 1), or ``None`` = ``ceil(d/2)``).
        n_phases: selection phases (default ``min(k, 10)``); each adds ``ceil(k/n_phases)``.
        steps_per_phase: Adam steps per phase (one extra phase warms up before the first pick).
        hidden: hidden layer sizes. batch_size, lr: for the network; logits_lr for the logits.
        task, seed: as ``LassoSelector``.

    PyTorch trains on :attr:`N_THREADS` thread(s) (1 is fastest for these small nets; the
    ``n_threads`` parameter that set it went: nothing set it, and a scikit-learn selector keeps
    at most 9 parameters).
    """

    name = "sequential_attention"
    #: PyTorch threads while training
    N_THREADS = 1

    def __init__(self, k: int | float | None = None, n_phases: int | None = None, steps_per_phase: int = 150,
                 hidden: Sequence[int] = (64,), batch_size: int = 256, lr: float = 3e-3, logits_lr: float = 5e-2,
                 task: str = "auto", seed: int = 0):
        self.k = k
        self.n_phases = n_phases
        self.steps_per_phase = steps_per_phase
        self.hidden = hidden
        self.batch_size = batch_size
        self.lr = lr
        self.logits_lr = logits_lr
        self.task = task
        self.seed = seed

    def _k(self, d: int) -> int:
        if self.k is None:
            kk = math.ceil(d / 2)
        elif isinstance(self.k, float) and 0 < self.k < 1:
            kk = math.ceil(self.k * d)
        else:
            kk = int(self.k)
        if not 0 < kk <= d:
            raise ValueError(f"k must be in 1..{d} (or a fraction in (0, 1)), got {self.k!r}")
        return kk

    def cost(self, n_rows: int, n_features: int) -> Cost:
        """``(phases + 1) · steps_per_phase`` Adam steps of a batch through the network
        ``d -> hidden... -> classes`` and the feature logits (≈ 1 operation per parameter and row
        in torch's BLAS, plus :data:`STEP_OVERHEAD` per Adam step)."""
        k = max(min(n_features, math.ceil(n_features / 2)), 1)
        phases = max(1.0, min(float(k), count_param(self.n_phases, "n_phases") if self.n_phases else min(k, 10)))
        steps = (phases + 1.0) * count_param(self.steps_per_phase, "steps_per_phase")
        widths = [float(n_features), *(count_param(h, "hidden") for h in self.hidden), 2.0]
        size = float(sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))) + n_features
        batch = min(max(count_param(self.batch_size, "batch_size"), 1.0), max(float(n_rows), 1.0))
        widest = max(widths[1:-1], default=0.0)
        factors = {"hidden": (widest * max(len(widths) - 2, 1), 64), "steps_per_phase": (steps / (phases + 1), 150),
                   "n_phases": (phases, 10), "batch_size": (batch, 256)}
        return Cost(steps * (batch * size + STEP_OVERHEAD), size, driver(factors))

    def select(self, X: Any, y: Any) -> Selection:
        from ..learn.torch_threads import torch_threads

        with torch_threads(self.N_THREADS):
            return self._select(X, y)

    def _select(self, X: Any, y: Any) -> Selection:
        import torch
        from sklearn.preprocessing import LabelEncoder, StandardScaler  # lazy: keeps `import fedtab` cheap

        X, y = check_xy(X, y)
        n, d = X.shape
        k = self._k(d)
        phases = max(1, min(k, self.n_phases or min(k, 10)))
        per_phase = math.ceil(k / phases)
        regression = is_regression(y, self.task)
        Xt = torch.as_tensor(StandardScaler().fit_transform(X), dtype=torch.float32)
        if regression:
            yt = torch.as_tensor((y - y.mean()) / (y.std() or 1.0), dtype=torch.float32)[:, None]
            out_dim, loss_fn = 1, torch.nn.MSELoss()
        else:
            yi = LabelEncoder().fit_transform(y)
            yt = torch.as_tensor(yi, dtype=torch.int64)
            out_dim, loss_fn = int(yi.max()) + 1, torch.nn.CrossEntropyLoss()
        with torch.random.fork_rng():
            torch.manual_seed(self.seed)
            layers: list[Any] = []
            width = d
            for h in (int(h) for h in self.hidden):
                layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
                width = h
            layers.append(torch.nn.Linear(width, out_dim))
            net = torch.nn.Sequential(*layers)
            logits = torch.nn.Parameter(torch.zeros(d))
            opt = torch.optim.Adam([{"params": net.parameters(), "lr": self.lr},
                                    {"params": [logits], "lr": self.logits_lr}])
            gen = torch.Generator().manual_seed(self.seed)
            selected = torch.zeros(d, dtype=torch.bool)
            order: list[int] = []

            def attention() -> Any:
                masked = logits.masked_fill(selected, float("-inf"))
                soft = torch.softmax(masked, dim=0) if (~selected).any() else torch.zeros(d)
                return selected.float() + torch.where(selected, torch.zeros(d), soft)

            bs = min(self.batch_size, n)
            for phase in range(phases + 1):  # phase 0 only warms up
                for _ in range(self.steps_per_phase):
                    idx = torch.randint(0, n, (bs,), generator=gen)
                    opt.zero_grad()
                    loss = loss_fn(net(Xt[idx] * attention()), yt[idx])
                    loss.backward()
                    opt.step()
                if phase == phases:
                    break
                take = min(per_phase, k - len(order))
                cand = logits.detach().masked_fill(selected, float("-inf"))
                top = torch.topk(cand, take).indices.tolist()
                for j in top:
                    selected[j] = True
                    order.append(int(j))
                if len(order) >= k:
                    break
            final_att = attention().detach().numpy()
        scores = np.where(selected.numpy(), 0.0, final_att)
        for rank, j in enumerate(order):
            scores[j] = 2.0 - rank / k
        self.logits_ = logits.detach().numpy().copy()
        self.order_ = order
        return Selection(selected.numpy().copy(), scores.astype(np.float64))
