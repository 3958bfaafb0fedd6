"""The election workflow: sites vote, the server elects, sites learn the mask.

Site side (handlers): ``"ballot"`` runs the site's selector on its training rows and
replies with mask, scores, feature names and sample count; ``"set_mask"`` stores
the elected feature names in ``site.state["features"]``.

Server side: :func:`gather_ballots` asks every site and validates each ballot on
arrival (a bad ballot raises, naming the site), :func:`run_election` elects and
tells the sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np

from ..election.ballot import Ballot
from ..election.rule import ElectionResult, check_aggregation, check_normalization, check_profile
from ..election.selectors import make_selector, selector_spec
from ..election.tally import ElectionTally
from .local_data import fill_with_column_means, numeric_matrix
from .messages import Message
from .protocol import Federation, FederationError, collect
from .site import Site, handler

__all__ = ["ElectionOutcome", "ballot_reply", "gather_ballots", "elect_from_ballots", "run_election", "broadcast_mask"]


def ballot_reply(site: Site, kind: str, spec: Any, frame: Any, y: np.ndarray) -> Message:
    """Run the site's selector (or ``spec``) on ``frame``/``y`` and pack the ballot reply.

    Missing cells are filled with the local column mean for selection only.
    """
    selector = make_selector(spec if spec is not None else site.selector)
    X = fill_with_column_means(numeric_matrix(frame, site.name))
    sel = selector.select(X, y)
    return Message(
        kind,
        {"mask": np.asarray(sel.mask, dtype=bool), "scores": np.asarray(sel.scores, dtype=np.float64)},
        {"feature_names": list(frame.columns.astype(str)), "n_samples": int(len(y)), "selector": selector.name},
    )


@handler("ballot")
def _ballot(site: Site, request: Message) -> Message:
    columns = request.meta.get("features")
    if columns is not None:
        held = site.feature_set
        columns = [c for c in columns if c in held]
    frame, y = site.xy("train", columns)
    return ballot_reply(site, "ballot", request.meta.get("selector"), frame, y)


@handler("set_mask")
def _set_mask(site: Site, request: Message) -> Message:
    features = request.meta.get("features")
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise ValueError("set_mask needs a list of feature names")
    site.state["features"] = list(features)
    held_set = site.feature_set
    held = [f for f in features if f in held_set]
    meta: dict[str, Any] = {"kept": len(features), "held": len(held)}
    part = request.meta.get("describe")
    if part is None:
        return Message("set_mask", meta=meta)
    from .training_flow import describe_site  # the training workflow's "describe" answer, same exchange

    described = describe_site(site, list(features), str(part))
    return Message("set_mask", described.arrays, {**meta, "describe": described.meta})


def _described_from(reply: Message) -> Message:
    """The ``"describe"`` reply folded into a ``"set_mask"`` reply (see :func:`broadcast_mask`)."""
    meta = reply.meta.get("describe")
    if not isinstance(meta, dict):
        raise ValueError("the set_mask reply carries no description")
    return Message("describe", dict(reply.arrays), meta)


def _selector_request(selector: Any) -> dict[str, Any]:
    if selector is None:
        return {}
    return {"selector": selector_spec(selector)}


def gather_ballots(
    federation: Federation,
    selector: Any = None,
    *,
    selectors: Mapping[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
) -> list[Ballot]:
    """Ask every site for a ballot and validate each on arrival.

    Args:
        selector: a built-in selector (name/spec) every site should use; ``None`` lets
            each site use its own (``Site.selector``).
        selectors: per-site overrides ``{site: selector}``.
        on_error: ``"raise"`` (default) or ``"skip"`` sites whose reply is an error
            or an invalid ballot.

    Raises:
        FederationError: a site failed (with ``on_error="raise"``), naming it.
        ValueError: a ballot is invalid (shape, finiteness, sample count), naming the site.
    """
    requests = {}
    for name in federation.sites:
        spec = (selectors or {}).get(name, selector)
        requests[name] = Message("ballot", meta=_selector_request(spec))
    replies = collect(federation.ask(requests), "ballot", on_error)
    ballots = []
    for name, reply in replies.items():
        try:
            ballots.append(
                Ballot.build(
                    reply.arrays.get("mask"),
                    reply.arrays.get("scores"),
                    reply.meta.get("n_samples"),
                    reply.meta.get("feature_names"),
                    site=name,
                )
            )
        except ValueError:
            if on_error == "raise":
                raise
    if not ballots:
        raise ValueError("no valid ballots")
    return ballots


def elect_from_ballots(
    ballots: list[Ballot],
    freedom_degree: float,
    aggregation: str = "weighted",
    normalization: str = "all",
    compat: str | None = None,
) -> ElectionResult:
    """Count ``ballots`` in an :class:`ElectionTally` (aligned by name) and elect
    (``compat``: a peer's server rule, see :mod:`fedtab.election.compat`)."""
    check_aggregation(aggregation)
    tally = ElectionTally(normalization=check_normalization(normalization), compat=compat)
    for b in ballots:
        if b.feature_names is None:
            raise ValueError(f"site {b.site!r}: ballot has no feature names")
        tally.add_ballot(b)
    return tally.result(freedom_degree, aggregation)


def broadcast_mask(federation: Federation, features: list[str], *, describe: str | None = None,
                   ) -> dict[str, Message] | None:
    """Tell every site the elected feature names (stored in ``site.state["features"]``).

    Args:
        describe: a row part (``"train"``...): in the same exchange each site also
            answers the training workflow's ``"describe"`` step over ``features`` on
            that part (class labels and per-feature count/sum/sum of squares).

    Returns:
        ``None`` without ``describe``; with it ``{site: Message("describe", ...)}``, to
        pass to :func:`~fedtab.federation.training_flow.run_training` as ``described``
        (one exchange fewer, same result).

    Raises:
        FederationError: a site failed (naming it).
    """
    meta: dict[str, Any] = {"features": list(features)}
    if describe is not None:
        meta["describe"] = str(describe)
    replies = collect(federation.broadcast(Message("set_mask", meta=meta)), "set_mask")
    if describe is None:
        return None
    out = {}
    for name, reply in replies.items():
        try:
            out[name] = _described_from(reply)
        except ValueError as exc:
            raise FederationError(f"site {name!r}: {exc}") from None
    return out


@dataclass
class ElectionOutcome:
    """What :func:`run_election` returns: the ballots and the election result."""

    ballots: list[Ballot]
    result: ElectionResult
    #: ``{site: "describe" reply}`` over the elected features when :func:`run_election`
    #: was called with ``describe=PART`` (else ``None``); pass to ``run_training(described=...)``.
    described: dict[str, Message] | None = None

    def site_summary(self) -> list[dict[str, Any]]:
        """Per site: name, selected count, sample count."""
        return [{"name": b.site, "n_samples": b.n_samples, "selected": b.n_selected} for b in self.ballots]


def run_election(
    federation: Federation,
    freedom_degree: float = 0.5,
    *,
    selector: Any = None,
    selectors: Mapping[str, Any] | None = None,
    aggregation: str = "weighted",
    normalization: str = "all",
    compat: str | None = None,
    ballots: list[Ballot] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    describe: str | None = None,
) -> ElectionOutcome:
    """Gather ballots (unless given), elect, and send the mask to every site.

    Two exchanges (``ballot``, ``set_mask``), one with ``ballots`` given. With
    ``describe=PART`` (e.g. ``"train"``) the ``set_mask`` exchange also gathers the
    training workflow's description of the elected features (``.described``), so a
    following ``run_training(..., described=outcome.described)`` skips its describe step.
    ``compat`` elects with a peer's server rule (see :mod:`fedtab.election.compat`).
    """
    check_profile(compat, normalization)
    if ballots is None:
        ballots = gather_ballots(federation, selector, selectors=selectors, on_error=on_error)
    result = elect_from_ballots(ballots, freedom_degree, aggregation, normalization, compat)
    described = broadcast_mask(federation, result.selected_names, describe=describe)
    return ElectionOutcome(ballots, result, described)
