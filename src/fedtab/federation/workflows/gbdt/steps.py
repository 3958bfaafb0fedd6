"""The GBDT workflow's server steps: requests, validators of every reply, reductions.

Each step validates before it reduces (the Flower shape, as :mod:`fedtab.federation.workflows.training.steps`):

* :func:`summary_checker` — a site's class labels (the ones it declared) and rows;
* :func:`sketch_checker` / :func:`sketch_total` — a site's (plain) and the pooled sketch counts:
  finite, ``≥ 0``, at most the training rows declared per feature; :func:`noisy_checker` — a
  site's DP sketch counts (shape and finiteness);
* :func:`labels_checker` — label sums that fit the rows declared (exact: integer class counts
  summing to them; ``Σy ≤ n`` for binary);
* :func:`level_checker` — a level histogram of the requested shape, finite, its features
  agreeing on the node totals and its hessian mass within the site's rows
  (:func:`~fedtab.learn.gbdt.check_site_histogram`; DP: shape and finiteness only), and its
  validation loss sums (``0 ≤ loss``, the validation rows it declared);
* :func:`importance_checker` — a site's per-feature gains: ``(d,)`` finite, its training rows,
  its suppressed splits at most the model's splits;
* :func:`robust_pool` — robust mode: each node's pooled histogram with no site above
  ``max_site_share`` of the node's hessian mass (:func:`~fedtab.federation.protocol.reduce.cap_weights`).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from fedtab.learn.gbdt import BinLayout, GBDTModel, check_site_histogram
from fedtab.learn.gbdt.sketch import check_counts
from fedtab.learn.gbdt.release import GRID_BITS, PACKED, unpack_level
from fedtab.federation.protocol import validate
from fedtab.federation.protocol.messages import Message
from fedtab.federation.protocol import Federation
from fedtab.federation.protocol.reduce import cap_weights

__all__ = ["summary_checker", "sketch_checker", "noisy_checker", "sketch_total", "labels_checker", "level_checker", "importance_checker", "robust_pool", "payload_bytes"]


def summary_checker(federation: Federation, part: str, *, regression: bool) -> Callable[[str, Message], None]:
    """Validator of ``"gbdt_summary"`` replies: the rows of ``part`` and class labels the site
    declared, and no arrays (the bin edges come from public bounds or the sketch)."""

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        validate.integer(reply.meta.get("n"), f"{part} rows", equal=schema.rows(site, part))
        if not regression:
            schema.check_classes(site, reply.meta.get("classes"))
        if reply.arrays:
            raise ValueError("sent arrays with its class labels (no column's values are asked for)")

    return check


def sketch_checker(federation: Federation, n_features: int, width: int) -> Callable[[str, Message], None]:
    """Validator of ``"gbdt_sketch"`` replies (counts checked when sent in the clear: a secure
    sum checks the total, :func:`sketch_total`): ``(n_features, width)`` finite counts ``≥ 0``,
    at most the site's training rows per feature."""

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        if "counts" in reply.arrays:  # a secure sum sends it masked: the total is checked instead
            check_counts(reply.arrays["counts"], n_features, width, schema.rows(site, "train"),
                         f"site {site!r}: sketch counts")

    return check


def noisy_checker(federation: Federation, n_features: int, width: int) -> Callable[[str, Message], None]:
    """Validator of ``"gbdt_sketch"`` replies under DP (counts noised at the site: checked when sent
    in the clear for shape and finiteness only; negative counts are noise, not a lie)."""

    def check(site: str, reply: Message) -> None:
        if "counts" in reply.arrays:
            c = np.asarray(reply.arrays["counts"], dtype=np.float64)
            if c.size != n_features * width or not np.isfinite(c).all():
                raise ValueError(f"noisy sketch counts must be {n_features} x {width} finite numbers, got shape {c.shape}")

    return check


def sketch_total(federation: Federation, n_features: int, width: int
                 ) -> Callable[[Mapping[str, np.ndarray], list[str]], None]:
    """``check_total`` of a sketch's sums: the pooled counts (:func:`~fedtab.learn.gbdt.sketch.check_counts`)
    over the summing sites' training rows, so that one hostile site's poison in its masked
    counts is a :class:`~fedtab.federation.protocol.FederationError` of the ``gbdt_sketch`` step."""

    def check(sums: Mapping[str, np.ndarray], sites: list[str]) -> None:
        schema = federation.schema
        assert schema is not None
        if "counts" not in sums:
            raise ValueError("no summed sketch counts")
        check_counts(sums["counts"], n_features, width, sum(schema.rows(s, "train") for s in sites),
                     "the summed sketch counts")

    return check


def labels_checker(federation: Federation, part: str, objective: str, n_classes: int, *, exact: bool = True
                   ) -> Callable[[str, Message], None]:
    """Validator of ``"gbdt_start"`` replies (the label sums are checked when sent in the clear;
    ``exact=False``, the step's DP release: shape and finiteness only, the values are noisy)."""
    width = n_classes if objective == "multiclass" else 2

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        n = validate.integer(reply.meta.get("n"), f"{part} rows", equal=schema.rows(site, part))
        if "label_sums" not in reply.arrays:
            return
        s = validate.array(reply, "label_sums", (width,))
        if exact:
            _check_label_sums(s, n, objective)

    return check


