"""In-process engine: every site lives in this process; messages still cross a wire.

Each request and reply is serialised with :meth:`Message.to_bytes` and decoded again
(``wire=True``, the default), exactly as a real deployment would, so the in-process
run exercises the same validation and gives true byte counts for the traffic log.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..federation.messages import Message
from ..federation.protocol import Federation, Traffic
from ..federation.site import Site

__all__ = ["LocalFederation"]


class LocalFederation(Federation):
    """Sites held in memory, asked one after another.

    Args:
        sites: the participating :class:`~fedtab.federation.site.Site` objects
            (names must be unique).
        wire: serialise every message through the wire format (slower by the cost of
            a ``bytes`` copy, but measures traffic and proves nothing relies on
            shared memory).

    Raises:
        ValueError: no sites, or two sites with the same name.
    """

    def __init__(self, sites: Sequence[Site], *, wire: bool = True) -> None:
        super().__init__()
        if not sites:
            raise ValueError("a federation needs at least one site")
        names = [s.name for s in sites]
        if len(set(names)) != len(names):
            raise ValueError(f"site names must be unique, got {names}")
        self._sites = {s.name: s for s in sites}
        self.wire = wire

    @property
    def sites(self) -> list[str]:
        return list(self._sites)

    def site(self, name: str) -> Site:
        """The in-memory site object called ``name``."""
        return self._sites[name]

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        replies: dict[str, Message] = {}
        for name, request in requests.items():
            site = self._sites.get(name)
            if site is None:
                replies[name] = Message.error(f"no site called {name!r} in this federation")
                continue
            if not self.wire:
                replies[name] = site.handle(request)
                continue
            down = request.to_bytes()
            reply = site.handle(Message.from_bytes(down))
            up = reply.to_bytes()
            self.traffic.records.append(Traffic(name, request.kind, len(down), len(up)))
            replies[name] = Message.from_bytes(up)
        return replies
