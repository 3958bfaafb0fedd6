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

Before the job's first step the server prints the count :func:`expected_exchanges` makes
(the plan's, :func:`planned_exchanges`, with a plain Newton fit counted converging); the time
comes from the job's own exchanges: at the 1st, 4th, 16th, … exchange of each step an estimate
line gives the exchanges left and their mean expected seconds (``training: about 590 exchanges
left × 4.1 s ≈ 40.3 min``) — this step's at its own rate (from its 2nd exchange on, the exchanges
after its first, which carries the riders of the step before; nothing from the run's first
exchange, for which every site reads its table), every later step's at the
cheapest step's rate, a GNN round of the imputation as :data:`GNN_ROUND_WEIGHT` exchanges — so
no step is timed on the site-naming exchange (whose cost says nothing of a fit round's or a tree
level's) nor on another step's dear work (the heart job on Flower: within 1.5× at every estimate,
docs/deployment.md). The analyst's side uses the standard library only (the server's :class:`ProgressLog`
reads the progress kinds from the kind registry, :func:`round_kinds`, and a GBDT model's
``n_trees`` and ``max_depth`` for :func:`planned_exchanges`).
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from ..job.spec import JobSpec

__all__ = ["GNN_ROUND_WEIGHT", "MARKER", "NEWTON_EXPECTED", "ProgressLog", "describe", "estimate_text", "expected_exchanges",
           "gbdt_exchanges", "kind_weight", "parse_event", "planned_exchanges", "round_kinds"]

MARKER = "fedtab-progress"

def round_kinds() -> dict[str, tuple[str, Callable[["JobSpec"], int]]]:
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


def _gbdt_model(model: Any) -> Any:
    """The :class:`~fedtab.learn.models.GradientBoostedTreesModel` a training ``model`` spec names, else ``None``."""
    from ..learn.models import make_model

    fm = make_model(model)
    return fm if fm.name == "gbdt" else None


def gbdt_exchanges(params: Mapping[str, Any], *, plain: bool, dp: bool = False) -> int:
    """Exchanges of one federated boosting run (:func:`fedtab.federation.workflows.gbdt.run_gbdt`) at most:
    ``gbdt_summary``, two ``gbdt_sketch`` (none under DP: public bounds), ``gbdt_start``, one
    ``gbdt_level`` per depth level of every round (``n_trees × max_depth``), the closing
    ``gbdt_level``, ``gbdt_importance`` in a plain run, and the evaluation:
    ``n_trees × max_depth + 6`` (``+ 1`` plain, ``− 2`` DP). Early stopping, trees that stop
    growing before ``max_depth`` and public bounds for every column make fewer; a regression
    run makes as many (its evaluation is ``gbdt_score``)."""
    return int(params["n_trees"]) * int(params["max_depth"]) + 4 + int(plain) + (0 if dp else 2)


def _robust(spec: "JobSpec") -> bool:
    """Whether the job's ``[trust]`` asks for robust reducers."""
    return bool(getattr(getattr(spec, "trust", None), "robust", False))


def _linear_model(model: Any) -> bool:
    """Whether a training ``model`` spec names the exact linear regression (one round)."""
    from ..learn.models import LinearRegressionModel, make_model

    return isinstance(make_model(model), LinearRegressionModel)