def _check_label_sums(s: np.ndarray, n: int, objective: str) -> None:
    """Exact label sums of ``n`` rows: integer class counts summing to ``n`` (multiclass), or
    ``[Σy, n]`` with ``0 ≤ Σy ≤ n`` for binary.

    Raises:
        ValueError: otherwise.
    """
    if objective == "multiclass":
        validate.counts(s, n, "class counts")
        if s.sum() != n:
            raise ValueError(f"class counts sum to {s.sum():g}, not the {n} rows declared")
    elif s[1] != n:
        raise ValueError(f"label sums count {s[1]:g} rows, not the {n} declared")
    elif objective == "binary" and not 0 <= s[0] <= n:
        raise ValueError("the positive count of the label sums is outside 0..n")


def level_checker(federation: Federation, layout: BinLayout, n_nodes: int, part: str, val_part: str | None, *,
                  objective: str, exact: bool = True, validating: bool, sizes: dict[str, int] | None = None
                  ) -> Callable[[str, Message], None]:
    """Validator of ``"gbdt_level"`` replies (arrays checked when present: a secure sum sends them
    masked, and the summing strategy refuses a reply in the clear that lacks them).

    ``exact=False`` is the step's DP release: noisy values (shape and finiteness only) and no
    packed histogram. A packed histogram (``hist`` + :data:`~fedtab.learn.gbdt.release.PACKED`, a
    plain level's reply) is unpacked in place first (:func:`~fedtab.learn.gbdt.release.unpack_level`),
    so that the checks and the sum see the dense ``(n_nodes, n_slots, 2)`` float64 array; one
    where a dense one is due (DP, or a secure sum: its ``hist`` is masked, not in the clear reply)
    is refused. ``sizes``: filled with the array bytes of each reply that sent its level's values
    in the clear (``hist`` or ``val_loss``), as sent."""

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        if sizes is not None and ("hist" in reply.arrays or "val_loss" in reply.arrays):
            sizes[site] = payload_bytes(reply)
        if PACKED in reply.arrays:
            if not exact or "hist" not in reply.arrays:
                raise ValueError("sent a packed level histogram where a dense one was due")
            reply.arrays["hist"] = unpack_level(reply.arrays["hist"], reply.arrays.pop(PACKED), n_nodes, layout.n_slots)
        if "hist" in reply.arrays:
            check_site_histogram(np.asarray(reply.arrays["hist"]), layout, n_nodes, n_rows=schema.rows(site, part),
                                 objective=objective, noisy=not exact, site=f"site {site!r}",
                                 quantum=2.0 ** -GRID_BITS)
        if validating and val_part is not None:
            n_val = validate.integer(reply.meta.get("n_val"), f"{val_part} rows",
                                     equal=schema.rows(site, val_part)) if "n_val" in reply.meta else None
            if "val_loss" in reply.arrays:
                v = validate.array(reply, "val_loss", (2,))
                if exact and (v[0] < 0 or (n_val is not None and v[1] != n_val)):
                    raise ValueError("validation loss sums must be [loss >= 0, the validation rows declared]")

    return check


def importance_checker(federation: Federation, model: GBDTModel, part: str) -> Callable[[str, Message], None]:
    """Validator of ``"gbdt_importance"`` replies."""
    n_splits = int((model.nodes["left"] >= 0).sum())

    def check(site: str, reply: Message) -> None:
        schema = federation.schema
        assert schema is not None
        validate.integer(reply.meta.get("n"), f"{part} rows", equal=schema.rows(site, part))
        validate.integer(reply.meta.get("suppressed"), "suppressed splits", upper=n_splits)
        validate.array(reply, "gain", (model.n_features,))

    return check


def robust_pool(replies: Mapping[str, Message], layout: BinLayout, max_site_share: float
                ) -> tuple[np.ndarray, dict[str, float]]:
    """``(pooled (m, n_slots, 2), {site: its largest share before capping})`` with each node's
    site shares of the hessian mass capped at ``max_site_share`` (a site above it is scaled
    down, the others up, so that the node's total hessian mass is kept)."""
    names = list(replies)
    hists = np.stack([np.asarray(replies[s].arrays["hist"], dtype=np.float64) for s in names])  # (S, m, slots, 2)
    mass = hists[:, :, layout.offsets[0]:layout.offsets[1], 1].sum(axis=2)  # (S, m) hessian per node
    total = mass.sum(axis=0)
    shares = cap_weights(np.maximum(mass, 0.0), max_site_share) if mass.size and (total > 0).all() else None
    if shares is None:
        return hists.sum(axis=0), {}
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(mass > 0, shares * total[None, :] / mass, 0.0)  # (S, m)
        raw = np.where(total[None, :] > 0, mass / total[None, :], 0.0)
    pooled = (hists * scale[:, :, None, None]).sum(axis=0)
    return pooled, {s: float(raw[i].max(initial=0.0)) for i, s in enumerate(names)}


def payload_bytes(message: Message) -> int:
    """Bytes of a message's arrays (what its numbers weigh on any wire, before framing)."""
    return int(sum(np.asarray(a).nbytes for a in message.arrays.values()))

