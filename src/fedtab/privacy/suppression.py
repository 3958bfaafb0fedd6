"""Small-cell suppression: the one rule a site's plain statistics and its disclosure policy share.

A count below the site's ``min_rows`` (but above 0) is zeroed, together with every sum taken over
the same rows. :mod:`fedtab.privacy.policy` (whose ``min_rows`` rule it is, applied by the gate) and
:mod:`fedtab.privacy.dp` (plain moments when no noise is drawn) both use it; it imports neither.
"""

from __future__ import annotations

import numpy as np

__all__ = ["suppress_small"]


def suppress_small(counts: np.ndarray, min_rows: int, *sums: np.ndarray) -> tuple[np.ndarray, ...]:
    """Zero every cell whose count is below ``min_rows`` (but above 0), in the counts and
    in each same-shaped sum computed over those rows. Returns new arrays, counts first
    (``len(sums) + 1`` of them, each of the shape of its input)."""
    small = (np.asarray(counts) > 0) & (np.asarray(counts) < min_rows)
    return tuple(np.where(small, 0, a) for a in (counts, *sums))
