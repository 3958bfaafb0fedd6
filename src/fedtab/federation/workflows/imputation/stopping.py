"""Early stopping of the imputation's FedAvg rounds on the federated validation error.

:class:`Plateau` watches one value per round (the median site's validation RMSE of the weights
that round sent) and says when it has not improved by more than a relative ``tolerance`` for
``patience`` rounds. A round that returns no value (the sites' errors arrive only as sums:
secure aggregation, DP) is no evidence either way: the rounds then run to their cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Plateau"]


@dataclass
class Plateau:
    """The stopping rule: after the best value so far (``best``, first seen in round
    ``best_round``), stop once ``patience`` rounds with a value have not beaten it by more
    than ``tolerance`` of it (a new best needs ``value < best * (1 - tolerance)``).
    ``patience = 0``: never stop. A value of ``None`` (not released) never counts.

    Raises:
        ValueError: ``patience`` negative or not an integer, ``tolerance`` outside [0, 1).
    """

    patience: int
    tolerance: float
    best: float = math.inf
    best_round: int = 0
    waited: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.patience, bool) or not isinstance(self.patience, int) or self.patience < 0:
            raise ValueError(f"patience must be a non-negative integer, got {self.patience!r}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance!r}")

    def update(self, rnd: int, value: float | None) -> bool:
        """Record round ``rnd``'s ``value``; ``True`` when the rounds should stop after it."""
        if self.patience == 0 or value is None or not math.isfinite(value):
            return False
        if value < self.best * (1 - self.tolerance):
            self.best, self.best_round, self.waited = value, rnd, 0
            return False
        self.waited += 1
        return self.waited >= self.patience
