"""Submit a run to a Flower SuperLink the consortium already runs, wait, fetch its result.

The analyst's side of a deployment (``fedtab run JOB --engine flower --superlink HOST:PORT``):
:class:`SuperLinkClient` describes the connection in a throwaway ``$FLWR_HOME/config.toml``
(address plus ``root-certificates``, or ``insecure`` only when asked), starts the run with
``flwr run``, follows the run's log stream until the run is final and checks its status
with ``flwr ls`` (``flwr run`` returns as soon as the run is submitted and exits 0 even if
the run later fails), printing the progress lines the ServerApp writes into that log
(:mod:`fedtab.engines.progress`) as they come, stops the run (``flwr stop``) when it is not
final in time or on Ctrl-C, and reads the result back
from the run's log (``flwr log RUN --show``), where fedtab's ServerApp writes it when
the run config says ``result-log = true`` (:mod:`fedtab.engines.result_log`). Only the
SuperLink's Control API is used, so the analyst needs no access to the coordinator's
files. Every ``flwr`` call is a child process in its own session with a timeout.

Example::

    client = SuperLinkClient("coordinator.example.org:9093", root_certificates="ca.pem", home=tmp)
    result = client.run({"min-sites": 3, "site-keys": keys_json}, timeout=3600, progress=print)
    result = client.attach(run_id, timeout=3600)  # a run submitted earlier (fedtab attach)
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from .errors import RunError
from .result_log import ResultLogError, decode_result

__all__ = ["FLWR_ENV", "RunError", "SuperLinkClient", "flwr_env", "toml_value"]

#: environment of every Flower process fedtab starts
FLWR_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    # SuperExec looks for new ClientApp/ServerApp tasks once a second by default. 0.25 s
    # cuts that wait; 0.1 s cost three idle SuperNodes 0.20 CPU-s per second (0.04 at 1 s),
    # CPU that the ClientApp processes of a 2-core machine need.
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25",
}

#: the connection's name in the throwaway ``$FLWR_HOME/config.toml``
CONNECTION = "fedtab"


def flwr_env(home: str | Path, bin_dir: str | Path) -> dict[str, str]:
    """This process's environment plus :data:`FLWR_ENV`, ``FLWR_HOME=home`` and ``bin_dir`` first on ``PATH``."""
    env = dict(os.environ)
    env.update(FLWR_ENV)
    env["FLWR_HOME"] = str(home)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def toml_value(v: Any) -> str:
    """A value for Flower's ``--run-config`` / ``--node-config`` ``key=value`` strings.

    Flower splits those strings with a regex that ends a quoted value at the next quote
    of the same kind and never unescapes, so a string (e.g. a JSON object) is written as
    a TOML literal string ``'...'`` when it has no single quote, else as a basic string
    when it has no double quote.

    Raises:
        ValueError: a string with both quote kinds or a line break (Flower cannot parse it).
    """
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    text = str(v)
    if "\n" in text or "\r" in text or ("'" in text and '"' in text):
        raise ValueError(f"Flower's key=value config cannot carry the string {text!r}")
    return f"'{text}'" if "'" not in text else json.dumps(text)


