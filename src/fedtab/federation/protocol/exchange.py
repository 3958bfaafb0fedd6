"""The one server path: every exchange of every workflow goes through :func:`exchange`.

Every step of a workflow has the Flower shape: build requests on the server, let the
sites answer with a pure handler, then reduce the replies. :func:`exchange` is that
one path: it sends the requests (with the agreed schema, see
:mod:`fedtab.federation.protocol.schema`), splits off error replies, wrong kinds and replies
that fail the step's validator -- each named by its site, and only that site -- and
then either raises or drops those sites (the quorum, :attr:`Federation.min_sites`),
recording who took part (:attr:`Federation.participation`). Quantities the server needs
only as sums go through :func:`exchange_sums`, which hands them to the run's summing
strategy (:mod:`fedtab.federation.protocol.summing`) and follows the same rules.

Failure policy: with ``min_sites=None`` (the default) every site must answer every
step, and any failure raises :class:`SiteError` naming the site(s). With
``min_sites=k`` a site that fails, times out or sends a rejected reply is dropped for
the rest of the run with a warning naming it and why; the run goes on while at least
``k`` sites remain and raises :class:`QuorumError` otherwise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from fedtab.federation.protocol.messages import Message, MessageError
from .errors import FederationError, QuorumError, SiteError, SiteRefused, reject_text

if TYPE_CHECKING:  # pragma: no cover
    from .federation import Federation
    from .summing import SumSpec, Summed

__all__ = ["exchange", "exchange_sums", "Validator"]

log = logging.getLogger("fedtab.federation")


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
    fold: Callable[[str, Message], Message] | None = None,
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
        fold: ``fold(site, reply) -> kept`` is called on each reply that passed ``check``, as it
            passes (arrival order), and what it returns is kept in its place: a streaming
            reduction adds the reply's arrays into running sums and keeps the reply without them,
            so the server never holds all K replies' arrays.

    Returns:
        ``{site: reply}`` of the sites whose reply passed (as ``fold`` returned it), in request order.

    Raises:
        SiteError: a site failed or was rejected and no quorum lets the run go on
            (names exactly those sites).
        QuorumError: too few sites are left.
    """
    requests = _addressed(federation, requests)
    from fedtab.federation.protocol import schema as _schema

    expected = kind or next(iter(requests.values())).kind
    declaring = federation.schema is None
    requests = _with_schema_flags(federation, requests, declaring)
    from . import piggyback

    riders = piggyback.take(federation)  # queued requests ride on this one (answered before it)
    if riders:
        requests = {s: piggyback.fuse(m, [r.requests[s] for r in riders if s in r.requests],
                                      [r.independent for r in riders if s in r.requests])
                    for s, m in requests.items()}
    parts: dict[str, list[Message | None]] = {}
    held: list[tuple[str, Message]] = []
    # replies are taken one at a time as the engine decodes them: each is classified, its
    # declaration parsed (names kept once, in the shared declared tuple) and validated before the
    # next is held -- never all K decoded replies with their names at once
    sorting = _Sorting(check, expected, declaring,
                       (getattr(federation, "schema_limits", None) or _schema.SchemaLimits()) if declaring else None,
                       fold)
    seen: set[str] = set()
    for site, reply in federation.ask_each(requests):
        if site not in requests or site in seen:
            continue
        seen.add(site)
        if riders:
            asked = [r for r in riders if site in r.requests]
            reply, parts[site] = piggyback.split_reply(reply, len(asked))
        if not declaring and not reply.is_error:
            federation._schema_pending.discard(site)
        if riders and not declaring:  # the riders' replies are reduced first: the primary's validator may use them
            held.append((site, reply))
        else:
            sorting.sort(site, reply)
    for site in requests:
        if site not in seen:
            sorting.bad[site] = "no reply"
    for i, rider in enumerate(riders):
        _rider_replies(federation, rider, i, riders, parts, on_error)
    for site, reply in held:
        sorting.sort(site, reply)
    if declaring:
        sorting.agree_schema(federation)
    good = {s: sorting.good[s] for s in requests if s in sorting.good}
    bad = {s: sorting.bad[s] for s in requests if s in sorting.bad}
    if bad:
        _apply_failure_policy(federation, expected, good, bad, sorting.refusals, on_error)
    if not good:
        raise QuorumError(f"{expected} step: no site replied successfully")
    federation.participation.append({"step": step or expected, "sites": list(good)})
    return good


