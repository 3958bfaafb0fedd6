"""Riders that send or sum: :func:`flush` (send what is queued, alone), :func:`plain_run` (may a
summed step ride?) and :func:`ride_step` (a summed step riding in its per-site plain form).

The wire form and the queue are :mod:`fedtab.federation.protocol.piggyback` (imported by the
exchange); this module sits above the exchange and the summing strategies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from fedtab.federation.protocol.messages import Message

from .exchange import exchange
from .modes import BaseSums, run_strategy
from .piggyback import requeue, ride, take
from .summing import PlainSums, Summed, _plain_sums

if TYPE_CHECKING:  # pragma: no cover
    from .federation import Federation

__all__ = ["flush", "plain_run", "ride_step"]


def flush(federation: "Federation") -> None:
    """Send the queued riders now, in one exchange (the last one as the primary, the others riding
    on it); nothing when none is queued."""
    riders = take(federation)
    if not riders:
        return
    last = riders.pop()
    requeue(federation, riders)  # they ride on the last one's exchange
    last.on_replies(exchange(federation, dict(last.requests), last.check, step=last.step))


def plain_run(federation: "Federation") -> bool:
    """Whether the run sums in plain (no secure sums, no DP, no robust reducers): only then may a
    summed or per-site scored step ride on another exchange (else it keeps its own)."""
    return federation.options.dp is None and type(run_strategy(federation)) is BaseSums \
        and type(federation.summing) is PlainSums


def ride_step(federation: "Federation", step: Any, on_result: Callable[[Any], Any], *, independent: bool = False) -> bool:
    """Queue a summed step (:class:`~fedtab.federation.protocol.modes.SumStep`) to ride on the next
    exchange in its per-site plain form: each reply checked as the plain summing strategy checks it,
    then summed and reduced by the step's ``aggregate``; ``on_result(result)`` gets the reduction.

    ``independent``: its failure at a site stops no later part there (:func:`~.piggyback.ride`).

    Returns ``False`` (nothing queued) when the run's strategy is not plain sums (secure sums, DP or
    robust reducers move or reduce the values otherwise: the step then needs its own exchange)."""
    if not plain_run(federation):
        return False
    fields = step.spec.fields

    def check(site: str, reply: Message) -> None:
        missing = [n for n in fields if n not in reply.arrays]
        if missing:
            raise ValueError(f"reply lacks the summed array(s) {missing[:3]}")
        if step.check is not None:
            step.check(site, reply)

    def reduce(replies: dict[str, Message]) -> None:
        sums, weight = _plain_sums(replies, step.spec)
        on_result(step.aggregate(Summed(sums, weight, dict(replies), list(replies))))

    ride(federation, step.request, check, reduce, step=step.kind or step.request.kind, independent=independent)
    return True
