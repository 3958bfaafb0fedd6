"""Freedom-degree tuning: pure search logic over two callables, no federation inside.

The server can elect a mask for any freedom degree from the ballots it already holds
(``mask_of(fd)``, cheap), while scoring a mask needs the sites (``score_of(mask)``,
e.g. the sample-weighted validation F1 of a model trained by FedAvg on it). Many fd
values give the same mask, so every search here scores each *distinct* mask once.

Two searches:

* :func:`grid_tune` (the default): score a grid of fd values, refine around the best
  one, then return the **smallest mask whose score is within ``tolerance`` of the
  best** (parsimony — when F1 is flat, fewer features win);
* :func:`hill_climb`: the peers' procedure, kept for comparison: start at ``start``,
  step ``±step``, reverse direction and halve the step whenever a move does not
  improve, stay inside ``bounds``; returns the best fd it visited.

Both return a :class:`TuningResult` holding the whole curve (fd → score, kept).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np

__all__ = [
    "DEFAULT_GRID",
    "TuningPoint",
    "TuningResult",
    "MaskScorer",
    "choose_parsimonious",
    "grid_tune",
    "hill_climb",
    "tune",
]

#: fd values the grid search scores before refining.
DEFAULT_GRID: tuple[float, ...] = tuple(round(x, 2) for x in np.linspace(0.0, 1.0, 11))

MaskOf = Callable[[float], np.ndarray]
ScoreOf = Callable[[np.ndarray], float]


@dataclass(frozen=True)
class TuningPoint:
    """One evaluated freedom degree: its score, how many features it keeps, and the search stage."""

    freedom_degree: float
    score: float
    kept: int
    stage: str


@dataclass
class TuningResult:
    """Outcome of a search.

    Attributes:
        method: ``"grid"`` or ``"hill-climb"``.
        freedom_degree / score / kept: the choice.
        best_score: highest score seen (the choice may be lower, by at most ``tolerance``,
            with the grid search).
        tolerance: parsimony tolerance (0 for the hill-climb).
        points: every fd evaluated, in order of evaluation.
        evaluations: number of distinct masks actually scored (federated trainings).
    """

    method: str
    freedom_degree: float
    score: float
    kept: int
    best_score: float
    tolerance: float
    points: list[TuningPoint] = field(default_factory=list)
    evaluations: int = 0

    def curve(self) -> list[dict[str, Any]]:
        """The points sorted by fd (one per fd), as dicts ``{freedom_degree, score, kept, stage}``."""
        seen: dict[float, TuningPoint] = {}
        for p in self.points:
            seen.setdefault(p.freedom_degree, p)
        return [asdict(seen[k]) for k in sorted(seen)]

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "freedom_degree": self.freedom_degree, "score": self.score,
                "kept": self.kept, "best_score": self.best_score, "tolerance": self.tolerance,
                "evaluations": self.evaluations, "curve": self.curve()}


class MaskScorer:
    """Caches ``score_of`` by mask so that fd values giving the same mask are scored once.

    Raises:
        ValueError: ``mask_of`` returned something that is not a 1-D bool array, or
            ``score_of`` returned a non-finite number.
    """

    def __init__(self, mask_of: MaskOf, score_of: ScoreOf):
        self.mask_of = mask_of
        self.score_of = score_of
        self.cache: dict[bytes, float] = {}

    def __call__(self, fd: float) -> tuple[float, int]:
        mask = np.asarray(self.mask_of(float(fd)))
        if mask.ndim != 1 or mask.dtype != bool:
            raise ValueError(f"mask_of({fd}) must return a 1-D bool array, got {mask.dtype} {mask.shape}")
        key = np.packbits(mask).tobytes() + len(mask).to_bytes(8, "little")
        if key not in self.cache:
            score = float(self.score_of(mask))
            if not np.isfinite(score):
                raise ValueError(f"score_of returned {score} for fd={fd}")
            self.cache[key] = score
        return self.cache[key], int(mask.sum())


def _check_fd(values: Iterable[float]) -> list[float]:
    out = []
    for v in values:
        v = float(v)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"freedom degrees must be in [0, 1], got {v}")
        out.append(round(v, 6))
    return out


def choose_parsimonious(points: Sequence[TuningPoint], tolerance: float) -> TuningPoint:
    """The point with the fewest kept features among those scoring ``>= best − tolerance``.

    Ties on ``kept`` go to the higher score, then to the lower fd.

    Raises:
        ValueError: no points, or a negative tolerance.
    """
    if not points:
        raise ValueError("no tuning points to choose from")
    if tolerance < 0:
        raise ValueError(f"tolerance must be non-negative, got {tolerance}")
    best = max(p.score for p in points)
    eligible = [p for p in points if p.score >= best - tolerance - 1e-12]
    return min(eligible, key=lambda p: (p.kept, -p.score, p.freedom_degree))


def grid_tune(
    mask_of: MaskOf,
    score_of: ScoreOf,
    *,
    grid: Sequence[float] = DEFAULT_GRID,
    refine_step: float = 0.025,
    refine_width: float = 0.1,
    tolerance: float = 0.01,
) -> TuningResult:
    """Grid search, refinement around the best fd, parsimonious choice.

    Args:
        mask_of: fd -> ``(d,)`` bool mask (the election on the server's ballots).
        score_of: mask -> score, higher is better (federated; called once per distinct mask).
        grid: first-pass fd values in [0, 1].
        refine_step / refine_width: second pass scores ``best ± k·refine_step`` for
            ``k·refine_step <= refine_width`` (0 skips refinement).
        tolerance: parsimony tolerance on the score (0 = plain arg-max, smallest mask on ties).

    Raises:
        ValueError: empty grid, fd outside [0, 1], negative tolerance or refinement settings.
    """
    grid_fd = sorted(set(_check_fd(grid)))
    if not grid_fd:
        raise ValueError("the grid is empty")
    if refine_step < 0 or refine_width < 0:
        raise ValueError("refine_step and refine_width must be non-negative")
    scorer = MaskScorer(mask_of, score_of)
    points = [TuningPoint(fd, *scorer(fd), "grid") for fd in grid_fd]
    if refine_step > 0 and refine_width > 0:
        best = max(points, key=lambda p: (p.score, -p.kept))
        n = int(np.floor(refine_width / refine_step + 1e-9))
        done = {p.freedom_degree for p in points}
        for k in range(-n, n + 1):
            fd = round(best.freedom_degree + k * refine_step, 6)
            if 0.0 <= fd <= 1.0 and fd not in done:
                points.append(TuningPoint(fd, *scorer(fd), "refine"))
                done.add(fd)
    choice = choose_parsimonious(points, tolerance)
    return TuningResult("grid", choice.freedom_degree, choice.score, choice.kept,
                        max(p.score for p in points), float(tolerance), points, len(scorer.cache))


def hill_climb(
    mask_of: MaskOf,
    score_of: ScoreOf,
    *,
    start: float = 0.5,
    step: float = 0.1,
    bounds: tuple[float, float] = (0.05, 1.0),
    max_iter: int = 10,
) -> TuningResult:
    """The peers' hill-climb: move by ``±step``; on no improvement reverse and halve the step.

    A move is accepted only if it strictly improves the score. The search stops after
    ``max_iter`` proposals. Returns the best fd visited (no parsimony).

    Raises:
        ValueError: start outside bounds, bounds outside [0, 1], step or max_iter not positive.
    """
    lo, hi = _check_fd(bounds)
    if not lo <= start <= hi or step <= 0 or max_iter < 1:
        raise ValueError("need bounds lo <= start <= hi, step > 0 and max_iter >= 1")
    scorer = MaskScorer(mask_of, score_of)
    fd = round(float(start), 6)
    best, kept = scorer(fd)
    points = [TuningPoint(fd, best, kept, "start")]
    direction = 1.0
    for _ in range(max_iter):
        cand = round(min(hi, max(lo, fd + direction * step)), 6)
        if cand != fd:
            score, k = scorer(cand)
            points.append(TuningPoint(cand, score, k, "hill-climb"))
            if score > best:
                fd, best, kept = cand, score, k
                continue
        direction, step = -direction, step / 2
    return TuningResult("hill-climb", fd, best, kept, max(p.score for p in points), 0.0, points, len(scorer.cache))


def tune(mask_of: MaskOf, score_of: ScoreOf, method: str = "grid", **options: Any) -> TuningResult:
    """Dispatch to :func:`grid_tune` (``"grid"``) or :func:`hill_climb` (``"hill-climb"``).

    Raises:
        ValueError: unknown method.
    """
    if method == "grid":
        return grid_tune(mask_of, score_of, **options)
    if method in ("hill-climb", "hill_climb", "hillclimb"):
        return hill_climb(mask_of, score_of, **options)
    raise ValueError(f"unknown tuning method {method!r}; expected 'grid' or 'hill-climb'")
