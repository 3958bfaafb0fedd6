"""Piggy-backing: one exchange carrying a second kind's request (issue 31: fewer exchanges).

A step whose request does not wait on the reply of the next one *rides* on it: it is packed
into the next request that goes out (:func:`ride`), the site answers the parts one after the
other, each exactly as if it had come alone, and one reply carries every part's answer. Engines
only move messages, so every engine gets it without a change.

Wire form (both sides):

* a fused request is the primary request with meta ``ride:parts`` = ``[{"kind", "meta"}, ...]``
  (the riders, answered *before* the primary, in order; ``"independent": true`` in a header marks
  a part nothing after it depends on) and each rider's arrays under ``ride<i>:<name>``;
* its reply is the primary's reply with meta ``ride:replies`` = ``[{"kind", "meta"}, ...]`` and
  each rider reply's arrays under ``ride<i>:<name>``.

Privacy: the site answers each part through its one release path (``Site.handle``: policy, part
floors, ledger and caps, DP terms, release gate, secure masking), so a fused request is refused,
charged and released exactly as its parts sent one by one, and a curious server gains nothing by
fusing. A part that fails or is refused stops the parts after it (they may depend on it: a ballot
over a table an imputation was to fill first); those get an error naming the failed part. An
*independent* part (a local baseline riding on a Newton iteration) stops nothing: its failure is
its own reply only. A part
may not itself carry riders.

Server side: :func:`ride` queues ``(requests, check, on_replies)``; the next
:func:`~fedtab.federation.protocol.exchange` takes the queue, fuses it into its requests, sorts each
rider's replies by its own validator and the federation's failure policy, and calls
``on_replies({site: reply})`` before the primary's replies are returned.
:func:`fedtab.federation.protocol.riders.flush` sends what is still queued on its own (one
exchange): a step that needs a rider's result before the next exchange, or the end of a job. This
module is the wire form and the queue (the exchange imports it); :mod:`~fedtab.federation.protocol.riders`
holds what sends or sums (it imports the exchange and the summing strategies).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from fedtab.federation.protocol.messages import Message

if TYPE_CHECKING:  # pragma: no cover
    from .exchange import Validator
    from .federation import Federation

__all__ = ["PARTS", "REPLIES", "Rider", "answer_parts", "fuse", "pending", "requeue", "ride", "split_reply", "split_request",
           "take"]

#: request meta: the riders' headers (answered before the primary)
PARTS = "ride:parts"
#: reply meta: the riders' replies' headers
REPLIES = "ride:replies"
#: the most riders one request may carry (a site refuses more)
MAX_PARTS = 8


def _prefix(i: int) -> str:
    return f"ride{i}:"


def _pack(primary: Message, parts: list[Message], key: str, independent: list[bool] | None = None) -> Message:
    arrays = dict(primary.arrays)
    headers = []
    for i, p in enumerate(parts):
        headers.append({"kind": p.kind, "meta": dict(p.meta), **({"independent": True} if independent and independent[i]
                                                                 else {})})
        arrays.update({_prefix(i) + k: v for k, v in p.arrays.items()})
    return Message(primary.kind, arrays, {**primary.meta, key: headers})


def _unpack(message: Message, key: str, flags: list[bool] | None = None) -> tuple[Message, list[Message]]:
    """``(primary, parts)`` of a packed message (``flags``, when given, gets each part's
    ``independent`` flag).

    Raises:
        ValueError: malformed headers, more than :data:`MAX_PARTS` parts, or arrays of no part.
    """
    headers = message.meta.get(key)
    if not isinstance(headers, list) or not 1 <= len(headers) <= MAX_PARTS:
        raise ValueError(f"{key} must be a list of 1 to {MAX_PARTS} parts")
    parts = []
    for i, h in enumerate(headers):
        if not isinstance(h, dict) or not isinstance(h.get("kind"), str) or not isinstance(h.get("meta"), dict):
            raise ValueError(f"{key}[{i}] must be an object with a kind and a meta object")
        if PARTS in h["meta"] or REPLIES in h["meta"]:
            raise ValueError("a riding part may not carry riders of its own")
        if h.get("independent", False) not in (True, False):
            raise ValueError(f"{key}[{i}].independent must be true or false")
        if flags is not None:
            flags.append(bool(h.get("independent", False)))
        pre = _prefix(i)
        parts.append(Message(h["kind"], {k[len(pre):]: v for k, v in message.arrays.items() if k.startswith(pre)},
                             h["meta"]))
    own = {k: v for k, v in message.arrays.items() if not k.startswith("ride")}
    if len(own) + sum(len(p.arrays) for p in parts) != len(message.arrays):
        raise ValueError("arrays that belong to no part")
    return Message(message.kind, own, {k: v for k, v in message.meta.items() if k != key}), parts


def fuse(primary: Message, riders: list[Message], independent: list[bool] | None = None) -> Message:
    """``primary`` carrying ``riders`` (answered before it, in order; ``independent[i]``: rider ``i``
    failing stops nothing after it)."""
    return _pack(primary, riders, PARTS, independent) if riders else primary


def split_request(request: Message, flags: list[bool] | None = None) -> tuple[Message, list[Message]]:
    """``(primary, riders)`` of a fused request (``ValueError`` when malformed); ``flags`` gets the
    riders' ``independent`` flags."""
    return _unpack(request, PARTS, flags)


