"""The server's view of a federation: named sites that answer messages.

Workflows (``fedtab.federation.election_flow`` ...) are written against
:class:`Federation` only. Each engine (in-process, Flower, NVIDIA FLARE) provides a
subclass whose :meth:`Federation.ask` delivers one request per site and returns the
replies; nothing else in a workflow depends on the engine.

Every step of a workflow has the Flower shape: build requests on the server, let the
sites answer with a pure handler, then reduce the replies with :func:`collect`, which
splits off error replies (naming the site) before anything is reduced.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Literal, Mapping

from .messages import Message

__all__ = ["Federation", "FederationError", "Traffic", "collect"]

log = logging.getLogger("fedtab.federation")


class FederationError(RuntimeError):
    """A federated step could not complete; the message names the site(s) at fault."""


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
        """Send the same request to every site (or the listed ones)."""
        return self.ask({s: request for s in (sites or self.sites)})


def collect(
    replies: Mapping[str, Message],
    expected_kind: str,
    on_error: Literal["raise", "skip"] = "raise",
) -> dict[str, Message]:
    """Split error replies off before reducing.

    Returns the good replies, in the order given. With ``on_error="raise"`` any error
    reply, or a reply of the wrong kind, raises :class:`FederationError` naming every
    failing site; with ``"skip"`` they are logged and left out (and if no site is left,
    :class:`FederationError` is raised).
    """
    good: dict[str, Message] = {}
    bad: dict[str, str] = {}
    for site, reply in replies.items():
        if reply.is_error:
            bad[site] = str(reply.meta.get("error", "unknown error"))
        elif reply.kind != expected_kind:
            bad[site] = f"replied {reply.kind!r} to a {expected_kind!r} request"
        else:
            good[site] = reply
    if bad:
        text = "; ".join(f"site {s!r}: {e}" for s, e in bad.items())
        if on_error == "raise":
            raise FederationError(f"{expected_kind} step failed at {len(bad)} site(s): {text}")
        log.warning("%s step: leaving out %d site(s): %s", expected_kind, len(bad), text)
    if not good:
        raise FederationError(f"{expected_kind} step: no site replied successfully")
    return good
