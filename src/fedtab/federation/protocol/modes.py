"""Privacy and trust modes as wrappers of one summing strategy, chosen once per run.

A workflow step is one configure/aggregate pair (:class:`SumStep`): the request it sends,
the arrays it needs only summed, the check of one site's reply and the reduction of the
sums. The step holds no test of the run's modes; the run's strategy does, by wrapping:

* the base strategy moves the sums: :class:`~.summing.PlainSums` or
  :class:`~.summing.SecureSums` (``federation.summing``);
* :class:`RobustSums` ``(inner)`` reduces each site's values with the step's robust reducer
  (:attr:`SumStep.robust`) instead of its sum;
* :class:`NoisySums` ``(inner, accountant)`` sends the step's DP release
  (:attr:`SumStep.noisy`): it asks the accountant before the request goes out (a release
  beyond the plan is refused there, nothing is sent), adds the DP settings to the request,
  checks the replies as noisy values and post-processes them before the reduction.

A step whose server may learn only sums (secure sums or DP) in another form than per site (e.g.
over the global schema where the per-site form is over each site's own columns) names that form
(:attr:`SumStep.summed`); the run's strategy sends it (:class:`SummedForms`).

:func:`run_strategy` composes the wrappers from the run's :class:`~.options.RunOptions`;
a new mode is one new wrapper class. Each run returns an :class:`Outcome`: the step's result
and the :class:`Measurements` the wrappers took (sites left out, values clipped, ε spent).

A step declares the modes it supports once (:func:`declare_modes`); :func:`check_modes`
refuses a run (or a job, when it is parsed) whose modes a step does not support.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Collection, Generic, Mapping, TypeVar

from fedtab.federation.protocol.messages import Message
from .summing import Check, Summed, SummingStrategy, SumSpec

if TYPE_CHECKING:  # pragma: no cover
    from ...privacy.accountant import PrivacyLedger
    from .federation import Federation

__all__ = ["Measurements", "Outcome", "NoisyRelease", "SumStep", "Reduction", "RunStrategy", "BaseSums",
           "RobustSums", "NoisySums", "SummedForms", "run_strategy", "use_wrapper", "MODES", "declare_modes", "check_modes", "modes_of",
           "supported_modes"]

R = TypeVar("R")

#: the run modes a step can support (``plain`` is always supported)
MODES = ("secure", "dp", "robust")


@dataclass
class Measurements:
    """What the wrappers measured beside a result.

    Attributes:
        left_out: ``{site: why}`` of the sites a robust reducer left out.
        clipped: noisy values the post-processing clipped (e.g. counts below 0 set to 0).
        releases: ``{accountant step: releases}`` this run of the step spent.
        epsilon: ``{accountant step: ε}`` the accountant reports spent by that step so far
            (``None`` when nothing was noised).
    """

    left_out: dict[str, str] = field(default_factory=dict)
    clipped: int = 0
    releases: dict[str, int] = field(default_factory=dict)
    epsilon: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Outcome(Generic[R]):
    """A step's ``result``, its :class:`Measurements` and the :class:`Summed` exchange behind it
    (``None`` for a reduction without an exchange)."""

    result: R
    measurements: Measurements
    summed: Summed | None = None


@dataclass
class NoisyRelease(Generic[R]):
    """How a step releases under DP.

    Attributes:
        step: the step as released (its request without the DP settings, its spec with
            fixed-point bits for noisy values, its check of noisy replies, its reductions);
            a :class:`Reduction`: the step is not released under DP (nothing is sent or spent).
        budget: the accountant's step name (e.g. ``"training.evaluate"``); ``None``: the step
            releases no noised number (e.g. column names and row counts): sent as it is,
            without DP settings, nothing spent.
        releases: the accountant's releases per exchange.
        extra: settings added to the request's DP settings (e.g. DP-SGD's steps).
        denoise: post-processing of one reply, or of the secure total: ``(message) ->
            (message, values clipped)``; ``None`` keeps the replies.
    """

    step: "SumStep[R] | Reduction[R]"
    budget: str | None
    releases: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    denoise: Callable[[Message], tuple[Message, int]] | None = None


@dataclass
class SumStep(Generic[R]):
    """One configure/aggregate pair of a workflow step.

    Attributes:
        request: the request every site gets (built on the server).
        spec: the reply arrays the server needs only summed.
        check: ``check(site, reply)`` raises to reject one site's reply.
        aggregate: the reduction of the sums (:attr:`Summed.parts`: each site's reply, or the
            one secure total).
        robust: the robust alternative of ``aggregate``: ``(summed) -> (result, left out)``
            over each site's reply; ``None``: the step has no robust mode.
        noisy: the step's DP release; ``None``: the step has no DP mode.
        kind: the exchange's step name (defaults to the request's kind).
        summed: the step's form when the server may learn only sums (secure sums or DP;
            :class:`SummedForms`): its own request, spec, check and reductions; its
            ``noisy`` is the DP release. ``None``: this form in every run.
    """

    request: Message
    spec: SumSpec
    check: Check | None
    aggregate: Callable[[Summed], R]
    robust: Callable[[Summed], tuple[R, dict[str, str]]] | None = None
    noisy: NoisyRelease[R] | None = None
    kind: str | None = None
    summed: "SumStep[R] | None" = None


@dataclass
class Reduction(Generic[R]):
    """A reduction without an exchange (e.g. a standardisation from a description):
    ``aggregate()``, its robust alternative ``robust() -> (result, left out)`` and the DP
    post-processing ``noisy(result, dp settings) -> result``."""

    aggregate: Callable[[], R]
    robust: Callable[[], tuple[R, dict[str, str]]] | None = None
    noisy: Callable[[R, Mapping[str, Any]], R] | None = None


class RunStrategy(ABC):
    """A run's strategy: a base summing strategy, possibly wrapped (see the module docstring)."""

    #: the mode this layer adds (``None`` for the base)
    mode: str | None = None

    @abstractmethod
    def run(self, federation: "Federation", step: SumStep[R], *, on_error: str | None = None) -> Outcome[R]:
        """Send ``step``'s request, check and reduce the replies."""

    @abstractmethod
    def reduce(self, reduction: Reduction[R]) -> Outcome[R]:
        """Run a reduction without an exchange."""

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes of this strategy, outermost first."""
        inner = getattr(self, "inner", None)
        own = (self.mode,) if self.mode is not None else ()
        return own + (inner.modes if inner is not None else ())

    def check_supported(self, supported: Collection[str], what: str) -> None:
        """Raise ``ValueError`` when a mode of :data:`MODES` this run has on is not in ``supported``
        (``what`` names the step); a mode added by :func:`use_wrapper` is the run's own."""
        for mode in self.modes:
            if mode in MODES and mode not in supported:
                raise ValueError(f"{mode} is not available for {what}")


