"""Summing strategies: how the quantities the server needs only as sums travel, once per run.

A workflow step that needs sums (feature moments, model updates, evaluation counts,
imputation statistics) describes them once (:class:`SumSpec`) and calls
:func:`fedtab.federation.protocol.exchange_sums`; the run's strategy
(``federation.summing``, chosen from its options) decides how the sums travel:

* :class:`PlainSums` — every site sends its values; they are validated per site on the one
  server path (:func:`~fedtab.federation.protocol.exchange`) and added up here. Robust
  reducers, which need each site's values, read :attr:`Summed.replies`.
* :class:`SecureSums` — the values travel masked (:class:`fedtab.federation.protocol.secure_aggregator.SecureAggregator`,
  one session per run): the server learns only their sum over the surviving sites; the
  replies' other contents are validated per site, the totals by ``check_total``.

Differential privacy is not a strategy of its own: the noise is drawn at each site on its
own terms (``Site.dp_terms``) before any masking, so it composes with either strategy.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from fedtab.federation.protocol.messages import Message
from .errors import FederationError, QuorumError, SiteError, reject_text

if TYPE_CHECKING:  # pragma: no cover
    from .federation import Federation
    from .secure_aggregator import SecureAggregator

__all__ = ["SumSpec", "Summed", "SummingStrategy", "PlainSums", "SecureSums", "strategy_for", "SECURE_SUM", "PLAIN_SUM"]

log = logging.getLogger("fedtab.federation")

#: the key under which a securely summed reply stands in for the per-site replies
SECURE_SUM = "(secure sum)"
#: the key under which a streamed plain sum stands in for the per-site replies (:attr:`SumSpec.stream`)
PLAIN_SUM = "(plain sum)"

#: ``check(site, reply)``: raises to reject one site's reply (its contents sent in the clear)
Check = Callable[[str, Message], Any]
#: ``check_total(sums, sites)``: raises ``ValueError`` when the totals are implausible
TotalCheck = Callable[[Mapping[str, np.ndarray], list[str]], Any]


@dataclass(frozen=True)
class SumSpec:
    """The reply arrays a step needs only summed.

    Attributes:
        fields: ``{array: fixed-point fractional bits}`` for secure sums (``None`` = the
            aggregator's default; ``0`` for integer counts).
        weighted: arrays multiplied by the reply meta value ``weight`` before summing
            (the weight is summed too: :attr:`Summed.weight`).
        weight: the reply meta key of the weight (e.g. ``"n_samples"``), or ``None``.
        drop_meta: reply meta keys the sites must not send when the sums are secure (a
            per-site detail that would defeat the sum, e.g. a per-site sample count).
        stream: plain sums are running sums: each reply's arrays are added once it has passed
            its check and every earlier site's reply is in (request order: the same float sums as
            without streaming, on every engine), and not kept (:attr:`Summed.replies` without them;
            :attr:`Summed.parts` the one total, as with secure sums), so the server holds the
            replies that arrived early, not K. For a step whose reduction needs only the total;
            the robust wrapper turns it off.
    """

    fields: Mapping[str, int | None]
    weighted: tuple[str, ...] = ()
    weight: str | None = None
    drop_meta: tuple[str, ...] = ()
    stream: bool = False


@dataclass
class Summed:
    """What a summed exchange gives the server.

    Attributes:
        sums: ``{array: summed array}`` (float64).
        weight: the summed weight (``None`` without one).
        replies: per site, what it sent in the clear: the whole reply with plain sums, the
            reply without the summed arrays with secure sums.
        sites: the sites whose values are in the sums.
        secure: whether the sums travelled masked (per-site values unknown to the server).
        parts: what a reduction pools: each site's reply (plain sums; the same as
            ``replies``), or the one total ``{SECURE_SUM: Message(sums)}`` (secure sums).
    """

    sums: dict[str, np.ndarray]
    weight: float | None
    replies: dict[str, Message]
    sites: list[str]
    secure: bool = False
    dropped: list[str] = field(default_factory=list)
    parts: dict[str, Message] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.parts:
            self.parts = ({SECURE_SUM: Message(SECURE_SUM, dict(self.sums))} if self.secure else dict(self.replies))


class SummingStrategy(ABC):
    """How one run's sums travel (see the module docstring)."""

    secure: bool = False

    @abstractmethod
    def exchange(self, federation: Federation, requests: Mapping[str, Message], spec: SumSpec,
                 check: Check | None, *, kind: str, step: str | None, on_error: str | None = None) -> Summed:
        """One exchange whose ``spec`` arrays are summed (see :func:`exchange_sums`)."""


def _add_reply(sums: dict[str, np.ndarray], reply: Message, spec: SumSpec) -> float:
    """Add ``reply``'s ``spec`` arrays into ``sums`` (float64; weighted ones times its weight);
    returns its weight (1.0 without one)."""
    w = float(reply.meta[spec.weight]) if spec.weight is not None else 1.0
    for name in spec.fields:
        value = np.asarray(reply.arrays[name], dtype=np.float64)
        value = value * w if name in spec.weighted else value
        sums[name] = value if name not in sums else sums[name] + value
    return w


def _plain_sums(replies: Mapping[str, Message], spec: SumSpec) -> tuple[dict[str, np.ndarray], float | None]:
    sums: dict[str, np.ndarray] = {}
    total = 0.0 if spec.weight is not None else None
    for reply in replies.values():
        w = _add_reply(sums, reply, spec)
        if total is not None:
            total += w
    return sums, total


