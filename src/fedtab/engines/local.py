"""In-process engine: every site lives in this process; messages still cross a wire.

Each request and reply is serialised with :meth:`Message.to_bytes` and decoded again
(``wire=True``, the default), exactly as a real deployment would, so the in-process
run exercises the same validation and gives true byte counts for the traffic log.
"""

from __future__ import annotations

import time
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
            shared memory). A request broadcast to every site is serialised once;
            each site still decodes its own copy.

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
        #: wall seconds spent on each site's side so far (decoding the request, the
        #: handler, encoding the reply); the rest of a run's wall time is the server's.
        self.site_seconds: dict[str, float] = {}
        #: the same in CPU seconds of this process (robust to other load on the machine).
        self.site_cpu_seconds: dict[str, float] = {}

    @property
    def sites(self) -> list[str]:
        return list(self._sites)

    def site(self, name: str) -> Site:
        """The in-memory site object called ``name``."""
        return self._sites[name]

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        replies: dict[str, Message] = {}
        encoded: dict[int, bytes] = {}  # a broadcast sends one request object: serialise it once
        for name, request in requests.items():
            site = self._sites.get(name)
            if site is None:
                replies[name] = Message.error(f"no site called {name!r} in this federation")
                continue
            if not self.wire:
                t0, c0 = time.perf_counter(), time.process_time()
                replies[name] = site.handle(request)
                self._clock(name, t0, c0)
                continue
            down = encoded.get(id(request))
            if down is None:
                down = encoded[id(request)] = request.to_bytes()
            t0, c0 = time.perf_counter(), time.process_time()
            reply = site.handle(Message.from_bytes(down))
            up = reply.to_bytes()
            self._clock(name, t0, c0)
            self.traffic.records.append(Traffic(name, request.kind, len(down), len(up)))
            replies[name] = Message.from_bytes(up)
        return replies

    def _clock(self, name: str, t0: float, c0: float) -> None:
        self.site_seconds[name] = self.site_seconds.get(name, 0.0) + time.perf_counter() - t0
        self.site_cpu_seconds[name] = self.site_cpu_seconds.get(name, 0.0) + time.process_time() - c0
