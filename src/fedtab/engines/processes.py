"""Processes of a loopback deployment: started in their own session, stopped with every descendant.

Flower's SuperLink/SuperNode and FLARE's server/clients spawn children (SuperExec, ServerApp
and ClientApp processes; FLARE job processes), some in sessions of their own. So every
process is started with ``setsid`` (its own process group) in an environment carrying a
marker variable, and :func:`stop_processes` signals the groups, the descendants found in
``/proc`` and any process whose environment holds the marker (children re-parented to init
after their parent died). Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["ProcessOwner", "descendants", "processes_with_env", "spawn", "stop_processes"]


def descendants(roots: Sequence[int]) -> set[int]:
    """Every live process below ``roots`` (by parent pid, read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def processes_with_env(marker: str) -> set[int]:
    """Live processes (other than this one) whose environment holds ``marker`` (``NAME=value``)."""
    needle = marker.encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.add(int(entry.name))
    return found


def spawn(argv: list[str], log: Path, *, env: dict[str, str], cwd: str | Path) -> tuple[subprocess.Popen, object]:
    """Start ``argv`` in its own session (``setsid``), output to ``log``; returns ``(process, open log)``."""
    handle = open(log, "wb")  # noqa: SIM115 - closed by the caller after stop_processes
    proc = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    return proc, handle


def _kill(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop_processes(procs: Sequence[subprocess.Popen], marker: str | None = None, grace: float = 10.0) -> None:
    """Stop ``procs``, their process groups and descendants: TERM, wait up to ``grace`` s, then KILL.

    With ``marker`` (``NAME=value`` set in the processes' environment) any process still
    carrying it is killed too.
    """
    import time

    tree = descendants([p.pid for p in procs])
    _kill(tree, signal.SIGTERM)
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:  # children that outlived their leader, or a stuck leader
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    _kill(tree | descendants(list(tree)) | (processes_with_env(marker) if marker else set()), signal.SIGKILL)


class ProcessOwner:
    """Base of a loopback deployment: the processes it spawned, stopped together.

    A subclass sets :attr:`marker` (``NAME=value`` it puts in its processes' environment)
    and implements ``start()`` (returning ``self``); ``with`` starts it and always stops it.
    """

    marker: str = ""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._logs: list[object] = []

    def _spawn_logged(self, argv: list[str], log: Path, *, env: dict[str, str], cwd: str | Path) -> subprocess.Popen:
        """:func:`spawn` ``argv`` and remember it (and its log) for :meth:`stop`."""
        proc, handle = spawn(argv, log, env=env, cwd=cwd)
        self._procs.append(proc)
        self._logs.append(handle)
        return proc

    def stop(self) -> None:
        """Kill every process started here, their groups, descendants and marker holders (TERM, then KILL)."""
        stop_processes(self._procs, marker=self.marker or None)
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def stragglers(self) -> set[int]:
        """Processes still carrying :attr:`marker` (empty after :meth:`stop`)."""
        return processes_with_env(self.marker) if self.marker else set()

    def start(self) -> "ProcessOwner":  # pragma: no cover - abstract
        raise NotImplementedError

    def __enter__(self):  # noqa: ANN204 - returns the subclass
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
