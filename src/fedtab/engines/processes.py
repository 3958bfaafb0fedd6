"""Processes of a loopback deployment: started in their own session, stopped with every descendant.

Flower's SuperLink/SuperNode and FLARE's server/clients spawn children (SuperExec, ServerApp
and ClientApp processes; FLARE job processes), some in sessions of their own. So every
process is started with ``setsid`` (its own process group) in an environment carrying a
marker variable, and :func:`stop_processes` signals the groups, the descendants found in
``/proc`` and any process whose environment holds the marker (children re-parented to init
after their parent died). Linux only (``/proc``).

A :class:`ProcessOwner` also cleans up when its owner does not: ``stop`` is registered with
:mod:`atexit` (an interpreter that exits without calling it), and a small watcher process
(:func:`start_reaper`) kills every process holding the marker once the owner's process is
gone (a test run killed with SIGTERM or SIGKILL, where no ``finally`` or ``atexit`` runs).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

__all__ = ["ProcessOwner", "descendants", "processes_with_env", "spawn", "start_reaper", "stop_processes"]


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


#: the watcher of :func:`start_reaper`: no imports beyond the standard library, one check of the
#: owner every 0.5 s; once it is gone, TERM then (3 s later) KILL to every holder of the marker
_REAPER = r"""
import os, signal, sys, time
owner, marker = int(sys.argv[1]), sys.argv[2].encode()
def alive():
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
while alive():
    time.sleep(0.5)
def holders():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if marker in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found
for sig in (signal.SIGTERM, signal.SIGKILL):
    for pid in holders():
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(3)
"""


def start_reaper(marker: str, owner: int | None = None) -> subprocess.Popen:
    """A watcher process (own session, output discarded) that kills every process whose
    environment holds ``marker`` (``NAME=value``) once process ``owner`` (default: this one)
    has exited; it then exits itself. Kill it to call it off.

    Raises:
        ValueError: ``marker`` is not ``NAME=value``.
    """
    if "=" not in marker or marker.startswith("="):
        raise ValueError(f"a process marker is NAME=value, got {marker!r}")
    env = {k: v for k, v in os.environ.items() if f"{k}={v}" != marker}  # never its own target
    return subprocess.Popen([sys.executable, "-c", _REAPER, str(owner or os.getpid()), marker], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


class ProcessOwner:
    """Base of a loopback deployment: the processes it spawned, stopped together.

    A subclass sets :attr:`marker` (``NAME=value`` it puts in its processes' environment)
    and implements ``start()`` (returning ``self``); ``with`` starts it and always stops it.
    From its first process until :meth:`stop`, ``stop`` is registered with :mod:`atexit` and,
    with a marker, a reaper (:func:`start_reaper`) watches this process: the processes do not
    outlive an owner that exits, or is killed, without stopping them.
    """

    marker: str = ""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen] = []
        self._logs: list[object] = []
        self._reaper: subprocess.Popen | None = None
        self._at_exit = False

    def _spawn_logged(self, argv: list[str], log: Path, *, env: dict[str, str], cwd: str | Path) -> subprocess.Popen:
        """:func:`spawn` ``argv`` and remember it (and its log) for :meth:`stop`."""
        self._guard()
        proc, handle = spawn(argv, log, env=env, cwd=cwd)
        self._procs.append(proc)
        self._logs.append(handle)
        return proc

    def _guard(self) -> None:
        """Before the first process: :meth:`stop` at interpreter exit, and the reaper."""
        if not self._at_exit:
            atexit.register(self.stop)
            self._at_exit = True
        if self._reaper is None and self.marker:
            self._reaper = start_reaper(self.marker)

    def stop(self) -> None:
        """Kill every process started here, their groups, descendants and marker holders (TERM, then KILL)."""
        stop_processes(self._procs, marker=self.marker or None)
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._reaper is not None:  # nothing left to watch over
            self._reaper.kill()
            self._reaper.wait()
            self._reaper = None
        if self._at_exit:
            atexit.unregister(self.stop)
            self._at_exit = False

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
