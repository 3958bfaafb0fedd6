"""A job step (:class:`Step`), in a module of its own: each step module builds one, and the package
(:mod:`fedtab.job.steps`) lists them in run order, so no step module imports the package."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ...federation.protocol import Federation
    from ..outputs import Outputs
    from ..spec import JobSpec

__all__ = ["Step"]


@dataclass(frozen=True)
class Step:
    """One step of the job: ``run(federation, spec, out)`` when ``needed(spec, out)``."""

    name: str
    needed: Callable[["JobSpec", "Outputs"], bool]
    run: Callable[["Federation", "JobSpec", "Outputs"], Any]