def planned_exchanges(spec: "JobSpec") -> dict[str, int]:
    """``{step: exchanges}`` the job's plan makes (an estimate), in step order.

    Exact for schema, election, FedAvg training and baselines as the job folds them, an upper bound
    for the imputation (its rounds stop early on a validation plateau, ``[impute] patience``)
    (checked against the in-process engine's exchange count); an upper bound for a logistic model
    trained by Newton–Raphson (the default), whose ``rounds`` are its most iterations: it stops
    once a step is shorter than :data:`~fedtab.learn.newton.NEWTON_TOL` (the heart job: 6 of 10,
    its final evaluation riding on the last; :func:`expected_exchanges`, what the estimate counts,
    counts a plain run converging). In a *plain* run (no secure sums, DP or robust reducers) requests ride on the
    next exchange (:mod:`fedtab.federation.protocol.piggyback`): imputation at most ``rounds + 3`` (schema,
    statistics, the rounds with the setup on the first, one evaluation with the kept best round's
    riding on it; ``4`` with no rounds), its ``impute_apply`` on the election's ballot; for a Newton
    model the count assumes the run stops at its cap (training ``rounds + 1``, baselines 1): a
    converging run makes ``iterations`` (its evaluation rides on the last) and no baselines exchange
    (they ride on the first iteration). Otherwise the steps keep their own exchanges: the column profile 1,
    imputation ``rounds + 5`` (``+ 1`` with the column profile), election 2 (``ballot``, ``set_mask``), training ``rounds + 1``
    after an election (its ``describe`` rides on ``set_mask``) else ``rounds + 2`` (``+ 1`` when no earlier step
    agreed the schema: the training step agrees it to read the task),
    baselines 1; tuning is counted as its grid (11 freedom degrees by default) + 2. An exact ``linear``
    model trains in one round (no baselines: a regression). ``[election] tune = "cv"`` is the selection
    step in place of tuning, election, training and baselines: ``rounds + 3`` (``select_prepare``, the
    fit rounds, the CV and the test evaluation); with a ``linear`` model 3 (one fit exchange, no test
    evaluation) and the training step's 3 (describe, fit, evaluate).
    A ``gbdt`` model's training is :func:`gbdt_exchanges` (its ``n_trees × max_depth`` level
    exchanges, not ``rounds``; an upper bound: early stopping and shallow trees make fewer), its
    schema agreement and, for a regression task, no baselines.
    Secure aggregation adds two exchanges per summed one (the survivors' signatures and the
    unmasking) and one for a session's keys: election ``+ 3``, imputation ``+ 4·rounds + 4``,
    FedAvg training ``+ 2`` per summed exchange (its rounds, evaluate and, without an election,
    describe) and GBDT ``+ 2·(n_trees × max_depth + 5)`` (``+ 3`` under DP), each ``+ 1`` for the keys unless an
    election opened the session. A score test and the all-columns comparison are not counted.
    """
    out: dict[str, int] = {}
    private = spec.privacy.private
    secure = bool(spec.privacy.secure_aggregation)
    # a plain run: riders travel on the next exchange (:mod:`fedtab.federation.protocol.piggyback`)
    plain = not private and not secure and spec.privacy.dp is None and not _robust(spec)
    profile = spec.schema.profile if spec.schema.profile is not None else not private
    if profile:
        out["schema"] = 1
    if spec.impute is not None:
        r = spec.impute.rounds
        if plain:  # fused (issue 31): schema, stats, the rounds (the setup rides on the first), one
            # evaluation (the kept best round's rides on it); impute_apply rides on the next step's exchange
            out["imputation"] = r + 3 + int(r == 0)
        else:
            out["imputation"] = r + 5 + int(profile) + (4 * r + 4 if secure else 0)
    el = spec.election
    voting = el is not None and el.method == "vote"
    linear = spec.training is not None and _linear_model(spec.training.model)
    if voting and el.tune == "cv" and spec.training is not None:
        # the selection (plain sums only): select_prepare (it agrees the schema when it is the run's
        # first exchange), the select_fit rounds (one for an exact linear model), the CV evaluation and
        # the test evaluation — which a regression leaves to its training step (describe, fit, evaluate)
        if linear:
            out["selection"] = 3
            out["training"] = 3
        else:
            out["selection"] = spec.training.rounds + 3
        return out
    if voting and el.tune != "none" and el.freedom_degree is None:
        out["tuning"] = len(el.grid or range(11)) + 2
    if voting:
        out["election"] = 2 + (3 if secure else 0)  # secure: the ballot is summed, the session opened
    if spec.training is not None:
        # its describe rides on set_mask after an election; with no earlier step agreeing the schema,
        # the training step agrees it first (the task is read from the sites' declarations)
        agreed = profile or spec.impute is not None or voting
        gbdt = _gbdt_model(spec.training.model)
        if gbdt is not None:  # boosted trees grow level by level: no describe, no FedAvg rounds
            params = gbdt.get_params()
            regression = spec.training.task == "regression" or params.get("objective") == "regression"
            dp = spec.privacy.dp is not None
            # (sketch ×2,) start, levels, closing level, evaluate
            summed = int(params["n_trees"]) * int(params["max_depth"]) + 3 + (0 if dp else 2)
            out["training"] = gbdt_exchanges(params, plain=not private, dp=dp) + (0 if agreed else 1)
        else:
            regression = linear
            rounds = 1 if linear else spec.training.rounds  # an exact linear model: one round
            summed = rounds + (1 if voting else 2)  # (describe,) fit rounds or at most `rounds` Newton steps, evaluate
            out["training"] = summed + (0 if agreed else 1)
        if secure:
            out["training"] += 2 * summed + (0 if voting else 1)
        if not regression and (spec.evaluation.baselines if spec.evaluation.baselines is not None else not private):
            # (plain Newton: they ride on the first iteration and cost none of their own when the run
            # converges; counted as when it stops at its cap, the bound the training's count assumes too)
            out["baselines"] = 1
    return out


