"""Progress of a run on a deployment: one event per exchange, written by the server, read by the analyst.

A run on a Flower SuperLink goes through processes the analyst cannot see; what comes
back while it runs is the ServerApp's log (``flwr log RUN --stream``). So the server side
(:class:`ProgressLog`, used by fedtab's ServerApp) prints one marked line per
request/reply exchange as it ends, and one with its estimate before the job's first step:

``fedtab-progress {"seq": 7, "t": 65.2, "step": "training", "kind": "fit", "round": 3, "rounds": 10, "answered": 4, "asked": 4}``

and the analyst's side (:mod:`fedtab.engines.flower_remote`) parses them out of the
stream (:func:`parse_event`) and prints them (:func:`describe`): ``training round 3/10
(4/4 sites)``. The log also carries text the server logged for the sites (their error
messages), so a line is accepted only as a JSON object of known keys, short strings of
plain characters and bounded numbers; anything else is ignored — a forged line can at
worst print a wrong progress line, never run anything or end the wait.

Before the job's first step the server prints the count of the plan the job hands it
(:class:`ExchangePlan`; :mod:`fedtab.job.exchange_plan`: the plan's upper bound with a plain
Newton fit counted converging); the time
comes from the job's own exchanges: at the 1st, 4th, 16th, … exchange of each step an estimate
line gives the exchanges left and their mean expected seconds (``training: about 590 exchanges
left × 4.1 s ≈ 40.3 min``) — this step's at its own rate (from its 2nd exchange on, the exchanges
after its first, which carries the riders of the step before; nothing from the run's first
exchange, for which every site reads its table), every later step's at the
cheapest step's rate, a GNN round of the imputation as :data:`GNN_ROUND_WEIGHT` exchanges — so
no step is timed on the site-naming exchange (whose cost says nothing of a fit round's or a tree
level's) nor on another step's dear work (the heart job on Flower: within 1.5× at every estimate,
docs/deployment.md). The analyst's side uses the standard library only (the server's :class:`ProgressLog`
reads the progress kinds from the kind registry, :func:`round_kinds`).
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["ExchangePlan", "GNN_ROUND_WEIGHT", "MARKER", "ProgressLog", "describe", "estimate_text", "kind_weight",
           "parse_event", "round_kinds"]

MARKER = "fedtab-progress"


@dataclass(frozen=True)
class ExchangePlan:
    """What a run expects, handed to :class:`ProgressLog` by whoever runs the job
    (:func:`fedtab.job.exchange_plan.exchange_plan`; the engines read no job): ``exchanges``
    ``{step: exchanges}`` in step order, ``units`` ``{step: their weight in ordinary exchanges}``
    (:func:`kind_weight`) and ``rounds`` ``{round kind: the step's rounds}`` (:func:`round_kinds`)."""

    exchanges: Mapping[str, int]
    units: Mapping[str, float]
    rounds: Mapping[str, int] = field(default_factory=dict)

def round_kinds() -> dict[str, tuple[str, Callable[[Any], int]]]:
    """Message kinds that are the rounds of a step: ``{kind: (step, the spec's rounds)}``, from
    the kinds' declarations (:attr:`fedtab.federation.protocol.kinds.MessageKind.progress`). Imported
    here, on the server's side only: the analyst's side (:func:`parse_event`, :func:`describe`)
    needs the standard library alone."""
    from fedtab.federation.protocol.kinds import KINDS

    return {name: (k.progress.step, k.progress.rounds_of) for name, k in KINDS.items() if k.progress is not None}


_LINE = re.compile(rf"{MARKER} (\{{.{{1,1000}}\}})\s*$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_WORD = re.compile(r"^[A-Za-z0-9_.\- ]{1,60}$")
_INTS = ("seq", "round", "rounds", "answered", "asked", "exchanges")
_FLOATS = ("t", "seconds_per_exchange")
_TEXTS = ("step", "kind")


#: what a GNN round of the imputation (its round kind, :func:`round_kinds`: torch at every site) costs
#: in ordinary exchanges. Measured on the heart job (docs/deployment.md): 20.7 s against 7.3 s for an
#: ordinary exchange on a Flower loopback deployment (2.8×), about 2.5× on FLARE
GNN_ROUND_WEIGHT = 2.5


def kind_weight(kind: str) -> float:
    """What an exchange of message kind ``kind`` costs in ordinary exchanges: :data:`GNN_ROUND_WEIGHT`
    for the imputation's rounds, 1 for every other kind."""
    return GNN_ROUND_WEIGHT if round_kinds().get(kind, (None,))[0] == "imputation" else 1.0


def estimate_text(exchanges: int, seconds_per_exchange: float, left: bool = False) -> str:
    """``about 12 exchanges × 2.1 s ≈ 25 s`` (``exchanges left`` with ``left``; minutes past 120 s)."""
    total = exchanges * seconds_per_exchange
    when = f"{total:.0f} s" if total < 120 else f"{total / 60:.1f} min"
    return f"about {exchanges} exchanges{' left' if left else ''} × {seconds_per_exchange:.1f} s ≈ {when}"


def describe(event: dict[str, Any]) -> str:
    """The analyst's line for an event: ``training round 3/10 (4/4 sites)``, ``election: ballot
    (3/3 sites)``, the plan ``3 site(s) joined; the job makes about 12 exchanges`` or an estimate
    timed on a step's exchanges ``training: about 9 exchanges left × 2.1 s ≈ 19 s``."""
    if "exchanges" in event and "seconds_per_exchange" in event:
        return f"{event.get('step', 'job')}: {estimate_text(event['exchanges'], event['seconds_per_exchange'], True)}"
    if "exchanges" in event:
        return (f"{event.get('asked', '?')} site(s) joined; the job makes about {event['exchanges']} exchanges "
                "(timed on its exchanges after the first)")
    sites = f"({event.get('answered', '?')}/{event.get('asked', '?')} sites)"
    step = event.get("step") or "exchange"
    if "round" in event:
        of = f"/{event['rounds']}" if event.get("rounds") else ""
        return f"{step} round {event['round']}{of} {sites}"
    return f"{step}: {event.get('kind', '?')} {sites}"


def parse_event(line: str) -> dict[str, Any] | None:
    """The event a log line carries, or ``None`` (not a progress line, or not a well-formed one).

    Accepted: a JSON object whose keys are among the known ones, integers in
    ``[0, 10**9]``, finite numbers in ``[0, 10**9]`` and strings of at most 60 letters,
    digits, ``_.-`` and spaces; a line that breaks any of these is ignored whole.
    """
    m = _LINE.search(_ANSI.sub("", line))
    if m is None:
        return None
    try:
        raw = json.loads(m.group(1))
    except ValueError:
        return None
    if not isinstance(raw, dict) or not raw or not set(raw) <= {*_INTS, *_FLOATS, *_TEXTS}:
        return None
    for key, value in raw.items():
        if key in _INTS and not (type(value) is int and 0 <= value <= 10**9):
            return None
        if key in _FLOATS and not (type(value) in (int, float) and math.isfinite(value) and 0 <= value <= 1e9):
            return None
        if key in _TEXTS and not (isinstance(value, str) and _WORD.match(value)):
            return None
    return raw


def _retime(n: int) -> bool:
    """Whether a step's ``n``-th exchange re-times the estimate: its 1st, 4th, 16th, 64th, …"""
    while n > 1 and n % 4 == 0:
        n //= 4
    return n == 1


class ProgressLog:
    """The server side: one marked line per exchange (and the estimates), through ``emit``.

    The estimate is timed on the job's own exchanges, never on the site-naming one: before the
    first step :meth:`estimate` prints the plan's count (:func:`fedtab.job.exchange_plan.expected_exchanges`); then at the 1st,
    4th, 16th, 64th, … exchange of each step an estimate event ``{"step", "exchanges",
    "seconds_per_exchange"}`` gives the exchanges left (this step's not yet made, and every later
    step's) and the seconds per exchange they are expected to take on average, weighted by step:

    * this step's left at this step's own rate — from its 2nd exchange on, the seconds since its
      first exchange ended over the exchanges made since (the first exchange of a step is not
      representative: it carries the riders of the step before, e.g. the imputation's
      ``impute_apply`` on the election's ballot, and since issue 31 the Newton iteration at zero); at
      its 1st, the lower of that exchange's and the lowest rate of an earlier step (that exchange's
      alone when there is none);
    * every later step's at the *lowest* rate a step has run at so far: a step's own work (the
      imputation's GNN rounds, a torch import per Flower ClientApp) says nothing of the next
      step's, while the cheapest step's rate is the engine's cost of an exchange (Flower's
      process per message and 3 s poll, FLARE's 0.2 s task poll).

    The run's first exchange times nothing and prints no estimate: every site reads its table for
    it and the engine starts the job's processes (on FLARE loopback the heart GBDT job's schema
    exchange took 2.0 s, its tree levels 0.3 s: an estimate timed on it was 2.7× high). A step
    whose exchanges outrun its count counts 0 left of its own.

    Args:
        plan: the job's :class:`ExchangePlan` (its steps' expected exchanges, their weights and
            the rounds of its round kinds: :func:`fedtab.job.exchange_plan.exchange_plan`);
            ``None`` for a workflow that is not a job (no rounds, no estimate).
        emit: where a line goes (default: ``print(..., flush=True)``: the ServerApp's log).
        clock: seconds, monotonic (default :func:`time.perf_counter`; tests pass a fake one).
    """

    def __init__(self, plan: ExchangePlan | None = None, emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.plan = plan
        self.emit = emit or (lambda line: print(line, flush=True))
        self.clock = clock or time.perf_counter
        self.t0 = self.clock()
        self.current: str | None = None
        self._seq = 0
        self._rounds: dict[str, int] = {}
        self._plan: dict[str, int] = dict(plan.exchanges) if plan is not None else {}
        self._started: set[str] = set()
        self._step_t0 = self.t0
        self._step_done = 0
        self._first_end = self.t0  # when the current step's first exchange ended
        self._units: dict[str, float] = dict(plan.units) if plan is not None else {}
        self._step_units = 0.0  # the current step's exchanges so far, in ordinary exchanges
        self._first_units = 0.0  # its first exchange's
        self._rates: dict[str, float] = {}  # seconds per ordinary exchange of every step that made one
        self._made = 0  # exchanges of the run so far

    def _write(self, event: dict[str, Any]) -> None:
        self._seq += 1
        event = {"seq": self._seq, "t": round(self.clock() - self.t0, 1), **event}
        self.emit(f"{MARKER} {json.dumps(event)}")

    def step(self, name: str) -> None:
        """The job's step ``name`` starts (:func:`fedtab.job.workflow.run_workflow`'s ``progress``)."""
        self.current = name
        self._started.add(name)
        self._step_t0, self._step_done, self._step_units = self.clock(), 0, 0.0

    def estimate(self, sites: int) -> None:
        """Before the first step: the expected exchanges (no time yet: the site-naming exchange is
        no measure of a step's)."""
        if self.plan is not None:
            self._write({"asked": sites, "exchanges": sum(self._plan.values())})

    def left(self) -> int:
        """Exchanges the plan has left: the current step's not yet made, and every step's not yet started."""
        return self._mine_left() + self._later_left()

    def _mine_left(self) -> int:
        return max(self._plan.get(self.current, 0) - self._step_done, 0) if self.current is not None else 0

    def _later_left(self) -> int:
        return sum(n for s, n in self._plan.items() if s not in self._started)

    def seconds_left(self) -> float:
        """Seconds the exchanges :meth:`left` are expected to take, each weighed by its kind
        (:func:`kind_weight`): this step's at its own rate, the later steps' at the lowest rate of a
        step so far (see the class); 0 before any exchange."""
        if self.current not in self._rates:
            return 0.0
        mine = 0.0 if self._mine_left() == 0 else max(self._units.get(self.current, 0.0) - self._step_units, 0.0)
        later = sum(u for s, u in self._units.items() if s not in self._started)
        own = self._rates[self.current]
        if self._step_done == 1:  # a step's first exchange carries the step before's riders: no measure of its own
            own = min([own] + [r for s, r in self._rates.items() if s != self.current])
        return mine * own + later * min(self._rates.values())

    def exchange(self, kind: str, answered: int, asked: int) -> None:
        """An exchange of message kind ``kind`` ended: ``answered`` of ``asked`` sites replied without error."""
        event: dict[str, Any] = {"step": self.current or "exchange", "kind": kind, "answered": answered,
                                 "asked": asked}
        step, rounds = round_kinds().get(kind, (None, None))
        if rounds is not None and self.plan is not None and self.current in (None, step):
            self._rounds[kind] = self._rounds.get(kind, 0) + 1
            event.update(step=step, round=self._rounds[kind], rounds=int(self.plan.rounds.get(kind, 0)))
        self._write(event)
        now = self.clock()
        weight = kind_weight(kind)
        self._step_done += 1
        self._step_units += weight
        self._made += 1
        if self.current is None:
            return
        if self._made == 1:  # the run's first: every site reads its table, the engine starts its job
            self._first_end, self._first_units = now, weight
            return
        if self._step_done == 1:
            self._first_end, self._first_units = now, weight
            self._rates[self.current] = (now - self._step_t0) / weight
        else:  # from the 2nd on: the exchanges after the first (which carries riders, reads tables)
            self._rates[self.current] = (now - self._first_end) / (self._step_units - self._first_units)
        if self.plan is not None and _retime(self._step_done):
            n = self.left()
            rate = self.seconds_left() / n if n else self._rates[self.current]
            self._write({"step": self.current, "exchanges": n, "seconds_per_exchange": round(rate, 2)})