class SuperLinkClient:
    """``flwr`` commands against one SuperLink, with their own ``FLWR_HOME``.

    Args:
        address: ``HOST:PORT`` of the SuperLink's Control API (``flower-superlink``
            serves it on port 9093 by default).
        root_certificates: the consortium's CA certificate (PEM) that signed the
            SuperLink's certificate; required unless ``insecure``.
        insecure: plain-text gRPC (Flower's ``--insecure`` SuperLink); only when asked.
        home: ``FLWR_HOME`` for the ``flwr`` calls (created; ``config.toml`` is written).
        bin_dir: where ``flwr`` lives (default: next to this Python interpreter).

    Raises:
        ValueError: neither ``root_certificates`` nor ``insecure``, both, or a CA file
            that does not exist.
    """

    def __init__(self, address: str, *, root_certificates: str | Path | None = None, insecure: bool = False,
                 home: str | Path, bin_dir: str | Path | None = None) -> None:
        if insecure == (root_certificates is not None):
            raise ValueError("give the consortium's CA certificate (root_certificates) or insecure=True, not both"
                             if insecure else "a TLS SuperLink needs root_certificates (the consortium's CA "
                             "certificate); insecure=True only for a SuperLink started with --insecure")
        host, _, port = str(address).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"SuperLink address must be HOST:PORT, got {address!r}")
        if root_certificates is not None and not Path(root_certificates).is_file():
            raise ValueError(f"root certificates: no such file {root_certificates}")
        self.address = str(address)
        self.root_certificates = Path(root_certificates).resolve() if root_certificates is not None else None
        self.insecure = insecure
        self.home = Path(home)
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.home.mkdir(parents=True, exist_ok=True)
        tls = "insecure = true" if insecure else f"root-certificates = {json.dumps(str(self.root_certificates))}"
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = {json.dumps(self.address)}\n{tls}\n'
        )

    @property
    def env(self) -> dict[str, str]:
        """The environment of every ``flwr`` call (this client's ``FLWR_HOME``, quiet Flower)."""
        return flwr_env(self.home, self.bin_dir)

    def flwr(self, args: list[str], timeout: float) -> subprocess.CompletedProcess:
        """``flwr ARGS`` (connection :data:`CONNECTION` is this client's); raises ``TimeoutExpired``."""
        return subprocess.run([str(self.bin_dir / "flwr"), *args], capture_output=True, text=True, env=self.env,
                              cwd=self.home, timeout=timeout, start_new_session=True)

    def submit(self, run_config: Mapping[str, Any], app: str | Path | None = None, timeout: float = 120.0) -> int:
        """``flwr run APP`` with ``run_config`` overrides; returns the run id.

        Raises:
            RunError: ``flwr run`` did not return a run id (refused connection, bad
                certificate, unknown config key...), or did not finish within ``timeout``.
        """
        from .flower import app_dir

        override = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        try:
            proc = self.flwr(["run", str(app or app_dir()), CONNECTION, "--run-config", override, "--format", "json"],
                             timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunError(f"flwr run against {self.address} did not return within {timeout:g} s") from None
        try:
            return int(json.loads(proc.stdout)["run-id"])
        except (ValueError, KeyError, TypeError):
            tail = (proc.stdout + proc.stderr).strip()[-2000:]
            raise RunError(f"flwr run against {self.address} failed (exit {proc.returncode}): {tail}") from None

    def status(self, run_id: int) -> str:
        """The run's status as ``flwr ls`` reports it (``""`` if it cannot be read)."""
        try:
            ls = self.flwr(["ls", "--run-id", str(run_id), "--format", "json"], timeout=60)
            runs = json.loads(ls.stdout).get("runs", [])
            return str(runs[0].get("status", "")) if runs else ""
        except (subprocess.TimeoutExpired, ValueError, AttributeError):
            return ""

    def log(self, run_id: int, save_to: str | Path | None = None) -> str:
        """The run's log as ``flwr log RUN --show`` prints it (empty if unavailable)."""
        try:
            proc = self.flwr(["log", str(run_id), CONNECTION, "--show"], timeout=120)
        except subprocess.TimeoutExpired:
            return ""
        text = proc.stdout + proc.stderr
        if save_to is not None:
            Path(save_to).write_text(text)
        return text

    def wait(self, run_id: int, *, timeout: float, poll: float = 0.2, status_every: float = 5.0,
             done: Callable[[], bool] | None = None, max_status_every: float = 30.0) -> str:
        """Wait until the run is final; returns its status (``finished:completed`` on success).

        The status is asked with ``flwr ls`` (a new Python process each time, about a CPU
        second on a small machine, which would slow the run it watches): first after
        ``status_every`` seconds, then at twice the previous interval each time the run is
        still going, up to ``max_status_every`` seconds (a run that fails at once is noticed
        at the first check, a long run costs a few processes instead of one every
        ``status_every`` seconds); and at once whenever ``done()`` turns true (e.g. the run's result file
        appeared). ``done`` is checked every ``poll`` seconds.

        Raises:
            RunError: the run was not final within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        every = status_every
        next_status = time.monotonic() + every
        while time.monotonic() < deadline:
            if time.monotonic() >= next_status or (done is not None and done()):
                status = self.status(run_id)
                if status.startswith("finished"):
                    return status
                every = min(2 * every, max(status_every, max_status_every))
                next_status = time.monotonic() + every
            time.sleep(poll)
        raise RunError(f"Flower run {run_id} on {self.address} did not finish within {timeout:g} s")

    def follow(self, run_id: int, *, timeout: float, min_interval: float = 5.0,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> str:
        """Wait until the run is final by following its log; returns its status.

        ``flwr log RUN --stream`` is one process that the SuperLink answers until the run
        finishes, so a long run costs one process instead of a ``flwr ls`` every few
        seconds. Each progress line the ServerApp writes into that log
        (:mod:`fedtab.engines.progress`) is passed to ``on_event`` as it arrives, once
        (a restarted stream repeats the log from its start; events are told apart by
        their ``seq``). When the stream ends (run finished, or the connection dropped) the
        status is asked once; a stream that ends early is restarted, at most every
        ``min_interval`` seconds.

        Raises:
            RunError: the run was not final within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        seen = [0]

        def deliver(event: dict[str, Any]) -> None:
            if on_event is not None and event.get("seq", 0) > seen[0]:
                seen[0] = event["seq"]
                on_event(event)

        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RunError(f"Flower run {run_id} on {self.address} did not finish within {timeout:g} s")
            started = time.monotonic()
            self._stream(run_id, remaining, deliver)
            status = self.status(run_id)
            if status.startswith("finished"):
                return status
            time.sleep(max(0.0, min(min_interval - (time.monotonic() - started), deadline - time.monotonic())))

    def _stream(self, run_id: int, timeout: float, deliver: Callable[[dict[str, Any]], None]) -> None:
        """Run ``flwr log RUN --stream`` until it ends or ``timeout``, passing its progress events
        to ``deliver`` from this thread (a reader thread only queues them); the process is killed
        on the way out, Ctrl-C included."""
        from .progress import parse_event

        events: queue.Queue = queue.Queue()
        proc = subprocess.Popen([str(self.bin_dir / "flwr"), "log", str(run_id), CONNECTION, "--stream"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, errors="replace",
                                env={**self.env, "PYTHONUNBUFFERED": "1"}, cwd=self.home, start_new_session=True)

        def read() -> None:
            for line in proc.stdout:
                event = parse_event(line)
                if event is not None:
                    events.put(event)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        end = time.monotonic() + timeout
        try:
            while time.monotonic() < end and (proc.poll() is None or reader.is_alive() or not events.empty()):
                try:
                    deliver(events.get(timeout=0.2))
                except queue.Empty:
                    pass
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(timeout=5)

    def stop(self, run_id: int) -> str:
        """``flwr stop RUN``: ask the SuperLink to stop the run; returns ``""`` when it did, else why not."""
        try:
            proc = self.flwr(["stop", str(run_id), CONNECTION, "--format", "json"], timeout=60)
        except subprocess.TimeoutExpired:
            return "flwr stop did not return within 60 s"
        try:
            if json.loads(proc.stdout).get("success") is True:
                return ""
        except (ValueError, AttributeError):
            pass
        return (proc.stdout + proc.stderr).strip()[-500:] or f"flwr stop exited {proc.returncode}"

    def failure(self, run_id: int, what: str, logs: str | Path | None = None) -> RunError:
        """A :class:`RunError` for run ``run_id`` with the tail of its ServerApp log."""
        tail = self.log(run_id)[-3000:]
        where = f"; logs in {logs}" if logs else ""
        return RunError(f"Flower run {run_id} on {self.address} {what}{where}; ServerApp log tail:\n{tail}")

    def attach(self, run_id: int, *, timeout: float = 3600.0, status_every: float = 5.0,
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Wait for submitted run ``run_id`` (:meth:`follow`) and return its JSON result read from its log.

        ``progress`` gets a line per exchange (:func:`fedtab.engines.progress.describe`). On
        timeout, and on Ctrl-C (``KeyboardInterrupt``, re-raised), the run is stopped on the
        SuperLink (:meth:`stop`). The returned dict gains ``run_id``.

        Raises:
            RunError: the run did not finish within ``timeout`` (then stopped), ended in
                another state than ``finished:completed``, or left a log without a readable
                result (:func:`fedtab.engines.result_log.decode_result`).
        """
        from .progress import describe

        on_event = None if progress is None else (lambda event: progress(describe(event)))
        try:
            status = self.follow(run_id, timeout=timeout, min_interval=status_every, on_event=on_event)
        except RunError:
            why = self.stop(run_id)
            stopped = "stopped on the SuperLink" if not why else f"could not be stopped: {why}"
            raise self.failure(run_id, f"did not finish within {timeout:g} s ({stopped})") from None
        except KeyboardInterrupt:
            self.stop(run_id)
            raise
        if status != "finished:completed":
            raise self.failure(run_id, f"ended as {status!r}")
        try:
            out = decode_result(self.log(run_id))
        except ResultLogError as exc:
            raise RunError(f"Flower run {run_id} on {self.address} completed but {exc}") from None
        out["run_id"] = run_id
        return out

    def run(self, run_config: Mapping[str, Any], *, app: str | Path | None = None, timeout: float = 3600.0,
            status_every: float = 5.0, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Submit (with ``result-log = true``: fedtab's ServerApp then prints its progress and its
        result into its log), then :meth:`attach`; ``progress`` also gets the run id once submitted.

        Raises:
            RunError: as :meth:`submit` and :meth:`attach`.
        """
        run_id = self.submit({**dict(run_config), "result-log": True}, app=app)
        if progress is not None:
            progress(f"submitted as Flower run {run_id} (fedtab attach {run_id} follows it again)")
        return self.attach(run_id, timeout=timeout, status_every=status_every, progress=progress)
