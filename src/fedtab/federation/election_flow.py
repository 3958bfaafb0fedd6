"""The election workflow: sites vote, the server elects, sites learn the mask.

Site side (handlers): ``"ballot"`` runs the site's selector on its training rows and
replies with mask, scores, feature names and sample count; ``"set_mask"`` stores
the elected feature names in ``site.state["features"]``.

Server side: :func:`gather_ballots` asks every site and validates each ballot on
arrival (a bad ballot raises, naming the site), :func:`run_election` elects and
tells the sites.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Mapping

import numpy as np
import pandas as pd

from ..election.ballot import Ballot
from ..election.rule import ElectionResult, check_aggregation, check_normalization, check_profile
from ..election.tally import ElectionTally
from .local_data import fill_with_column_means, numeric_matrix
from .messages import Message
from .protocol import Federation, FederationError, collect
from .site import Site, handler

__all__ = ["ElectionOutcome", "abstention_reason", "ballot_reply", "ballots_from_replies", "gather_ballots", "elect_from_ballots", "run_election", "broadcast_mask"]


def abstention_reason(y: np.ndarray, min_site_rows: int = 0) -> str | None:
    """Why a site with labels ``y`` should not vote, or ``None`` if it can.

    A site abstains when it has fewer than ``min_site_rows`` rows, or when its target
    takes a single value: a selector then has nothing to rank features against and
    would vote noise (ANOVA scores all 0) or fail (non-finite scores). Under strong
    label skew (Dirichlet α = 0.1 over 30 sites) a third of the sites are in that case.
    """
    if len(y) < min_site_rows:
        return f"{len(y)} training rows, fewer than min_site_rows={min_site_rows}"
    values = pd.unique(np.asarray(y))
    if values.size < 2:
        if not values.size:
            return "no training rows"
        value = values[0].item() if isinstance(values[0], np.generic) else values[0]
        return f"the training rows hold a single target value ({value!r})"
    return None


def ballot_reply(site: Site, kind: str, spec: Any, frame: Any, y: np.ndarray, min_site_rows: int = 0) -> Message:
    """Run the site's selector (or ``spec``) on ``frame``/``y`` and pack the ballot reply.

    Missing cells are filled with the local column mean for selection only. A site
    that cannot vote (see :func:`abstention_reason`) replies with meta ``abstain``
    (the reason) and ``n_samples`` and no arrays.
    """
    X = numeric_matrix(frame, site.name)  # a table that cannot vote is still an error, not an abstention
    reason = abstention_reason(y, min_site_rows)
    if reason is not None:
        return Message(kind, meta={"abstain": reason, "n_samples": int(len(y))})
    from ..election.selectors import make_selector  # imports scikit-learn: only where a site votes

    selector = make_selector(spec if spec is not None else site.selector)
    X = fill_with_column_means(X)
    sel = selector.select(X, y)
    return Message(
        kind,
        {"mask": np.asarray(sel.mask, dtype=bool), "scores": np.asarray(sel.scores, dtype=np.float64)},
        {"feature_names": list(map(str, frame.columns.tolist())), "n_samples": int(len(y)), "selector": selector.name},
    )


@handler("ballot")
def _ballot(site: Site, request: Message) -> Message:
    columns = request.meta.get("features")
    if columns is not None:
        held = site.feature_set
        columns = [c for c in columns if c in held]
    frame, y = site.xy("train", columns)
    return ballot_reply(site, "ballot", request.meta.get("selector"), frame, y,
                        _min_rows(request.meta.get("min_site_rows", 0)))


def _min_rows(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"min_site_rows must be a non-negative integer, got {value!r}")
    return value


@handler("set_mask")
def _set_mask(site: Site, request: Message) -> Message:
    features = request.meta.get("features")
    if not isinstance(features, list) or not set(map(type, features)) <= {str}:
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
    from ..election.selectors import selector_spec

    if selector is None:
        return {}
    return {"selector": selector_spec(selector)}


def gather_ballots(
    federation: Federation,
    selector: Any = None,
    *,
    selectors: Mapping[str, Any] | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    min_site_rows: int = 0,
    abstained: dict[str, str] | None = None,
) -> list[Ballot]:
    """Ask every site for a ballot and validate each on arrival.

    Args:
        selector: a built-in selector (name/spec) every site should use; ``None`` lets
            each site use its own (``Site.selector``).
        selectors: per-site overrides ``{site: selector}``.
        on_error: ``"raise"`` (default) or ``"skip"`` sites whose reply is an error
            or an invalid ballot.
        min_site_rows: sites with fewer training rows do not vote (they abstain).
        abstained: if given, filled with ``{site: reason}`` for every site that did not
            vote: too few rows, or a single target value (see :func:`abstention_reason`).

    Raises:
        FederationError: a site failed (with ``on_error="raise"``), naming it.
        ValueError: a ballot is invalid (shape, finiteness, sample count), naming the site.
    """
    min_rows = _min_rows(min_site_rows)
    requests = {}
    for name in federation.sites:
        spec = (selectors or {}).get(name, selector)
        meta = _selector_request(spec)
        if min_rows:
            meta["min_site_rows"] = min_rows
        requests[name] = Message("ballot", meta=meta)
    replies = collect(federation.ask(requests), "ballot", on_error)
    return ballots_from_replies(replies, on_error=on_error, min_site_rows=min_rows, abstained=abstained)


def ballots_from_replies(
    replies: Mapping[str, Message],
    *,
    on_error: Literal["raise", "skip"] = "raise",
    min_site_rows: int = 0,
    abstained: dict[str, str] | None = None,
) -> list[Ballot]:
    """Validate ballot replies (already split from errors by :func:`collect`) into ballots.

    A reply with meta ``abstain`` (see :func:`ballot_reply`), or whose ``n_samples`` is
    below ``min_site_rows`` (checked here too: the server does not rely on the site
    obeying), is left out and recorded in ``abstained`` as ``{site: reason}``.

    Raises:
        ValueError: an invalid ballot (with ``on_error="raise"``, naming the site); every
            site abstained or was invalid.
    """
    ballots = []
    left_out: dict[str, str] = {}
    known: tuple[str, ...] | None = None
    for name, reply in replies.items():
        reason = reply.meta.get("abstain")
        n = reply.meta.get("n_samples")
        if reason is None and min_site_rows and isinstance(n, int) and n < min_site_rows:
            reason = f"{n} training rows, fewer than min_site_rows={min_site_rows}"
        if reason is not None:
            left_out[name] = str(reason)
            continue
        names = reply.meta.get("feature_names")
        try:
            if isinstance(names, list) and known is not None and len(names) == len(known) and tuple(names) == known:
                # the same columns as the previous ballot (the usual case): validated once
                ballot = replace(Ballot.build(reply.arrays.get("mask"), reply.arrays.get("scores"), n, None,
                                              site=name), feature_names=known)
                if ballot.n_features != len(known):
                    raise ValueError(f"site {name!r}: {len(known)} feature names for {ballot.n_features} mask entries")
            else:
                ballot = Ballot.build(reply.arrays.get("mask"), reply.arrays.get("scores"), n, names, site=name)
                known = ballot.feature_names
            ballots.append(ballot)
        except ValueError:
            if on_error == "raise":
                raise
    if abstained is not None:
        abstained.update(left_out)
    if not ballots:
        detail = "; ".join(f"site {s!r}: {r}" for s, r in left_out.items())
        raise ValueError("no valid ballots" + (f" (abstained: {detail})" if detail else ""))
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
    #: ``{site: reason}`` for sites that did not vote (they still learn the mask and train).
    abstained: dict[str, str] = field(default_factory=dict)

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
    min_site_rows: int = 0,
) -> ElectionOutcome:
    """Gather ballots (unless given), elect, and send the mask to every site.

    Two exchanges (``ballot``, ``set_mask``), one with ``ballots`` given. With
    ``describe=PART`` (e.g. ``"train"``) the ``set_mask`` exchange also gathers the
    training workflow's description of the elected features (``.described``), so a
    following ``run_training(..., described=outcome.described)`` skips its describe step.
    ``compat`` elects with a peer's server rule (see :mod:`fedtab.election.compat`).

    Sites with fewer than ``min_site_rows`` training rows, or whose training rows hold a
    single target value, abstain (``.abstained``); every site still receives the mask.
    """
    check_profile(compat, normalization)
    abstained: dict[str, str] = {}
    if ballots is None:
        ballots = gather_ballots(federation, selector, selectors=selectors, on_error=on_error,
                                 min_site_rows=min_site_rows, abstained=abstained)
    result = elect_from_ballots(ballots, freedom_degree, aggregation, normalization, compat)
    described = broadcast_mask(federation, result.selected_names, describe=describe)
    return ElectionOutcome(ballots, result, described, abstained)
