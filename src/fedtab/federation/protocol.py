"""The server's view of a federation: named sites that answer messages.

Workflows (``fedtab.federation.election_flow`` ...) are written against
:class:`Federation` only. Each engine (in-process, Flower, NVIDIA FLARE) provides a
subclass whose :meth:`Federation.ask` delivers one request per site and returns the
replies; nothing else in a workflow depends on the engine.

Every step of a workflow has the Flower shape: build requests on the server, let the
sites answer with a pure handler, then reduce the replies. :func:`exchange` is that
one path for every workflow: it sends the requests (with the agreed schema, see
:mod:`fedtab.federation.schema`), splits off error replies, wrong kinds and replies
that fail the step's validator -- each named by its site, and only that site -- and
then either raises or drops those sites (the quorum, :attr:`Federation.min_sites`),
recording who took part (:attr:`Federation.participation`).

Failure policy: with ``min_sites=None`` (the default) every site must answer every
step, and any failure raises :class:`SiteError` naming the site(s). With
``min_sites=k`` a site that fails, times out or sends a rejected reply is dropped for
the rest of the run with a warning naming it and why; the run goes on while at least
``k`` sites remain and raises :class:`QuorumError` otherwise.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from .messages import Message, MessageError

if TYPE_CHECKING:
    from .schema import Schema

__all__ = ["Federation", "FederationError", "QuorumError", "SiteError", "SiteRefused", "Traffic", "collect",
           "exchange", "check_min_sites"]

log = logging.getLogger("fedtab.federation")


class FederationError(RuntimeError):
    """A federated step could not complete; the message names the site(s) at fault."""


class SiteError(FederationError):
    """One or more named sites failed or sent a reply that was rejected.

    Attributes:
        sites: ``{site: reason}`` of exactly the sites at fault (never an honest one).
    """

    def __init__(self, message: str, sites: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.sites = dict(sites or {})


class SiteRefused(SiteError):
    """One or more sites refused a request under their disclosure policy.

    Attributes:
        refusals: ``{site: reason}`` as the sites gave them (also ``sites``).
    """

    def __init__(self, text: str, refusals: Mapping[str, str]) -> None:
        super().__init__(text, refusals)
        self.refusals = dict(refusals)


class QuorumError(FederationError):
    """Fewer sites than the quorum (``min_sites``) are left to continue the run."""


def check_min_sites(min_sites: Any) -> int | None:
    """``min_sites`` as ``None`` (every site required) or a positive int; ``ValueError`` otherwise."""
    if min_sites is None:
        return None
    if isinstance(min_sites, bool) or not isinstance(min_sites, int) or min_sites < 1:
        raise ValueError(f"min_sites must be a positive integer (or None), got {min_sites!r}")
    return int(min_sites)


def set_quorum(federation: "Federation", min_sites: Any) -> None:
    """Set ``federation.min_sites`` when ``min_sites`` is given (``None`` keeps the federation's).

    Raises:
        ValueError: not a positive integer, or more than the federation's sites.
    """
    if min_sites is None:
        return
    k = check_min_sites(min_sites)
    assert k is not None
    if k > len(federation.sites):
        raise ValueError(f"min_sites={k} but the federation has {len(federation.sites)} site(s)")
    federation.min_sites = k


def reject_text(site: str, reason: str) -> str:
    """The one wording of a rejected reply: ``site 'x': reason``."""
    return f"site {site!r}: {reason}"


@dataclass
class Traffic:
    """Bytes and parameter counts moved by one request/reply exchange with one site."""

    site: str
    kind: str
    bytes_down: int
    bytes_up: int


@dataclass
class TrafficLog:
    """Everything a federation has moved so far (filled by engines that can measure it)."""

    records: list[Traffic] = field(default_factory=list)

    def total(self, kind: str | None = None) -> tuple[int, int]:
        """(bytes down, bytes up) summed over all sites, optionally for one message kind."""
        rows = [r for r in self.records if kind is None or r.kind == kind]
        return sum(r.bytes_down for r in rows), sum(r.bytes_up for r in rows)


class Federation(ABC):
    """A set of named sites that a server-side workflow can talk to."""

    def __init__(self) -> None:
        self.traffic = TrafficLog()
        #: the agreed schema (:func:`fedtab.federation.schema.agree_schema`), ``None`` until agreed
        self.schema: Schema | None = None
        #: quorum: ``None`` = every site must answer every step; ``k`` = drop failing sites while ``k`` remain
        self.min_sites: int | None = None
        #: sites left out of the rest of the run, with the reason (filled by :func:`exchange`)
        self.dropped: dict[str, str] = {}
        #: one ``{"step", "sites"}`` per :func:`exchange`: the sites whose reply was used
        self.participation: list[dict[str, Any]] = []
        #: sites that have not yet received the agreed schema (it rides on their next request)
        self._schema_pending: set[str] = set()

    @property
    def active(self) -> list[str]:
        """The sites still taking part (``sites`` minus ``dropped``), in the stable order."""
        return [s for s in self.sites if s not in self.dropped]

    def drop(self, site: str, reason: str) -> None:
        """Leave ``site`` out of the rest of the run (warning naming it and why).

        Raises:
            SiteError: no quorum is set (``min_sites=None``), so the run cannot go on without it.
            QuorumError: dropping it leaves fewer than ``min_sites`` sites.
        """
        text = reject_text(site, reason)
        if self.min_sites is None:
            raise SiteError(text, {site: reason})
        self.dropped[site] = reason
        log.warning("dropping %s", text)
        if len(self.active) < self.min_sites:
            raise QuorumError(f"{len(self.active)} site(s) left after dropping {text}; the quorum is {self.min_sites}")

    @property
    @abstractmethod
    def sites(self) -> list[str]:
        """Names of the participating sites, in a stable order."""

    @abstractmethod
    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        """Deliver ``requests[site]`` to each named site and return its reply.

        Replies may be error messages (``Message.is_error``); a site that did not answer
        is reported by an error reply too. Implementations must not raise for a single
        site's failure.
        """

    def broadcast(self, request: Message, sites: list[str] | None = None) -> dict[str, Message]:
        """Send the same request to every active site (or the listed ones)."""
        return self.ask({s: request for s in (sites or self.active)})


def collect(
    replies: Mapping[str, Message],
    expected_kind: str,
    on_error: Literal["raise", "skip"] = "raise",
) -> dict[str, Message]:
    """Split error replies and refusals off before reducing.

    Returns the good replies, in the order given. With ``on_error="raise"`` any error
    reply, or a reply of the wrong kind, raises :class:`FederationError` naming every
    failing site, and refusals (a site's disclosure policy declined the request) raise
    :class:`SiteRefused` naming each refusing site and its reason; with ``"skip"`` they
    are logged and left out (and if no site is left, :class:`FederationError` is raised).
    """
    good: dict[str, Message] = {}
    bad: dict[str, str] = {}
    refused: dict[str, str] = {}
    for site, reply in replies.items():
        if reply.is_refusal:
            refused[site] = str(reply.meta.get("reason", "no reason given"))
        elif reply.is_error:
            bad[site] = str(reply.meta.get("error", "unknown error"))
        elif reply.kind != expected_kind:
            bad[site] = f"replied {reply.kind!r} to a {expected_kind!r} request"
        else:
            good[site] = reply
    if refused:
        text = "; ".join(f"site {s!r} refused: {r}" for s, r in refused.items())
        if on_error == "raise" and not bad:
            raise SiteRefused(f"{expected_kind} step refused by {len(refused)} site(s): {text}", refused)
        log.warning("%s step: leaving out %d refusing site(s): %s", expected_kind, len(refused), text)
        if on_error == "raise":
            bad.update({s: f"refused: {r}" for s, r in refused.items()})
    if bad:
        text = "; ".join(f"site {s!r}: {e}" for s, e in bad.items())
        if on_error == "raise":
            raise FederationError(f"{expected_kind} step failed at {len(bad)} site(s): {text}")
        log.warning("%s step: leaving out %d site(s): %s", expected_kind, len(bad), text)
    if not good:
        raise FederationError(f"{expected_kind} step: no site replied successfully")
    return good


#: ``check(site, reply)`` validates one reply; it raises (``FederationError``/``ValueError``...) to reject it.
Validator = Callable[[str, Message], Any]

# what a validator may raise about a reply's *content*: the sending site is at fault
_REPLY_FAULTS = (FederationError, MessageError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                 OverflowError, RecursionError, ZeroDivisionError, FloatingPointError)


def exchange(
    federation: Federation,
    requests: Message | Mapping[str, Message],
    check: Validator | None = None,
    *,
    kind: str | None = None,
    step: str | None = None,
    on_error: Literal["raise", "skip"] | None = None,
) -> dict[str, Message]:
    """One request/reply exchange on the protocol path; every workflow step goes through it.

    Args:
        requests: one message for every active site, or ``{site: message}``.
        check: validator called as ``check(site, reply)`` on each reply *before* anything
            is reduced; raising rejects that reply (and only that site). Its return value
            is ignored.
        kind: the reply kind expected (default: the request's kind).
        step: name recorded in :attr:`Federation.participation` (default: ``kind``).
        on_error: ``"skip"`` drops failing sites for this call even without a quorum
            (the old per-call behaviour); ``"raise"`` or ``None`` follow the federation's
            policy (:attr:`Federation.min_sites`).

    Returns:
        ``{site: reply}`` of the sites whose reply passed, in request order.

    Raises:
        SiteError: a site failed or was rejected and no quorum lets the run go on
            (names exactly those sites).
        QuorumError: too few sites are left.
    """
    if isinstance(requests, Message):
        requests = {s: requests for s in federation.active}
    if not requests:
        raise QuorumError("no site is left to ask")
    from . import schema as _schema

    expected = kind or next(iter(requests.values())).kind
    schema = federation.schema
    declaring = schema is None
    if declaring:  # the first exchange of a run also agrees the schema (no extra round)
        flagged: dict[int, Message] = {}
        requests = {s: flagged.setdefault(id(m), Message(m.kind, m.arrays, {**m.meta, _schema.DECLARE: True}))
                    for s, m in requests.items()}
    elif federation._schema_pending:  # one message per distinct request, so a broadcast stays one
        attached: dict[int, Message] = {}
        requests = {s: (attached.setdefault(id(m), schema.attach(m)) if s in federation._schema_pending else m)
                    for s, m in requests.items()}
    replies = federation.ask(requests)
    if not declaring:
        federation._schema_pending.difference_update(s for s, r in replies.items() if not r.is_error)
    arrived: dict[str, Message] = {}
    bad: dict[str, str] = {}
    refusals: dict[str, str] = {}
    for site in requests:
        reply = replies.get(site)
        if reply is None:
            bad[site] = "no reply"
        elif reply.is_refusal:  # the site's disclosure policy declined: reported by name, never reduced
            refusals[site] = str(reply.meta.get("reason", "no reason given"))[:2000]
            bad[site] = f"refused: {refusals[site]}"
        elif reply.is_error:
            bad[site] = str(reply.meta.get("error", "unknown error"))[:2000]
        elif reply.kind != expected:
            bad[site] = f"replied {reply.kind[:80]!r} to a {expected!r} request"
        else:
            arrived[site] = reply
    if declaring:
        limits = getattr(federation, "schema_limits", None) or _schema.SchemaLimits()
        declared, refused = _schema.declarations_from(arrived, limits)
        bad.update(refused)
        arrived = {s: r for s, r in arrived.items() if s in declared}
        if declared:
            _schema.set_schema(federation, _schema.Schema.from_declarations(declared, limits))
    good: dict[str, Message] = {}
    for site, reply in arrived.items():
        if check is None:
            good[site] = reply
            continue
        try:
            check(site, reply)
        except SiteError as exc:
            bad[site] = str(exc).removeprefix(f"site {site!r}: ")
        except _REPLY_FAULTS as exc:
            text = str(exc).removeprefix(f"site {site!r}: ")
            bad[site] = text if isinstance(exc, (FederationError, ValueError)) else f"{type(exc).__name__}: {text}"
        else:
            good[site] = reply
    bad = {s: bad[s] for s in requests if s in bad}
    if bad:
        text = "; ".join(reject_text(s, e) for s, e in bad.items())
        if on_error == "skip":
            log.warning("%s step: leaving out %d site(s): %s", expected, len(bad), text)
        elif federation.min_sites is None:
            if set(bad) == set(refusals):
                text = "; ".join(f"site {s!r} refused: {r}" for s, r in refusals.items())
                raise SiteRefused(f"{expected} step refused by {len(refusals)} site(s): {text}", refusals)
            raise SiteError(f"{expected} step failed at {len(bad)} site(s): {text}", bad)
        else:
            for s, e in bad.items():
                federation.dropped[s] = e
            log.warning("%s step: dropping %d site(s): %s", expected, len(bad), text)
            if len(good) < federation.min_sites:
                raise QuorumError(f"{expected} step: {len(good)} site(s) answered, the quorum is "
                                  f"{federation.min_sites} ({text})")
    if not good:
        raise QuorumError(f"{expected} step: no site replied successfully")
    federation.participation.append({"step": step or expected, "sites": list(good)})
    return good