def _rider_replies(federation: Federation, rider: Any, i: int, riders: list[Any],
                   parts: Mapping[str, list[Message | None]], on_error: Literal["raise", "skip"] | None) -> None:
    """Sort rider ``i``'s replies (out of ``parts``, ``{site: [reply per rider it was sent]}``) by its
    own validator and the failure policy, record its participation, hand the good ones to it."""
    sorting = _Sorting(rider.check, rider.kind, False, None)
    for site in rider.requests:
        if site not in parts:
            sorting.bad[site] = "no reply"
            continue
        j = sum(1 for r in riders[:i] if site in r.requests)
        reply = parts[site][j]
        if reply is None:
            sorting.bad[site] = f"sent no reply to the riding {rider.kind!r} part"
        else:
            sorting.sort(site, reply)
    good = {s: sorting.good[s] for s in rider.requests if s in sorting.good}
    bad = {s: sorting.bad[s] for s in rider.requests if s in sorting.bad}
    if bad and rider.optional:  # asked ahead only to save an exchange: go on without it
        log.warning("the riding %r part is not used: %s", rider.kind,
                    "; ".join(f"site {s!r}: {why}" for s, why in bad.items()))
        return
    if bad:
        _apply_failure_policy(federation, rider.kind, good, bad, sorting.refusals, on_error)
    if not good:
        raise QuorumError(f"{rider.kind} step: no site replied successfully")
    federation.participation.append({"step": rider.step or rider.kind, "sites": list(good)})
    rider.on_replies(good)


def _addressed(federation: Federation, requests: Message | Mapping[str, Message]) -> Mapping[str, Message]:
    """``{site: request}``: one message broadcast to every active site, or ``requests`` as given.

    Raises:
        QuorumError: no site to ask.
    """
    if isinstance(requests, Message):
        requests = {s: requests for s in federation.active}
    if not requests:
        raise QuorumError("no site is left to ask")
    return requests


def _with_schema_flags(federation: Federation, requests: Mapping[str, Message], declaring: bool
                       ) -> Mapping[str, Message]:
    """``requests`` with the schema flags of this exchange: on the first exchange of a run
    (``declaring``) each asks for the site's declaration (no extra round); later, a site still
    waiting for the agreed schema gets it attached. One message per distinct request (a broadcast
    stays one; sites that declared the same columns share one); the other requests are unchanged."""
    from fedtab.federation.protocol import schema as _schema

    if declaring:
        flagged: dict[int, Message] = {}
        return {s: flagged.setdefault(id(m), Message(m.kind, m.arrays, {**m.meta, _schema.DECLARE: True}))
                for s, m in requests.items()}
    if not federation._schema_pending:
        return requests
    schema = federation.schema
    assert schema is not None
    attached: dict[tuple[int, int], Message] = {}
    out: dict[str, Message] = {}
    for s, m in requests.items():
        if s not in federation._schema_pending:
            out[s] = m
            continue
        key = (id(m), id(schema._site_meta(s)))
        if key not in attached:
            attached[key] = schema.attach(m, s)
        out[s] = attached[key]
    return out


@dataclass
class _Sorting:
    """The replies of one exchange sorted as they arrive: ``good`` (validated), ``bad`` (``{site:
    reason}``: errors, refusals, wrong kinds, rejected replies), ``refusals`` (``{site: the policy's
    reason}``, also in ``bad``). On the schema-declaring exchange a reply's declaration is parsed at
    once and the reply ``held`` (declaration stripped) until :meth:`agree_schema` has run."""

    check: Validator | None
    expected: str
    declaring: bool
    limits: Any  # the run's SchemaLimits when declaring, else None
    fold: Callable[[str, Message], Message] | None = None  # see exchange()
    good: dict[str, Message] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)
    held: dict[str, Message] = field(default_factory=dict)
    declarations: dict[str, Any] = field(default_factory=dict)
    validated: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)

    def sort(self, site: str, reply: Message) -> None:
        """File one reply under ``refusals``/``bad``, ``held`` (declaring) or, once validated, ``good``."""
        from fedtab.federation.protocol import schema as _schema

        if reply.is_refusal:  # the site's disclosure policy declined: reported by name, never reduced
            self.refusals[site] = str(reply.meta.get("reason", "no reason given"))[:2000]
            self.bad[site] = f"refused: {self.refusals[site]}"
        elif reply.is_error:
            self.bad[site] = str(reply.meta.get("error", "unknown error"))[:2000]
        elif reply.kind != self.expected:
            self.bad[site] = f"replied {reply.kind[:80]!r} to a {self.expected!r} request"
        elif self.declaring:
            self._hold(site, reply)
        elif _schema.DECLARED in reply.meta:
            self.bad[site] = "sent a schema declaration in a later message (column names go only in the first exchange)"
        else:
            _check_one(self.check, site, reply, self.good, self.bad, self.fold)

    def _hold(self, site: str, reply: Message) -> None:
        """Parse a declaring reply's schema declaration and hold the reply without it (its names
        now live once, in the declaration); an invalid declaration goes to ``bad``."""
        from fedtab.federation.protocol import schema as _schema

        try:
            self.declarations[site] = _schema.parse_declaration(reply.meta.get(_schema.DECLARED), self.limits,
                                                                self.validated)
        except ValueError as exc:
            self.bad[site] = f"invalid schema declaration: {exc}"
        else:
            self.held[site] = _without(reply, _schema.DECLARED)

    def agree_schema(self, federation: Federation) -> None:
        """Settle the target, set the run's schema from the valid declarations, then validate the
        held replies of the sites whose declaration stands (the others stay in ``bad``)."""
        from fedtab.federation.protocol import schema as _schema

        _schema.settle_target(self.declarations, self.bad)
        if self.declarations:
            _schema.set_schema(federation, _schema.Schema.from_declarations(self.declarations, self.limits))
        for site in list(self.held):
            reply = self.held.pop(site)
            if site in self.declarations:
                _check_one(self.check, site, reply, self.good, self.bad, self.fold)