#: Newton–Raphson iterations a plain logistic fit is expected to make before it converges (its
#: ``rounds`` are a cap): 6 on the heart job (measured: ``tests/job/test_job_exchanges.py`` and the
#: deployments of docs/deployment.md), where counting the cap of 10 put the estimate 1.6× high
NEWTON_EXPECTED = 6


def _plain_newton(spec: "JobSpec") -> bool:
    """Whether the job trains a logistic model by federated Newton–Raphson with plain sums (no
    secure sums, DP or robust reducers), the case whose converging run :func:`expected_exchanges` counts."""
    from ..learn.models import LogisticRegressionModel, make_model

    if spec.training is None or spec.privacy.private or spec.privacy.secure_aggregation:
        return False
    if spec.privacy.dp is not None or _robust(spec):
        return False
    fm = make_model(spec.training.model)
    return isinstance(fm, LogisticRegressionModel) and bool(fm.newton)


def expected_exchanges(spec: "JobSpec") -> dict[str, int]:
    """``{step: exchanges}`` the estimate counts: :func:`planned_exchanges`, but a plain Newton
    logistic fit whose ``rounds`` exceed :data:`NEWTON_EXPECTED` is counted as converging after
    ``NEWTON_EXPECTED`` iterations — ``rounds + 1 − NEWTON_EXPECTED`` fewer training exchanges
    (its evaluation rides on the last iteration) and no baselines exchange (they ride on the first
    iteration). A run that needs more iterations counts none left of its own once past the
    expected ones (the step's estimate then says ≈ 0 s until it ends)."""
    out = planned_exchanges(spec)
    if "training" in out and _plain_newton(spec) and "selection" not in out:
        rounds = spec.training.rounds
        if rounds > NEWTON_EXPECTED:
            out["training"] -= rounds + 1 - NEWTON_EXPECTED
            out.pop("baselines", None)
    return out


#: what a GNN round of the imputation (its round kind, :func:`round_kinds`: torch at every site) costs
#: in ordinary exchanges. Measured on the heart job (docs/deployment.md): 20.7 s against 7.3 s for an
#: ordinary exchange on a Flower loopback deployment (2.8×), about 2.5× on FLARE
GNN_ROUND_WEIGHT = 2.5


def kind_weight(kind: str) -> float:
    """What an exchange of message kind ``kind`` costs in ordinary exchanges: :data:`GNN_ROUND_WEIGHT`
    for the imputation's rounds, 1 for every other kind."""
    return GNN_ROUND_WEIGHT if round_kinds().get(kind, (None,))[0] == "imputation" else 1.0


