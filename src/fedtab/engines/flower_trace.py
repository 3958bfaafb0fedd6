"""An opt-in timeline of a Flower run's processes, for finding where an exchange's time goes.

Set ``FEDTAB_FLOWER_TRACE`` to a folder in the environment of the SuperLink and SuperNodes
(their ServerApp and ClientApp processes inherit it) and every fedtab ServerApp and ClientApp
process appends JSON lines to ``<folder>/<role>-<pid>.jsonl``, one per event::

    {"event": "handler_start", "t": 1718000000.123, "cpu": 1.234, "pid": 4242, "role": "clientapp", ...}

``t`` is the wall clock (epoch seconds, comparable across processes on one machine), ``cpu``
this process's CPU seconds so far (user + system, ``os.times``), so a process's ``exit`` event
gives its whole CPU. Events: ``process_start`` (from ``/proc``, written with the first event),
``fedtab_import`` / ``fedtab_imported`` (the engine module), ``handler_start`` / ``handler_end``
(with ``kind``) and ``exit`` in a ClientApp; ``main_start``, ``push`` / ``pulled`` (with
``kind``, ``round`` and, for ``pulled``, the ``nodes`` whose replies arrived) and ``exit`` in a
ServerApp. Without the variable nothing is written and the cost is one environment lookup.
``benchmarks/flower_bare.py`` writes the same events, so a fedtab run and a bare run can be
laid side by side (:func:`read_trace`). Diagnostics only: nothing a site holds goes into it.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["ENV", "Tracer", "process_started", "read_trace", "tracer"]

#: the environment variable naming the trace folder
ENV = "FEDTAB_FLOWER_TRACE"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def process_started() -> float:
    """Epoch seconds at which this process started (Linux ``/proc``; ``nan`` elsewhere)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return float("nan")


class Tracer:
    """Appends this process's events to ``<folder>/<role>-<pid>.jsonl`` (see the module docstring).

    Args:
        folder: the trace folder (created).
        role: ``"serverapp"`` or ``"clientapp"`` (part of the file name and of every event).
    """

    def __init__(self, folder: str | Path, role: str) -> None:
        self.role = role
        self.path = Path(folder) / f"{role}-{os.getpid()}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._started = False
        atexit.register(self.event, "exit")

    def event(self, name: str, **fields: Any) -> None:
        """Append one event (``fields`` must be JSON-able); never raises for an unwritable folder."""
        lines = []
        if not self._started:
            self._started = True
            lines.append({"event": "process_start", "t": process_started(), "cpu": 0.0})
        lines.append({"event": name, "t": time.time(), "cpu": _cpu(), **fields})
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                for line in lines:
                    fh.write(json.dumps({**line, "pid": os.getpid(), "role": self.role}) + "\n")
        except OSError:
            pass


_TRACERS: dict[str, Tracer | None] = {}


def tracer(role: str) -> Tracer | None:
    """This process's tracer for ``role`` when ``FEDTAB_FLOWER_TRACE`` is set, else ``None``."""
    if role not in _TRACERS:
        folder = os.environ.get(ENV, "")
        _TRACERS[role] = Tracer(folder, role) if folder else None
    return _TRACERS[role]


def read_trace(folder: str | Path) -> list[dict[str, Any]]:
    """Every event of every process in ``folder``, sorted by time (unparsable lines skipped)."""
    events = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return sorted(events, key=lambda e: (e.get("t", 0.0) if e.get("t") == e.get("t") else 0.0))