def _apply_failure_policy(federation: Federation, expected: str, good: Mapping[str, Message],
                          bad: Mapping[str, str], refusals: Mapping[str, str],
                          on_error: Literal["raise", "skip"] | None) -> None:
    """The quorum rules for the failed sites ``bad`` (non-empty): ``on_error="skip"`` only warns;
    without a quorum raise; with one, drop them (:attr:`Federation.dropped`) and warn.

    Raises:
        SiteRefused: no quorum and every failed site refused (naming them and their reasons).
        SiteError: no quorum and some site failed (naming each).
        QuorumError: fewer than ``federation.min_sites`` sites remain.
    """
    text = "; ".join(reject_text(s, e) for s, e in bad.items())
    if on_error == "skip":
        log.warning("%s step: leaving out %d site(s): %s", expected, len(bad), text)
    elif federation.min_sites is None:
        if set(bad) == set(refusals):
            text = "; ".join(f"site {s!r} refused: {r}" for s, r in refusals.items())
            raise SiteRefused(f"{expected} step refused by {len(refusals)} site(s): {text}", dict(refusals))
        raise SiteError(f"{expected} step failed at {len(bad)} site(s): {text}", dict(bad))
    else:
        for s, e in bad.items():
            federation.dropped[s] = e
        log.warning("%s step: dropping %d site(s): %s", expected, len(bad), text)
        if len(good) < federation.min_sites:
            raise QuorumError(f"{expected} step: {len(good)} site(s) answered, the quorum is "
                              f"{federation.min_sites} ({text})")


def _without(reply: Message, key: str) -> Message:
    """``reply`` without meta ``key`` (a new message sharing the arrays; the reply itself is not changed)."""
    out = Message.__new__(Message)
    out.kind, out.arrays, out.meta = reply.kind, reply.arrays, {k: v for k, v in reply.meta.items() if k != key}
    return out


def _check_one(check: Validator | None, site: str, reply: Message, good: dict[str, Message],
               bad: dict[str, str], fold: Callable[[str, Message], Message] | None = None) -> None:
    """Validate one reply into ``good`` (through ``fold``, see :func:`exchange`) or its reason into
    ``bad`` (the site named once, by the caller)."""
    if check is not None:
        try:
            check(site, reply)
        except SiteError as exc:
            bad[site] = str(exc).removeprefix(f"site {site!r}: ")
            return
        except _REPLY_FAULTS as exc:
            text = str(exc).removeprefix(f"site {site!r}: ")
            bad[site] = text if isinstance(exc, (FederationError, ValueError)) else f"{type(exc).__name__}: {text}"
            return
    good[site] = fold(site, reply) if fold is not None else reply


def exchange_sums(
    federation: Federation,
    requests: Message | Mapping[str, Message],
    spec: "SumSpec",
    check: Validator | None = None,
    *,
    check_total: Callable[[Mapping[str, Any], list[str]], Any] | None = None,
    kind: str | None = None,
    step: str | None = None,
    on_error: Literal["raise", "skip"] | None = None,
) -> "Summed":
    """One exchange whose ``spec`` arrays the server needs only summed, on the run's strategy.

    With plain sums (the default) this is :func:`exchange` — ``check`` sees each whole
    reply — followed by the server's sum. With secure sums (``federation.options`` with
    ``secure_aggregation``) the arrays travel masked and ``check`` sees what each site sent
    in the clear. Either way ``check_total(sums, sites)`` then validates the totals (raise
    ``ValueError``); the quorum and the participation record follow :func:`exchange`'s rules
    (``on_error="skip"``: leave failing sites out of this exchange even without a quorum).

    Raises:
        SiteError: a site failed or was rejected and no quorum lets the run go on.
        QuorumError: too few sites are left.
        FederationError: the totals failed ``check_total`` (the sites cannot be told apart).
    """
    requests = _addressed(federation, requests)
    expected = kind or next(iter(requests.values())).kind
    summed = federation.summing.exchange(federation, requests, spec, check, kind=expected, step=step,
                                         on_error=on_error)
    if check_total is not None:
        try:
            check_total(summed.sums, summed.sites)
        except (ValueError, TypeError, KeyError) as exc:
            raise FederationError(f"{expected} step: the summed values are implausible ({exc})") from None
    return summed