class BaseSums(RunStrategy):
    """The base layer: the run's summing strategy (plain or secure) moves the sums."""

    def __init__(self, summing: SummingStrategy) -> None:
        self.summing = summing
        self.mode = "secure" if summing.secure else None

    def run(self, federation: "Federation", step: SumStep[R], *, on_error: str | None = None) -> Outcome[R]:
        summed = self.exchange(federation, step, on_error=on_error)
        return Outcome(step.aggregate(summed), Measurements(), summed)

    def exchange(self, federation: "Federation", step: SumStep[Any], *, on_error: str | None = None) -> Summed:
        """The step's summed exchange on the run's summing strategy."""
        from .exchange import exchange_sums

        kind = step.kind or step.request.kind
        return exchange_sums(federation, step.request, step.spec, step.check, step=kind, on_error=on_error)

    def reduce(self, reduction: Reduction[R]) -> Outcome[R]:
        return Outcome(reduction.aggregate(), Measurements())


class RobustSums(RunStrategy):
    """Each site's values reduced by the step's robust reducer instead of summed."""

    mode = "robust"

    def __init__(self, inner: RunStrategy) -> None:
        self.inner = inner

    def run(self, federation: "Federation", step: SumStep[R], *, on_error: str | None = None) -> Outcome[R]:
        robust = step.robust
        if robust is None:
            raise ValueError(f"the {step.kind or step.request.kind} step has no robust reducer")
        # the pair (result, left out), over each site's values: never a streamed total
        plain = replace(step, aggregate=lambda summed: robust(summed), spec=replace(step.spec, stream=False))
        out = self.inner.run(federation, plain, on_error=on_error)
        result, left_out = out.result  # type: ignore[misc]
        out.measurements.left_out.update(left_out)
        return Outcome(result, out.measurements, out.summed)

    def reduce(self, reduction: Reduction[R]) -> Outcome[R]:
        if reduction.robust is None:
            raise ValueError("this reduction has no robust alternative")
        result, left_out = reduction.robust()
        return Outcome(result, Measurements(left_out=dict(left_out)))


