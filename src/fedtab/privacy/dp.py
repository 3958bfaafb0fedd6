"""Differential privacy at the site: clipping, sensitivities and Gaussian noise.

Neighbouring tables differ in one row *replaced* by another (so a site's row count is
public). Every release is a Gaussian mechanism: the site clips what it computes so the
release has a known L2 sensitivity Δ, and adds ``N(0, (z Δ)²)`` noise itself, before
any masking — the server only chooses the noise multiplier ``z`` (calibrated by
:mod:`.accountant` for the whole run) and the public bounds; the site computes Δ.

Requests carry ``meta["dp"] = {"z": z, "bounds": ..., "clip": C}``:

* ``bounds`` — public value bounds for statistics: ``[lo, hi]`` for every column or
  ``{column: [lo, hi]}``; values are clipped into them before counting and summing.
* ``clip`` — L2 bound of a model update (DP-FedAvg: the site clips
  ``update - global`` to norm ``C``; Δ = 2C).

The noise comes from the operating system's entropy, never from a seed the server knows.
"""

from __future__ import annotations

import functools
import math
import secrets
from typing import Any, Mapping, Sequence

import numpy as np

from .suppression import suppress_small

__all__ = ["DP_META", "DPRequest", "dp_request", "parse_dp", "noise_rng", "add_noise", "column_bounds",
           "clip_values", "moment_sensitivity", "stats_sensitivity", "row_radius", "clip_rows", "clip_update",
           "dp_logistic_update", "noisy_scores", "DP_GD_STEPS_PER_EPOCH", "DP_GD_LR", "DP_GD_NOISE_SCALE",
           "DP_SCHEMA_NOISE_SCALE", "release_moments", "moment_release", "site_noise_floor", "noise_release"]

#: request meta key of the DP settings.
DP_META = "dp"


def _number(value: Any, name: str) -> float:
    """``value`` as a float; ``ValueError`` naming the DP setting when it is not a number (a bool included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            if isinstance(value, bool):
                raise TypeError
            return float(value)  # e.g. a numpy number or a numeric string from a config file
        except (TypeError, ValueError):
            raise ValueError(f"dp {name} must be a number, got {value!r}") from None
    return float(value)


def parse_dp(dp: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Validate a user's ``dp={"epsilon": ε, "delta": δ, ...}``; ``None`` or ε = ∞ means no DP.

    Raises:
        ValueError: ε ≤ 0, δ outside (0, 1), clip ≤ 0, unknown keys.
    """
    if dp is None:
        return None
    known = {"epsilon", "delta", "bounds", "clip"}
    unknown = sorted(set(dp) - known)
    if unknown:
        raise ValueError(f"dp: unknown settings {unknown}; known: {sorted(known)}")
    eps = _number(dp.get("epsilon", math.inf), "epsilon")
    delta = _number(dp.get("delta", 1e-5), "delta")
    if not eps > 0 or not 0 < delta < 1:
        raise ValueError(f"dp needs epsilon > 0 and 0 < delta < 1, got epsilon={eps}, delta={delta}")
    if math.isinf(eps):
        return None
    clip = _number(dp.get("clip", 1.0), "clip")
    if not clip > 0:
        raise ValueError(f"dp clip must be positive, got {clip}")
    return {"epsilon": eps, "delta": delta, "bounds": dp.get("bounds"), "clip": clip}


DPRequest = dict  # {"z", "bounds", "clip"} as sent in meta["dp"]


def dp_request(dp: Mapping[str, Any], z: float) -> dict[str, Any]:
    """The ``meta["dp"]`` of a request: noise multiplier, bounds, clip."""
    return {"z": float(z), "bounds": dp.get("bounds"), "clip": float(dp.get("clip", 1.0))}


def _z(spec: Mapping[str, Any]) -> float:
    z = spec.get("z")
    if not isinstance(z, (int, float)) or not z > 0 or not math.isfinite(z):
        raise ValueError(f"dp request needs a positive finite noise multiplier z, got {z!r}")
    return float(z)


