"""In-process engine: every site lives in this process; messages still cross a wire.

Each request and reply is serialised with :meth:`Message.to_bytes` and decoded again
(``wire=True``, the default), exactly as a real deployment would, so the in-process
run exercises the same validation and gives true byte counts for the traffic log.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Callable, Iterator, Mapping, Sequence

from fedtab.federation.protocol.messages import Message, MessageError
from ..federation.protocol import Federation, Traffic, check_min_sites
from fedtab.federation.site.core import Site

__all__ = ["LocalFederation"]


class LocalFederation(Federation):
    """Sites held in memory, asked one after another.

    Args:
        sites: the participating :class:`~fedtab.federation.site.core.Site` objects
            (names must be unique).
        wire: serialise every message through the wire format (slower by the cost of
            a ``bytes`` copy, but measures traffic and proves nothing relies on
            shared memory). A request broadcast to every site is serialised once;
            each site still decodes its own copy.
        timeout: seconds each site may take to answer one request (``None`` = no
            limit). With a limit the site's side runs in a daemon thread; a site that
            does not answer in time gets an error reply ("no reply within ...") and is
            never asked again (its thread may still be running).
        min_sites: quorum (see :mod:`fedtab.federation.protocol`): ``None`` = every
            site must answer every step; ``k`` = failing sites are dropped while ``k``
            remain.
        identities: when no site has an identity (``Site.identity``), give every site one
            from a consortium made in memory here, where the sites are built
            (:func:`fedtab.privacy.identity.provision`), so secure aggregation works
            without a deployment; :attr:`site_keys` is then that consortium's key list.
            ``False`` leaves the sites as they are.
        run_id: this federation's run (default: a fresh ``"local:<hex>"``): every site's
            ``Site.run_id`` is set to it, so the ledger's per-run caps count per federation —
            a new federation over the same sites is a new run, while their ε budget (and, with a
            state folder, their ledger file) carries over.

    Raises:
        ValueError: no sites, two sites with the same name, a bad timeout or quorum.
    """

    def __init__(self, sites: Sequence[Site], *, wire: bool = True, timeout: float | None = None,
                 min_sites: int | None = None, identities: bool = True, run_id: str | None = None) -> None:
        super().__init__()
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = None if timeout is None else float(timeout)
        self.min_sites = check_min_sites(min_sites)
        if self.min_sites is not None and self.min_sites > len(sites):
            raise ValueError(f"min_sites={self.min_sites} but only {len(sites)} site(s)")
        self._hung: set[str] = set()
        if not sites:
            raise ValueError("a federation needs at least one site")
        names = [s.name for s in sites]
        if len(set(names)) != len(names):
            raise ValueError(f"site names must be unique, got {names}")
        self._sites = {s.name: s for s in sites}
        #: the run the sites answer in (``Site.run_id``; see the ``run_id`` argument)
        self.run_id = str(run_id) if run_id is not None else f"local:{uuid.uuid4().hex[:16]}"
        for site in sites:
            site.run_id = self.run_id
        #: ``{site: identity-key fingerprint}`` of the consortium provisioned here (else ``None``)
        self.site_keys: dict[str, str] | None = None
        if identities and all(getattr(s, "identity", None) is None for s in sites):
            from ..privacy.identity import provision

            for name, identity in provision(names).items():
                self._sites[name].identity = identity
            self.site_keys = dict(next(iter(self._sites.values())).identity.key_list.fingerprints)
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
        return dict(self._replies(requests))

    def ask_each(self, requests: Mapping[str, Message]) -> Iterator[tuple[str, Message]]:
        """Ask the sites one after another, yielding each decoded reply before asking the next
        (a subclass that overrides :meth:`ask` is asked through it)."""
        if type(self).ask is not LocalFederation.ask:
            return iter(self.ask(requests).items())
        return self._replies(requests)

    def _replies(self, requests: Mapping[str, Message]) -> Iterator[tuple[str, Message]]:
        encoded: dict[int, bytes] = {}  # a broadcast sends one request object: serialise it once
        for name, request in requests.items():
            site = self._sites.get(name)
            if site is None:
                yield name, Message.error(f"no site called {name!r} in this federation")
                continue
            if name in self._hung:
                yield name, Message.error(f"site {name!r} did not answer an earlier request in time")
                continue
            if not self.wire:
                yield name, self._answer(name, lambda: site.handle(request))
                continue
            down = encoded.get(id(request))
            if down is None:
                down = encoded[id(request)] = request.to_bytes()
            up = self._answer(name, lambda: site.handle(Message.from_bytes(down)).to_bytes())
            if isinstance(up, Message):  # timed out or failed before reaching the wire
                yield name, up
                continue
            self.traffic.records.append(Traffic(name, request.kind, len(down), len(up)))
            try:
                reply = Message.from_bytes(up)
            except MessageError as exc:
                reply = Message.error(f"undecodable reply: {exc}")
            del up
            yield name, reply

    def _answer(self, name: str, work: Callable[[], object]) -> object:
        """Run the site's side of one exchange, within ``timeout`` when one is set."""
        t0, c0 = time.perf_counter(), time.process_time()
        if self.timeout is None:
            try:
                return work()
            except MessageError as exc:  # the reply could not be put on the wire
                return Message.error(f"site {name!r}: reply cannot be sent: {exc}")
            finally:
                self._clock(name, t0, c0)
        box: list[object] = []

        def run() -> None:
            try:
                box.append(work())
            except BaseException as exc:  # noqa: BLE001 - becomes the site's error reply
                box.append(Message.error(f"site {name!r}: {type(exc).__name__}: {exc}"))

        thread = threading.Thread(target=run, name=f"fedtab-site-{name}", daemon=True)
        thread.start()
        thread.join(min(self.timeout, threading.TIMEOUT_MAX))  # a huge timeout overflows the platform's wait
        self._clock(name, t0, c0)
        if thread.is_alive() or not box:
            self._hung.add(name)
            return Message.error(f"no reply within {self.timeout:g} s")
        return box[0]

    def _clock(self, name: str, t0: float, c0: float) -> None:
        self.site_seconds[name] = self.site_seconds.get(name, 0.0) + time.perf_counter() - t0
        self.site_cpu_seconds[name] = self.site_cpu_seconds.get(name, 0.0) + time.process_time() - c0