def _units(spec: "JobSpec", plan: Mapping[str, int]) -> dict[str, float]:
    """``{step: cost}`` of the plan's steps in ordinary exchanges (:func:`kind_weight`): the
    imputation's ``rounds`` GNN rounds weigh :data:`GNN_ROUND_WEIGHT`, every other exchange 1."""
    out = {k: float(n) for k, n in plan.items()}
    if "imputation" in out and spec.impute is not None:
        heavy = min(spec.impute.rounds, plan["imputation"])
        out["imputation"] += (GNN_ROUND_WEIGHT - 1.0) * heavy
    return out


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
    first step :meth:`estimate` prints the count :func:`expected_exchanges` makes; then at the 1st,
    4th, 16th, 64th, … exchange of each step an estimate event ``{"step", "exchanges",
    "seconds_per_exchange"}`` gives the exchanges left (this step's not yet made, and every later
    step's) and the seconds per exchange they are expected to take on average, weighted by step:

    * this step's left at this step's own rate — from its 2nd exchange on, the seconds since its
      first exchange ended over the exchanges made since (the first exchange of a step is not
      representative: it carries the riders of the step before, e.g. the imputation's
      ``impute_apply`` on the election's ballot); at its 1st, that exchange's;
    * every later step's at the *lowest* rate a step has run at so far: a step's own work (the
      imputation's GNN rounds, a torch import per Flower ClientApp) says nothing of the next
      step's, while the cheapest step's rate is the engine's cost of an exchange (Flower's
      process per message and 3 s poll, FLARE's 0.2 s task poll).

    The run's first exchange times nothing and prints no estimate: every site reads its table for
    it and the engine starts the job's processes (on FLARE loopback the heart GBDT job's schema
    exchange took 2.0 s, its tree levels 0.3 s: an estimate timed on it was 2.7× high). A step
    whose exchanges outrun its count counts 0 left of its own.

    Args:
        spec: the job (for the rounds of its round steps and :func:`expected_exchanges`);
            ``None`` for a workflow that is not a job (no rounds, no estimate).
        emit: where a line goes (default: ``print(..., flush=True)``: the ServerApp's log).
        clock: seconds, monotonic (default :func:`time.perf_counter`; tests pass a fake one).
    """

    def __init__(self, spec: "JobSpec | None" = None, emit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.spec = spec
        self.emit = emit or (lambda line: print(line, flush=True))
        self.clock = clock or time.perf_counter
        self.t0 = self.clock()
        self.current: str | None = None
        self._seq = 0
        self._rounds: dict[str, int] = {}
        self._plan: dict[str, int] = expected_exchanges(spec) if spec is not None else {}
        self._started: set[str] = set()
        self._step_t0 = self.t0
        self._step_done = 0
        self._first_end = self.t0  # when the current step's first exchange ended
        self._units: dict[str, float] = _units(spec, self._plan) if spec is not None else {}
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
        if self.spec is not None:
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
        return mine * self._rates[self.current] + later * min(self._rates.values())

    def exchange(self, kind: str, answered: int, asked: int) -> None:
        """An exchange of message kind ``kind`` ended: ``answered`` of ``asked`` sites replied without error."""
        event: dict[str, Any] = {"step": self.current or "exchange", "kind": kind, "answered": answered,
                                 "asked": asked}
        step, rounds = round_kinds().get(kind, (None, None))
        if rounds is not None and self.spec is not None and self.current in (None, step):
            self._rounds[kind] = self._rounds.get(kind, 0) + 1
            event.update(step=step, round=self._rounds[kind], rounds=rounds(self.spec))
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
        if self.spec is not None and _retime(self._step_done):
            n = self.left()
            rate = self.seconds_left() / n if n else self._rates[self.current]
            self._write({"step": self.current, "exchanges": n, "seconds_per_exchange": round(rate, 2)})
