"""Communication accounting: parameters and bytes per round, and the saving of a mask.

Two views, which agree up to message headers:

* analytic — :func:`round_cost` counts the numbers a model sends down (global
  parameters) and up (an update) per site and round, times the bytes per number;
* measured — the training workflow records the serialised size of every ``fit``
  request/reply per site and round (``TrainingOutcome.traffic``), summarised by
  :func:`traffic_summary`.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .models import FederatedModel, make_model

__all__ = ["round_cost", "param_reduction", "traffic_summary", "communication_report"]


def _numbers(shapes: dict[str, tuple[int, ...]]) -> int:
    return int(sum(int(np.prod(s, dtype=np.int64)) for s in shapes.values()))


def round_cost(model: Any, n_features: int, n_classes: int, *, bytes_per_number: int | None = None) -> dict[str, int]:
    """Per site and round: ``params_down``, ``params_up``, ``bytes_down``, ``bytes_up`` (payload only).

    An exact-aggregation model (GaussianNB) receives nothing and sends its statistics;
    a FedAvg model receives and sends its parameters. ``bytes_per_number`` defaults to
    the dtype of the model's parameters (8 for float64, 4 for the float32 MLP).
    """
    fm: FederatedModel = make_model(model)
    init = fm.init(n_features, n_classes)
    width = bytes_per_number or max(int(np.asarray(v).dtype.itemsize) for v in init.values())
    up = _numbers(fm.update_template(n_features, n_classes))
    down = 0 if fm.exact else _numbers({k: v.shape for k, v in init.items()})
    return {"params_down": down, "params_up": up, "bytes_down": down * width, "bytes_up": up * width}


def param_reduction(model: Any, n_all: int, n_selected: int, n_classes: int) -> float:
    """``1 − n_params(selected) / n_params(all)`` as a fraction in ``[0, 1]`` (0 if nothing was dropped).

    Raises:
        ValueError: ``n_selected`` outside ``0..n_all``.
    """
    if not 0 <= n_selected <= n_all:
        raise ValueError(f"n_selected must be in 0..{n_all}, got {n_selected}")
    fm = make_model(model)
    full = fm.n_params(n_all, n_classes)
    return float(1.0 - fm.n_params(n_selected, n_classes) / full) if full else 0.0


def traffic_summary(traffic: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Totals of per-round, per-site records ``{"round", "site", "bytes_down", "bytes_up", ...}``.

    Returns ``{"rounds", "bytes_down", "bytes_up", "bytes_per_round", "per_site": {site: {...}}}``.
    """
    rows = list(traffic)
    per_site: dict[str, dict[str, int]] = {}
    for r in rows:
        s = per_site.setdefault(r["site"], {"bytes_down": 0, "bytes_up": 0})
        s["bytes_down"] += int(r["bytes_down"])
        s["bytes_up"] += int(r["bytes_up"])
    rounds = len({r["round"] for r in rows})
    down = sum(s["bytes_down"] for s in per_site.values())
    up = sum(s["bytes_up"] for s in per_site.values())
    return {"rounds": rounds, "bytes_down": down, "bytes_up": up,
            "bytes_per_round": (down + up) / rounds if rounds else 0.0, "per_site": per_site}


def communication_report(model: Any, n_all: int, n_selected: int, n_classes: int, *, rounds: int,
                         n_sites: int) -> dict[str, Any]:
    """Analytic cost of training on all features vs the selected ones.

    Returns per-round-per-site costs for both, the totals over ``rounds`` and
    ``n_sites`` (an exact model runs one round whatever ``rounds`` says), and
    ``param_reduction`` / ``byte_reduction`` fractions.
    """
    fm = make_model(model)
    n_rounds = 1 if fm.exact else int(rounds)
    out: dict[str, Any] = {"model": fm.name, "rounds": n_rounds, "sites": int(n_sites)}
    for key, d in (("all", n_all), ("selected", n_selected)):
        c = round_cost(fm, d, n_classes)
        out[key] = {"features": int(d), "n_params": fm.n_params(d, n_classes), "per_round_per_site": c,
                    "total_bytes": (c["bytes_down"] + c["bytes_up"]) * n_rounds * int(n_sites)}
    out["param_reduction"] = param_reduction(fm, n_all, n_selected, n_classes)
    full = out["all"]["total_bytes"]
    out["byte_reduction"] = float(1 - out["selected"]["total_bytes"] / full) if full else 0.0
    return out