class PlainSums(SummingStrategy):
    """Every site's values in the clear, validated per site, added up by the server."""

    def exchange(self, federation: Federation, requests: Mapping[str, Message], spec: SumSpec,
                 check: Check | None, *, kind: str, step: str | None, on_error: str | None = None) -> Summed:
        from .exchange import exchange

        def checked(site: str, reply: Message) -> None:
            missing = [n for n in spec.fields if n not in reply.arrays]
            if missing:
                raise ValueError(f"reply lacks the summed array(s) {missing[:3]}")
            if spec.weight is not None:
                w = reply.meta.get(spec.weight)
                if isinstance(w, bool) or not isinstance(w, (int, float)) or not np.isfinite(w) or w < 0:
                    raise ValueError(f"{spec.weight} must be a non-negative number")
            if check is not None:
                check(site, reply)

        if not spec.stream:
            replies = exchange(federation, dict(requests), checked, kind=kind, step=step, on_error=on_error)
            sums, weight = _plain_sums(replies, spec)
            return Summed(sums, weight, dict(replies), list(replies))
        sums = _InOrder(list(requests), spec)
        replies = exchange(federation, dict(requests), checked, kind=kind, step=step, on_error=on_error,
                           fold=sums.fold)
        sums.flush()
        return Summed(sums.running, sums.weight if spec.weight is not None else None, dict(replies), list(replies),
                      parts={PLAIN_SUM: Message(PLAIN_SUM, dict(sums.running))})


class _InOrder:
    """Running sums of streamed replies, added in request order whatever order they arrive in (the
    same float operations as summing the held replies, so the same bits on every engine): a reply
    that arrives before an earlier site's waits until that one is added or the exchange ends; a
    failing site's place is skipped at :meth:`flush`."""

    def __init__(self, order: list[str], spec: SumSpec) -> None:
        self.order, self.spec, self.next = order, spec, 0
        self.waiting: dict[str, Message] = {}
        self.running: dict[str, np.ndarray] = {}
        self.weight = 0.0

    def fold(self, site: str, reply: Message) -> Message:
        """Take ``reply`` (checked); return it without the summed arrays."""
        self.waiting[site] = reply
        while self.next < len(self.order) and self.order[self.next] in self.waiting:
            self.weight += _add_reply(self.running, self.waiting.pop(self.order[self.next]), self.spec)
            self.next += 1
        out = Message.__new__(Message)
        out.kind, out.meta = reply.kind, reply.meta
        out.arrays = {k: v for k, v in reply.arrays.items() if k not in self.spec.fields}
        return out

    def flush(self) -> None:
        """Add the replies still waiting (behind sites that failed), in request order."""
        for site in self.order[self.next:]:
            if site in self.waiting:
                self.weight += _add_reply(self.running, self.waiting.pop(site), self.spec)
        self.next = len(self.order)


class SecureSums(SummingStrategy):
    """Masked values (one secure-aggregation session per run); only sums reach the server."""

    secure = True

    def __init__(self, federation: Federation) -> None:
        from .secure_aggregator import SecureAggregator

        self.aggregator: SecureAggregator = SecureAggregator(federation)

    def exchange(self, federation: Federation, requests: Mapping[str, Message], spec: SumSpec,
                 check: Check | None, *, kind: str, step: str | None, on_error: str | None = None) -> Summed:
        if federation.schema is None:  # replies are validated against the agreed schema: agree it first
            from fedtab.federation.protocol.agreement import agree_schema

            agree_schema(federation)
        peers = self.aggregator.peers  # the key exchange (first call)
        requests = {s: r for s, r in requests.items() if s in peers}
        try:
            summed = self.aggregator.ask(requests, kind, dict(spec.fields), weighted=spec.weighted, weight=spec.weight,
                                         drop_meta=spec.drop_meta,
                                         on_error="skip" if on_error == "skip" else "raise")  # quorum: drops, naming why
        except SiteError:
            raise
        except FederationError as exc:
            if isinstance(exc, QuorumError):
                raise
            raise SiteError(str(exc)) from None
        for site in summed.dropped:
            if site not in federation.dropped and federation.min_sites is not None:
                federation.drop(site, f"{kind}: no masked reply in the secure sum")
        for site in getattr(summed, "late", ()):  # its value is in this sum; it takes no further part
            if site not in federation.dropped and federation.min_sites is not None:
                federation.drop(site, f"{kind}: did not answer the unmasking of the secure sum")
        if federation.min_sites is not None and len(summed.survivors) < federation.min_sites:
            raise QuorumError(f"{kind} step: {len(summed.survivors)} site(s) in the secure sum, the quorum is "
                              f"{federation.min_sites}")
        if check is not None:  # the clear parts: a bad one cannot be taken out of a sum already made
            bad = {}
            for site, reply in summed.replies.items():
                try:
                    check(site, reply)
                except (FederationError, ValueError, TypeError, KeyError, IndexError) as exc:
                    bad[site] = str(exc).removeprefix(f"site {site!r}: ")
            if bad:
                text = "; ".join(reject_text(s, e) for s, e in bad.items())
                raise SiteError(f"{kind} step (secure sum) failed at {len(bad)} site(s): {text}", bad)
        sums = {k: np.asarray(v, dtype=np.float64) for k, v in summed.sums.items() if k in spec.fields}
        return Summed(sums, summed.weight, dict(summed.replies), list(summed.survivors), secure=True,
                      dropped=list(summed.dropped))


def strategy_for(federation: Federation) -> SummingStrategy:
    """The summing strategy of ``federation``'s options."""
    return SecureSums(federation) if federation.options.secure else PlainSums()