@functools.lru_cache(maxsize=64)
def site_noise_floor(max_epsilon: float, delta: float) -> float:
    """The smallest noise multiplier a site answers with: one Gaussian release at it spends
    at most ``max_epsilon`` at ``delta`` (the site's own terms; a request may only add noise).

    Raises:
        ValueError: ``max_epsilon <= 0`` or ``delta`` outside (0, 1).
        ImportError: without the dp-accounting package.
    """
    from .accountant import calibrate

    return calibrate(float(max_epsilon), float(delta), 1)


def noise_rng() -> np.random.Generator:
    """A generator seeded from OS entropy (the server must not be able to predict the noise)."""
    return np.random.default_rng(secrets.randbits(128))


def add_noise(value: np.ndarray, sensitivity: float, spec: Mapping[str, Any], rng: np.random.Generator,
              symmetric: bool = False) -> np.ndarray:
    """``value + N(0, (z Δ)²)``; ``symmetric`` mirrors the noise of a square array's upper triangle."""
    sigma = _z(spec) * float(sensitivity)
    value = np.asarray(value, dtype=np.float64)
    noise = rng.normal(0.0, sigma, size=value.shape)
    if symmetric:
        noise = np.triu(noise) + np.triu(noise, 1).T
    return value + noise


def noise_release(arrays: Mapping[str, np.ndarray], sensitivity: Mapping[str, float], spec: Mapping[str, Any],
                  ) -> dict[str, np.ndarray]:
    """A reply's arrays as a site releases them under DP: each ``array + N(0, (z Δ)²)``
    (float64) with ``Δ = sensitivity[name]``, drawn in the arrays' order from one
    :func:`noise_rng` generator. The sensitivities are the handler's declaration
    (``Releases.dp_noise``), so a handler computes only its exact release.

    Raises:
        ValueError: an array without a declared sensitivity (it would leave without noise),
            or a bad noise multiplier in ``spec``.
    """
    bare = [k for k in arrays if k not in sensitivity]
    if bare:
        raise ValueError(f"DP release: no declared sensitivity for array(s) {bare[:8]}; nothing leaves without noise")
    rng = noise_rng()
    return {k: add_noise(v, sensitivity[k], spec, rng) for k, v in arrays.items()}