class NoisySums(RunStrategy):
    """The step's DP release, spent from ``accountant`` before the request goes out."""

    mode = "dp"

    def __init__(self, inner: RunStrategy, accountant: "PrivacyLedger | None", dp: Mapping[str, Any]) -> None:
        self.inner = inner
        self.accountant = accountant
        self.dp = dict(dp)

    def run(self, federation: "Federation", step: SumStep[R], *, on_error: str | None = None) -> Outcome[R]:
        from ...privacy.dp import DP_META, dp_request

        noisy = step.noisy
        if noisy is None:
            raise ValueError(f"the {step.kind or step.request.kind} step has no DP release")
        if isinstance(noisy.step, Reduction):  # not released under DP: nothing is sent or spent
            return self.inner.reduce(noisy.step)
        if noisy.budget is None:  # no noised number: sent as it is, nothing spent
            return self.inner.run(federation, noisy.step, on_error=on_error)
        if self.accountant is None:
            raise ValueError("a DP step needs the run's accountant")
        released = noisy.step
        settings = {**dp_request(self.dp, self.accountant.multiplier(noisy.budget)), **noisy.extra}
        self.accountant.spend(noisy.budget, noisy.releases)  # raises (nothing sent) beyond the plan
        request = Message(released.request.kind, released.request.arrays, {**released.request.meta, DP_META: settings})
        clipped = [0]

        def denoised(summed: Summed) -> Summed:
            if noisy.denoise is None:
                return summed
            parts = {}
            for key, message in summed.parts.items():
                parts[key], n = noisy.denoise(message)
                clipped[0] += n
            return replace(summed, parts=parts)

        robust = released.robust
        sent = replace(released, request=request, kind=step.kind or released.kind,
                       aggregate=lambda s: released.aggregate(denoised(s)),
                       robust=None if robust is None else (lambda s: robust(denoised(s))))
        out = self.inner.run(federation, sent, on_error=on_error)
        out.measurements.clipped += clipped[0]
        out.measurements.releases[noisy.budget] = out.measurements.releases.get(noisy.budget, 0) + noisy.releases
        out.measurements.epsilon[noisy.budget] = self.accountant.report()["steps"].get(noisy.budget)
        return out

    def reduce(self, reduction: Reduction[R]) -> Outcome[R]:
        out = self.inner.reduce(reduction)
        if reduction.noisy is not None:
            out.result = reduction.noisy(out.result, self.dp)
        return out


class SummedForms(RunStrategy):
    """The server learns only sums in this run (secure sums or DP): a step's
    :attr:`SumStep.summed` form is sent instead of its per-site form (the outermost layer)."""

    def __init__(self, inner: RunStrategy) -> None:
        self.inner = inner

    def run(self, federation: "Federation", step: SumStep[R], *, on_error: str | None = None) -> Outcome[R]:
        return self.inner.run(federation, step.summed if step.summed is not None else step, on_error=on_error)

    def reduce(self, reduction: Reduction[R]) -> Outcome[R]:
        return self.inner.reduce(reduction)


def run_strategy(federation: "Federation", accountant: "PrivacyLedger | None" = None, *,
                 base: RunStrategy | None = None) -> RunStrategy:
    """The run's strategy from its options: the base summing strategy, wrapped in
    :class:`RobustSums` (``robust``) and :class:`NoisySums` (``dp``, spending from ``accountant``),
    outermost :class:`SummedForms` when the server learns only sums (``secure`` or ``dp``).

    ``accountant`` may be ``None`` for reductions without an exchange (:meth:`RunStrategy.reduce`);
    a DP exchange without one raises ``ValueError``. ``base`` replaces the run's summing strategy
    under the wrappers for a step whose values are not sums (e.g. the election's ballots).
    """
    opts = federation.options
    strategy: RunStrategy = base if base is not None else BaseSums(federation.summing)
    for wrap in getattr(federation, "_mode_wrappers", ()):  # modes added to this run (:func:`use_wrapper`)
        strategy = wrap(strategy)
    if opts.robust:
        strategy = RobustSums(strategy)
    if opts.dp is not None:
        strategy = NoisySums(strategy, accountant, opts.dp)
    if opts.secure or opts.dp is not None:
        strategy = SummedForms(strategy)
    return strategy


def use_wrapper(federation: "Federation", wrap: Callable[[RunStrategy], RunStrategy]) -> None:
    """Add a mode to ``federation``'s runs: every step's strategy is wrapped by ``wrap(inner)``
    (inside the DP and robust wrappers). A new mode is one :class:`RunStrategy` wrapper class."""
    federation._mode_wrappers = (*getattr(federation, "_mode_wrappers", ()), wrap)  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- declarations
_DECLARED: dict[str, frozenset[str]] = {}


def declare_modes(step: str, *modes: str) -> frozenset[str]:
    """Declare the modes ``step`` supports (a subset of :data:`MODES`; plain always); returns them.

    Raises:
        ValueError: an unknown mode.
    """
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown} for step {step!r}; the modes are {list(MODES)}")
    _DECLARED[step] = frozenset(modes)
    return _DECLARED[step]


def supported_modes(step: str) -> frozenset[str]:
    """The modes ``step`` declared.

    Raises:
        KeyError: the step declared none.
    """
    return _DECLARED[step]


def modes_of(*, secure: bool = False, dp: bool = False, robust: bool = False) -> tuple[str, ...]:
    """The names of the modes a run has on."""
    return tuple(m for m, on in (("secure", secure), ("dp", dp), ("robust", robust)) if on)


def check_modes(step: str, modes: Collection[str], what: str | None = None) -> None:
    """Refuse ``modes`` that ``step`` did not declare.

    Raises:
        ValueError: ``"<mode> is not available for <what>"``.
    """
    supported = supported_modes(step)
    for mode in modes:
        if mode not in supported:
            raise ValueError(f"{mode} is not available for {what or step}")