def split_reply(reply: Message, n: int) -> tuple[Message, list[Message | None]]:
    """``(primary reply, [rider reply or None])`` of the reply to a request with ``n`` riders; a
    missing or malformed rider reply is ``None`` (the site is then at fault for that part)."""
    if n == 0 or REPLIES not in reply.meta:
        return reply, [None] * n
    try:
        primary, parts = _unpack(reply, REPLIES)
    except ValueError:
        return reply, [None] * n
    return primary, [*parts[:n], *[None] * (n - len(parts))][:n]


def answer_parts(request: Message, handle: Callable[[Message], Message]) -> Message:
    """The site side: answer a fused ``request`` part by part with ``handle`` (the site's one
    release path), riders first; a failed or refused part stops the parts after it. Never raises."""
    from fedtab.federation.protocol.schema import AGREED

    flags: list[bool] = []
    try:
        primary, riders = split_request(request, flags)
    except ValueError as exc:
        return Message.error(f"malformed fused request: {exc}")
    if AGREED in primary.meta:  # the agreed schema is stored by the first part answered
        riders[0] = Message(riders[0].kind, riders[0].arrays, {**riders[0].meta, AGREED: primary.meta[AGREED]})
        primary = Message(primary.kind, primary.arrays, {k: v for k, v in primary.meta.items() if k != AGREED})
    replies: list[Message] = []
    for part, independent in zip(riders, flags):
        reply = handle(part)
        replies.append(reply)
        if (reply.is_error or reply.is_refusal) and not independent:
            failed = Message.error(f"not answered: the riding {part.kind[:80]!r} part before it failed")
            return _pack(failed, replies, REPLIES)
    return _pack(handle(primary), replies, REPLIES)


@dataclass
class Rider:
    """A request riding on the next exchange: ``requests`` ``{site: message}``, its validator
    ``check(site, reply)`` and ``on_replies({site: validated reply})``; ``kind``/``step`` name it
    in errors and the participation record."""

    requests: Mapping[str, Message]
    check: "Validator | None"
    on_replies: Callable[[dict[str, Message]], Any]
    kind: str
    step: str | None = None
    independent: bool = False
    optional: bool = False


def _queue(federation: "Federation") -> list[Rider]:
    return federation.__dict__.setdefault("_riders", [])


def ride(federation: "Federation", requests: Message | Mapping[str, Message], check: "Validator | None",
         on_replies: Callable[[dict[str, Message]], Any], *, step: str | None = None,
         independent: bool = False, optional: bool = False) -> None:
    """Queue ``requests`` (one message for every active site, or ``{site: message}``) to ride on the
    next exchange; ``on_replies`` gets the validated replies right after it (see the module docstring).
    ``independent``: nothing after it depends on it (its failure at a site stops no later part there).
    ``optional``: the run does not need it (a request asked ahead to save an exchange): when any site
    refuses it, fails it or sends no answer to it, its answers are dropped with a warning naming the
    sites and ``on_replies`` is not called — no failure policy applies, no site is dropped."""
    if isinstance(requests, Message):
        requests = {s: requests for s in federation.active}
    if not requests:
        raise ValueError("nothing to ride: no site to ask")
    kind = next(iter(requests.values())).kind
    _queue(federation).append(Rider(dict(requests), check, on_replies, kind, step, independent or optional,
                                    optional))


def pending(federation: "Federation") -> bool:
    """Whether requests are queued to ride on the next exchange."""
    return bool(federation.__dict__.get("_riders"))


def take(federation: "Federation") -> list[Rider]:
    """The queued riders (the queue is emptied)."""
    riders = list(_queue(federation))
    federation.__dict__["_riders"] = []
    return riders


def requeue(federation: "Federation", riders: list[Rider]) -> None:
    """Put ``riders`` (from :func:`take`) back at the front of the queue, in their order."""
    federation.__dict__["_riders"] = [*riders, *_queue(federation)]