def column_bounds(spec: Mapping[str, Any], columns: Sequence[str], held: Sequence[str] | None = None,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` per column from ``spec["bounds"]``; columns not in ``held`` get ``(0, 0)``.

    Raises:
        ValueError: no bounds, a held column without bounds (naming it), ``lo > hi``.
    """
    bounds = spec.get("bounds")
    if bounds is None:
        raise ValueError("DP statistics need public value bounds: [columns] bounds = {column = [lo, hi]} in the job "
                         "(or dp['bounds'] = [lo, hi] for every column)")
    held_set = set(columns if held is None else held)
    lo, hi = np.zeros(len(columns)), np.zeros(len(columns))
    for i, c in enumerate(columns):
        if c not in held_set:
            continue
        b = bounds.get(c) if isinstance(bounds, Mapping) else bounds
        if not isinstance(b, (list, tuple)) or len(b) != 2 or not float(b[0]) <= float(b[1]):
            raise ValueError(f"DP statistics: no valid public bounds [lo, hi] for column {c!r}")
        lo[i], hi[i] = float(b[0]), float(b[1])
    return lo, hi


def clip_values(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Clip each column into ``[lo, hi]`` (NaN stays NaN)."""
    return np.clip(np.asarray(values, dtype=np.float64), lo, hi)


def moment_sensitivity(lo: np.ndarray, hi: np.ndarray) -> dict[str, float]:
    """L2 sensitivity of per-column (count, sum, sum of squares) of values in ``[lo, hi]``
    (a missing value counts 0): a replaced row changes each column's count by ≤ 1, its sum
    by ≤ ``m = max(hi - lo, |lo|, |hi|)`` (the other row's value may be missing) and its
    sum of squares by ≤ ``a² = max(lo², hi²)`` (two squares in ``[0, a²]``)."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    a = np.maximum(np.abs(lo), np.abs(hi))
    m = np.maximum(hi - lo, a)
    held = m > 0
    return {"count": math.sqrt(held.sum()), "sum": float(np.linalg.norm(m)), "sumsq": float(np.linalg.norm(a * a))}


def moment_release(moments: Mapping[str, np.ndarray], lo: np.ndarray, hi: np.ndarray, spec: Mapping[str, Any]
                   ) -> dict[str, np.ndarray]:
    """Exact per-column ``count``/``sum``/``sumsq`` of values clipped into ``[lo, hi]`` as a DP
    release: each array a Gaussian release at :func:`moment_sensitivity` (:func:`noise_release`,
    in the arrays' order; nothing suppressed: the noise protects small cells).

    Raises:
        ValueError: an array other than the three, or a bad noise multiplier in ``spec``.
    """
    return noise_release(moments, moment_sensitivity(lo, hi), spec)


def release_moments(count: np.ndarray, total: np.ndarray, sumsq: np.ndarray, *, min_rows: int,
                    dp: Mapping[str, Any] | None, lo: np.ndarray | None = None, hi: np.ndarray | None = None,
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-column ``(count, sum, sum of squares)`` as a site releases them.

    Without ``dp``: cells counted from fewer than ``min_rows`` rows are zeroed
    (:func:`fedtab.privacy.suppression.suppress_small`). With ``dp`` (values already clipped into
    ``[lo, hi]``): each array is a Gaussian release at :func:`moment_sensitivity` and nothing
    is suppressed (data-dependent suppression would void the guarantee; the noise protects
    small cells).
    """
    if dp is None:
        return suppress_small(count, min_rows, total, sumsq)  # type: ignore[return-value]
    sens, rng = moment_sensitivity(lo, hi), noise_rng()
    return tuple(add_noise(a, sens[k], dp, rng)  # type: ignore[return-value]
                 for k, a in (("count", count), ("sum", total), ("sumsq", sumsq)))


def row_radius(n_columns: int) -> float:
    """L2 radius rows are clipped to in z-space for DP statistics: ``√(2 F)`` (a typical
    z-scored row has ``‖z‖² ≈ F``; heavier rows are shrunk onto the sphere)."""
    return math.sqrt(2.0 * max(n_columns, 1))


def clip_rows(z: np.ndarray, radius: float) -> np.ndarray:
    """Scale each row of ``z`` (NaN = missing, ignored) to L2 norm at most ``radius``."""
    z = np.asarray(z, dtype=np.float64)
    norm = np.sqrt(np.nansum(z * z, axis=1))
    factor = np.where(norm > radius, radius / np.maximum(norm, 1e-300), 1.0)
    return z * factor[:, None]


def stats_sensitivity(radius: float, n_columns: int) -> dict[str, float]:
    """L2 sensitivity of each :class:`~fedtab.impute.stats.SiteStats` array over rows of
    L2 norm ≤ ``radius`` (:func:`clip_rows`) with ``n_columns`` columns, under replacement
    of one row: ``x xᵀ`` has Frobenius norm ``‖x‖²``, ``x oᵀ`` at most ``‖x‖ √F``, the
    observation pattern ``o oᵀ`` at most ``F`` (missing entries count 0). A signed array
    moves by up to twice its norm bound; the arrays whose two rows' contributions have a
    non-negative inner product (``x²``, ``x xᵀ``, ``x² oᵀ``: ``‖A - B‖² ≤ ‖A‖² + ‖B‖²``)
    by at most √2 times it, and ``o oᵀ`` (0/1 entries) by at most ``F``."""
    r, f = float(radius), float(n_columns)
    root2 = math.sqrt(2.0)
    return {"count": math.sqrt(f), "sum": 2 * r, "sumsq": root2 * r * r, "pair_count": f,
            "pair_sx": 2 * r * math.sqrt(f), "pair_sxx": root2 * r * r * math.sqrt(f), "pair_sxy": root2 * r * r}


def clip_update(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray], spec: Mapping[str, Any],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    """DP-FedAvg at the site: ``old + noise(clip(new - old, C))`` with Δ = 2C over all arrays jointly.

    Raises:
        ValueError: the two parameter sets differ in names or shapes.
    """
    if set(new) != set(old) or any(np.shape(new[k]) != np.shape(old[k]) for k in new):
        raise ValueError("DP-FedAvg: the update and the global parameters differ in names or shapes")
    clip = float(spec.get("clip", 1.0))
    delta = {k: np.asarray(new[k], np.float64) - np.asarray(old[k], np.float64) for k in new}
    norm = math.sqrt(sum(float((d * d).sum()) for d in delta.values()))
    factor = min(1.0, clip / norm) if norm > 0 else 1.0
    return {k: (np.asarray(old[k], np.float64) + add_noise(d * factor, 2 * clip, spec, rng)).astype(np.asarray(new[k]).dtype)
            for k, d in delta.items()}


#: DP logistic regression: full-batch gradient steps per local epoch, and their step size.
DP_GD_STEPS_PER_EPOCH = 4
DP_GD_LR = 0.5
#: the gradient steps' noise multiplier relative to the run's other releases: hundreds of
#: steps whose noise is divided by the row count can each take more noise than a few statistics.
DP_GD_NOISE_SCALE = 4.0
#: the imputation schema step's noise multiplier relative to the run's other releases: its
#: raw-unit moments only centre and scale the statistics that are released again (in
#: z-space, at the base multiplier), so they can take more noise.
DP_SCHEMA_NOISE_SCALE = 2.0


def dp_logistic_update(params: Mapping[str, np.ndarray], X: np.ndarray, y: np.ndarray, *, steps: int,
                       lr: float, l2: float, spec: Mapping[str, Any], rng: np.random.Generator,
                       ) -> dict[str, np.ndarray]:
    """DP gradient descent for (multinomial) logistic regression at one site.

    Each of ``steps`` full-batch steps sums the per-example gradients clipped to L2 norm
    ``C = spec["clip"]`` (a replaced row moves the sum by ≤ 2C), adds ``N(0, (z·2C)²)``,
    divides by the row count (public) and adds the L2 penalty's gradient. Each step is one
    Gaussian release; the noise per parameter shrinks as ``1/n``, unlike clipping the whole
    update (:func:`clip_update`).

    Args:
        params: ``{"coef": (k, d), "intercept": (k,)}`` (k = 1 for two classes).
        X: ``(n, d)`` standardised features. y: ``(n,)`` class indices.
    """
    coef, intercept = np.asarray(params["coef"], np.float64), np.asarray(params["intercept"], np.float64)
    k, d = coef.shape
    theta = np.concatenate([coef, intercept[:, None]], axis=1)
    Xb = np.concatenate([np.asarray(X, np.float64), np.ones((len(X), 1))], axis=1)
    y = np.asarray(y, dtype=np.int64)
    n = max(len(y), 1)
    target = y[:, None].astype(np.float64) if k == 1 else np.eye(k)[y]
    clip = float(spec.get("clip", 1.0))
    x_norm = np.linalg.norm(Xb, axis=1)
    penalty = np.zeros_like(theta)
    for _ in range(int(steps)):
        z = Xb @ theta.T
        if k == 1:
            resid = 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50))) - target
        else:
            e = np.exp(z - z.max(axis=1, keepdims=True))
            resid = e / e.sum(axis=1, keepdims=True) - target
        norms = np.linalg.norm(resid, axis=1) * x_norm  # ‖r_i ⊗ x_i‖
        factor = np.minimum(1.0, clip / np.maximum(norms, 1e-12))
        total = add_noise((resid * factor[:, None]).T @ Xb, 2 * clip, spec, rng)
        penalty[:, :d] = l2 * theta[:, :d]
        theta = theta - lr * (total / n + penalty)
    return {"coef": theta[:, :d].copy(), "intercept": theta[:, d].copy()}


def noisy_scores(scores: np.ndarray, spec: Mapping[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A DP ballot: scores min-max normalised to [0, 1] by the site, Gaussian noise with
    Δ = √d (any row may move every score across the whole range), then the mask is the
    noisy scores above 0.5 and the sent scores are clipped back into [0, 1].

    Returns:
        ``(mask, scores)``.
    """
    s = np.nan_to_num(np.asarray(scores, dtype=np.float64))
    span = s.max(initial=0.0) - s.min(initial=0.0)
    norm = (s - s.min(initial=0.0)) / span if span > 0 else np.zeros_like(s)
    noisy = add_noise(norm, math.sqrt(len(s)), spec, rng)
    return noisy > 0.5, np.clip(noisy, 0.0, 1.0)
