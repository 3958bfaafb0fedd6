"""The server's view of a federation: named sites that answer messages, and its errors.

Workflows (``fedtab.federation.workflows.election.server`` ...) are written against
:class:`Federation` only. Each engine (in-process, Flower, NVIDIA FLARE) provides a
subclass whose :meth:`Federation.ask` delivers one request per site and returns the
replies; nothing else in a workflow depends on the engine.

Every step of a workflow has the Flower shape: build requests on the server, let the
sites answer with a pure handler, then reduce the replies. :func:`exchange` is that
one path for every workflow: it sends the requests (with the agreed schema, see
:mod:`fedtab.federation.protocol.schema`), splits off error replies, wrong kinds and replies
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

import functools
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from fedtab.federation.protocol.errors import FederationError, QuorumError, SiteError, SiteRefused, reject_text
from fedtab.federation.protocol.messages import Message

if TYPE_CHECKING:
    from fedtab.federation.protocol.schema import Schema
    from .options import RunOptions
    from .summing import SummingStrategy

__all__ = ["Federation", "FederationError", "QuorumError", "SiteError", "SiteRefused", "Traffic", "TrafficLog",
           "check_min_sites", "set_quorum", "reject_text"]

log = logging.getLogger("fedtab.federation")






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
    """A set of named sites that a server-side workflow can talk to.

    :attr:`exchange_count` counts the request/reply exchanges (calls of :meth:`ask`, on
    every engine: each subclass's ``ask`` is wrapped once; a nested call through ``super()``
    counts once), whatever path sent them (:func:`exchange`, a broadcast, a secure sum's
    key exchange).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        each = cls.__dict__.get("ask_each")
        if each is not None and not getattr(each, "_counts_exchanges", False):
            @functools.wraps(each)
            def counted_each(self: "Federation", *args: Any, **kwargs: Any) -> Iterator[tuple[str, Message]]:
                if self.__dict__.get("_asking"):  # ask() built on ask_each counts once, in ask
                    return each(self, *args, **kwargs)
                self.exchange_count = self.__dict__.get("exchange_count", 0) + 1

                def run() -> Iterator[tuple[str, Message]]:
                    self.__dict__["_asking"] = True  # an ask() the stream falls back on is not counted again
                    try:
                        yield from each(self, *args, **kwargs)
                    finally:
                        self.__dict__["_asking"] = False

                return run()

            counted_each._counts_exchanges = True  # type: ignore[attr-defined]
            cls.ask_each = counted_each  # type: ignore[method-assign]
        ask = cls.__dict__.get("ask")
        if ask is None or getattr(ask, "_counts_exchanges", False):
            return

        @functools.wraps(ask)
        def counted(self: "Federation", *args: Any, **kwargs: Any) -> dict[str, Message]:
            if self.__dict__.get("_asking"):
                return ask(self, *args, **kwargs)
            self.__dict__["_asking"] = True
            self.exchange_count = self.__dict__.get("exchange_count", 0) + 1
            try:
                return ask(self, *args, **kwargs)
            finally:
                self.__dict__["_asking"] = False

        counted._counts_exchanges = True  # type: ignore[attr-defined]
        cls.ask = counted  # type: ignore[method-assign]

    def __init__(self) -> None:
        #: request/reply exchanges so far (see the class docstring)
        self.exchange_count = 0
        self.traffic = TrafficLog()
        #: the agreed schema (:func:`fedtab.federation.protocol.schema.agree_schema`), ``None`` until agreed
        self.schema: Schema | None = None
        #: quorum: ``None`` = every site must answer every step; ``k`` = drop failing sites while ``k`` remain
        self.min_sites: int | None = None
        #: sites left out of the rest of the run, with the reason (filled by :func:`exchange`)
        self.dropped: dict[str, str] = {}
        #: one ``{"step", "sites"}`` per :func:`exchange`: the sites whose reply was used
        self.participation: list[dict[str, Any]] = []
        #: sites that have not yet received the agreed schema (it rides on their next request)
        self._schema_pending: set[str] = set()
        #: the run's options (privacy, trust), chosen once (:func:`fedtab.federation.protocol.set_options`)
        self._options: RunOptions | None = None
        #: the run's summing strategy (plain or secure), made from the options on first use
        self._summing: SummingStrategy | None = None
        #: the run's privacy accountant (:class:`fedtab.privacy.accountant.PrivacyLedger`) when it has DP
        self.privacy_ledger: Any = None
        #: the bills of earlier accountants of this federation (workflows run apart, each its own budget)
        self.privacy_spent: list[dict[str, Any]] = []

    @property
    def options(self) -> "RunOptions":
        """The run's options (default: plain sums, no DP, plain reducers)."""
        if self._options is None:
            from .options import RunOptions

            self._options = RunOptions()
        return self._options

    @property
    def summing(self) -> "SummingStrategy":
        """How the quantities the server needs only as sums travel this run (one strategy per run)."""
        if self._summing is None:
            from .summing import strategy_for

            self._summing = strategy_for(self)
        return self._summing

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

    def ask_each(self, requests: Mapping[str, Message]) -> Iterator[tuple[str, Message]]:
        """Like :meth:`ask`, but yield ``(site, reply)`` one at a time, as each reply is decoded,
        so a server can validate and reduce a reply and drop it before the next one is held.

        The default calls :meth:`ask` (every reply held at once); an engine that decodes replies
        one by one overrides it (then its ``ask`` may be ``dict(self.ask_each(requests))``).
        One call is one exchange (:attr:`exchange_count`)."""
        return iter(self.ask(requests).items())

    def broadcast(self, request: Message, sites: list[str] | None = None) -> dict[str, Message]:
        """Send the same request to every active site (or the listed ones)."""
        return self.ask({s: request for s in (sites or self.active)})
