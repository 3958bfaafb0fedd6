"""Declarative validation of the job's sections, as scikit-learn's ``_parameter_constraints``.

Each section dataclass of :mod:`fedtab.job.spec` carries a table ``_constraints``:
``{key: constraint}``. The key's *type* is its dataclass annotation (checked when the job is
parsed); the table states the rest -- a range (:class:`Interval`), a set of choices
(:class:`Options`), every item of a list (:class:`Items`) or a check written elsewhere
(:class:`Checked`: a factory or ``check_*`` function that raises ``ValueError``). A constraint
skips ``None`` (a key whose ``None`` is allowed says so in its annotation).

Rules that tie keys together (``tune`` with ``freedom_degree``, a private run with the
baselines) are :class:`Rule` rows of a table in :mod:`fedtab.job.spec`: a predicate over the whole
job that must not hold, and the one-line message naming the keys.

:func:`validate_section` reads a section's table and raises the user's one-line error:
``[section] key must be <what the constraint says>, got <value>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

__all__ = ["Checked", "Constraint", "Interval", "Items", "Names", "Options", "Rule", "check_rules", "validate_section"]


class Constraint:
    """A condition on one value: :meth:`holds`, described for the error by :attr:`text`."""

    text: str = ""

    def holds(self, value: Any) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def error(self, where: str, value: Any) -> str:
        """The one-line message for ``value`` at ``where`` (``[section] key``)."""
        return f"{where} must be {self.text}, got {value!r}"


def _real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


@dataclass(frozen=True)
class Interval(Constraint):
    """A number between ``low`` and ``high`` (``None``: unbounded); ``closed`` says which ends
    belong to it (``"both"``, ``"left"``, ``"right"``, ``"neither"``). ``text`` overrides the
    description (``"at least 1"``, ``"a positive integer"``)."""

    low: float | None
    high: float | None
    closed: str = "both"
    text: str = ""
    integer: bool = False

    def __post_init__(self) -> None:
        if not self.text:
            left = "[" if self.closed in ("both", "left") else "("
            right = "]" if self.closed in ("both", "right") else ")"
            object.__setattr__(self, "text", f"in {left}{self.low}, {self.high}{right}")

    def holds(self, value: Any) -> bool:
        if not _real(value) or (self.integer and not isinstance(value, int)):
            return False
        lo_in = self.low is None or (value >= self.low if self.closed in ("both", "left") else value > self.low)
        hi_in = self.high is None or (value <= self.high if self.closed in ("both", "right") else value < self.high)
        return lo_in and hi_in


@dataclass(frozen=True)
class Options(Constraint):
    """One of ``choices``."""

    choices: tuple
    text: str = ""

    def __post_init__(self) -> None:
        if not self.text:
            object.__setattr__(self, "text", f"one of {list(self.choices)}")

    def holds(self, value: Any) -> bool:
        return value in self.choices


@dataclass(frozen=True)
class Items(Constraint):
    """A non-empty list whose every item meets ``each``; ``text`` describes the list."""

    each: Constraint
    text: str = ""

    def holds(self, value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(self.each.holds(v) for v in value)


@dataclass(frozen=True)
class Names(Constraint):
    """A list (possibly empty) of column names: non-empty strings."""

    text: str = "a list of column names"

    def holds(self, value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


@dataclass(frozen=True)
class Checked(Constraint):
    """A check written elsewhere: ``check(value)`` raises ``ValueError``/``TypeError`` (or the
    job's own error) on a bad value; its message is kept, prefixed with the key."""

    check: Callable[[Any], Any]

    def holds(self, value: Any) -> bool:
        return True  # :func:`validate_section` calls :attr:`check` for its own message


def _checked(c: Checked, where: str, key: str, value: Any) -> str | None:
    try:
        c.check(value)
    except (ValueError, TypeError, KeyError) as exc:
        text = str(exc).strip("'\"") if isinstance(exc, KeyError) else str(exc)
        section = where[: -len(key)].rstrip()
        return f"{section} {text}" if text.startswith(key) else f"{where}: {text}"
    return None


def validate_section(section: Any, name: str, error: type[Exception] = ValueError) -> None:
    """Check every key of ``section`` (a dataclass with a ``_constraints`` table) against its
    constraints, in the table's order.

    Raises:
        error: ``[name] key must be ..., got ...`` for the first key that fails.
    """
    table: dict[str, Constraint | Sequence[Constraint]] = getattr(type(section), "_constraints", {})
    for key, constraints in table.items():
        value = getattr(section, key)
        if value is None:
            continue
        where = f"[{name}] {key}"
        for c in (constraints if isinstance(constraints, (list, tuple)) else (constraints,)):
            message = _checked(c, where, key, value) if isinstance(c, Checked) else (
                None if c.holds(value) else c.error(where, value))
            if message is not None:
                raise error(message)


@dataclass(frozen=True)
class Rule:
    """An interaction rule: the job is refused when ``broken(spec)`` holds, with ``message``
    (text, or text made from the job) naming the keys; ``when`` limits it to jobs where it
    applies (the section present)."""

    broken: Callable[[Any], bool]
    message: str | Callable[[Any], str]
    when: Callable[[Any], bool] = lambda spec: True

    def check(self, spec: Any, error: type[Exception] = ValueError) -> None:
        if self.when(spec) and self.broken(spec):
            raise error(self.message if isinstance(self.message, str) else self.message(spec))


def check_rules(spec: Any, rules: Iterable[Rule | Callable[[Any], None]], error: type[Exception] = ValueError) -> None:
    """Apply ``rules`` (:class:`Rule` rows, or functions of the job that raise) in order."""
    for rule in rules:
        if isinstance(rule, Rule):
            rule.check(spec, error)
        else:
            rule(spec)
