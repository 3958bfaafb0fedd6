"""A real Flower deployment on loopback: one SuperLink, one SuperNode per site, ``flwr run``.

For tests, benchmarks and trying a consortium setup on one machine. By default it is
secured as a consortium should run it: the SuperLink serves TLS with a certificate of
the consortium's CA and accepts only registered SuperNodes (``--enable-supernode-auth``);
every SuperNode trusts only that CA (``--root-certificates``) and authenticates with its
site's key (``--auth-supernode-private-key``), registered beforehand with
``flwr supernode register``; the run config carries ``site-keys`` so the ServerApp names
each node by its key (see :mod:`fedtab.deploy.keys`). ``insecure=True`` runs the
plain-text, unauthenticated setup instead. Every process is
started in its own session (``setsid``) and its whole process group is killed on
exit, because SuperLink and SuperNode spawn SuperExec / ServerApp / ClientApp
children. Only 127.0.0.1 is used and every wait is bounded.

Pitfalls handled here: ``flwr run`` exits 0 even when the run fails, so the run is
polled with ``flwr ls --run-id ID --format json`` until it finishes and its status
is checked; connection settings live in ``$FLWR_HOME/config.toml`` (a throwaway
``FLWR_HOME``), never in a pyproject that ``flwr run`` could rewrite; telemetry,
update checks and runtime dependency installation are switched off.

Example::

    with LoopbackDeployment(node_configs, workdir) as dep:  # TLS + auth, keys in workdir/keys
        result = dep.run(run_config=engine_config(spec.plan()))  # fedtab.job.apps: a JobSpec's plan and its server app
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from .flower_remote import FLWR_ENV, RunError, SuperLinkClient, flwr_env, toml_value
from .processes import ProcessOwner

if TYPE_CHECKING:
    from ..deploy.keys import ConsortiumKeys

__all__ = ["DeploymentError", "LoopbackDeployment", "free_port", "superlink_args", "supernode_args"]

_ENV = FLWR_ENV
_toml_value = toml_value  # the name tests and older code import


class DeploymentError(RunError):
    """The deployment did not start, or the run did not complete (logs are named)."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, deadline: float, proc: subprocess.Popen, log: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeploymentError(f"process exited with {proc.returncode}; see {log}")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise DeploymentError(f"nothing listens on 127.0.0.1:{port}; see {log}")


def superlink_args(port: int, database: str | Path, keys: "ConsortiumKeys | None", host: str = "127.0.0.1",
                   ) -> list[str]:
    """``flower-superlink`` arguments (without the program): TLS + SuperNode auth with
    ``keys``, ``--insecure`` when ``keys`` is None."""
    args = ["--database", str(database), "--host", host, "--port", str(port)]
    if keys is None:
        return ["--insecure", *args]
    return ["--ssl-certfile", str(keys.superlink_cert), "--ssl-keyfile", str(keys.superlink_key),
            "--ssl-ca-certfile", str(keys.ca_cert), "--enable-supernode-auth", *args]


def supernode_args(superlink: str, node_config: Mapping[str, Any], port: int, *, root_certificates: str | Path | None,
                   private_key: str | Path | None) -> list[str]:
    """``flower-supernode`` arguments: trust ``root_certificates`` and authenticate with
    ``private_key`` (OpenSSH EC key), or ``--insecure`` when both are None."""
    node_cfg = " ".join(f"{k}={_toml_value(v)}" for k, v in node_config.items())
    tls = ["--insecure"] if root_certificates is None and private_key is None else []
    if root_certificates is not None:
        tls += ["--root-certificates", str(root_certificates)]
    if private_key is not None:
        tls += ["--auth-supernode-private-key", str(private_key)]
    return [*tls, "--superlink", superlink, "--host", "127.0.0.1", "--port", str(port), "--node-config", node_cfg]


#: node-config keys of a site's secure-aggregation identity (:mod:`fedtab.engines.site_config`)
_IDENTITY_NODE_KEYS = ("identity-key", "identity_key", "consortium-keys", "consortium_keys")

class LoopbackDeployment(ProcessOwner):
    """SuperLink + one SuperNode per node config, all on 127.0.0.1, TLS + auth by default.

    Args:
        node_configs: one ``--node-config`` mapping per SuperNode (site name, data path...).
        workdir: directory for ``FLWR_HOME``, keys, logs and results (created).
        app: the Flower app directory (default :func:`fedtab.engines.flower.app_dir`).
        bin_dir: where ``flower-superlink``, ``flower-supernode`` and ``flwr`` live
            (default: next to this Python interpreter).
        start_timeout: seconds to wait for the SuperLink and the SuperNodes.
        insecure: plain-text gRPC, no SuperNode authentication, nodes named by the
            ``name`` they declare (Flower's ``--insecure``).
        isolation: ``"subprocess"`` (Flower's default: each SuperNode starts its own SuperExec,
            which starts a ClientApp process per message) or ``"process"`` (``--isolation
            process``: the SuperExec is a separate long-running process started here next to
            each SuperNode; it still starts a ClientApp process per message in Flower 1.42).
        keys: the consortium's keys (:func:`fedtab.deploy.keys.write_consortium_keys`);
            default: generated into ``workdir/keys`` for the node configs' names.
            Node ``i`` authenticates with the key of its ``name``, and (unless its config
            names an identity of its own) gets that site's secure-aggregation identity
            (:meth:`~fedtab.deploy.keys.ConsortiumKeys.identity_config`), as an operator sets it.
            A node config without ``state-dir`` gets ``workdir/state/<name>`` (its ledger kept
            across the deployment's runs, as ``fedtab deploy`` writes it); ``state-dir=""``
            leaves a node without one.

    Attributes:
        node_ids: ``{site: Flower node id}`` given by ``flwr supernode register``.
    """

    def __init__(self, node_configs: Sequence[Mapping[str, Any]], workdir: str | Path, *, app: str | Path | None = None,
                 bin_dir: str | Path | None = None, start_timeout: float = 60.0, insecure: bool = False,
                 keys: "ConsortiumKeys | None" = None, isolation: str = "subprocess") -> None:
        super().__init__()
        if isolation not in ("subprocess", "process"):
            raise ValueError(f"isolation must be 'subprocess' or 'process', got {isolation!r}")
        self.isolation = isolation
        self.node_configs = [dict(c) for c in node_configs]
        self.workdir = Path(workdir)
        self.app = Path(app) if app is not None else None
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.start_timeout = start_timeout
        self.insecure = insecure
        self.keys = keys
        self.home = self.workdir / "flwr_home"
        self.port = 0
        self.client: SuperLinkClient | None = None  # the ``flwr`` connection, once started
        self.node_ids: dict[str, int] = {}

    # -- processes -----------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return flwr_env(self.home, self.bin_dir)

    @property
    def marker(self) -> str:
        """Every process of this deployment inherits its ``FLWR_HOME`` (see :meth:`stop`)."""
        return f"FLWR_HOME={self.home}"

    def _spawn(self, name: str, argv: list[str], path_first: str | Path | None = None) -> subprocess.Popen:
        # setsid: own process group, killed as a whole
        env = self.env
        if path_first is not None:  # e.g. a site's FAB guard (fedtab.engines.flower_guard)
            env["PATH"] = f"{Path(path_first).resolve()}{os.pathsep}{env['PATH']}"
        return self._spawn_logged(argv, self.workdir / f"{name}.log", env=env, cwd=self.workdir)

    def start(self) -> "LoopbackDeployment":
        """Start the SuperLink, register the sites' keys, start the SuperNodes; write
        ``$FLWR_HOME/config.toml`` (the ``fedtab`` connection used by ``flwr``).

        Raises:
            DeploymentError: a process exited or did not listen in time, or a key was not
                accepted by ``flwr supernode register``.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        for stale in self.workdir.glob("superlink.db*"):  # nodes of an earlier deployment would linger
            stale.unlink()
        if not self.insecure and self.keys is None:
            from ..deploy.keys import write_consortium_keys

            names = [str(c.get("name", f"node{i}")) for i, c in enumerate(self.node_configs)]
            self.keys = write_consortium_keys(self.workdir / "keys", names)
        self.port = free_port()
        self.client = SuperLinkClient(self.address, insecure=self.insecure, home=self.home, bin_dir=self.bin_dir,
                                      root_certificates=None if self.insecure else self.keys.ca_cert)
        deadline = time.monotonic() + self.start_timeout
        link = self._spawn("superlink", [str(self.bin_dir / "flower-superlink"),
                                         *superlink_args(self.port, self.workdir / "superlink.db",
                                                         None if self.insecure else self.keys)])
        _wait_port(self.port, deadline, link, self.workdir / "superlink.log")
        if not self.insecure:
            names = [str(c["name"]) for c in self.node_configs]
            self.node_ids.update(self.register(names, timeout=max(5.0, deadline - time.monotonic())))
        for i, cfg in enumerate(self.node_configs):
            key = None if self.insecure else self.keys.site_private[str(cfg["name"])]
            if not self.insecure and not any(k in cfg for k in _IDENTITY_NODE_KEYS):
                # as an operator sets them from `fedtab deploy`: the secure-aggregation identity
                cfg = {**self.keys.identity_config(str(cfg["name"])), **cfg}
            if not any(k in cfg for k in ("state-dir", "state_dir")):  # and a state folder (the site's ledger)
                cfg = {**cfg, "state-dir": str(self.workdir / "state" / str(cfg.get("name", f"node{i}")))}
            self.add_supernode(cfg, private_key=key, name=f"supernode{i}", deadline=deadline)
        return self

    def register(self, sites: Sequence[str], timeout: float = 60.0) -> dict[str, int]:
        """``flwr supernode register`` each site's public key (in parallel); ``{site: node id}``.

        Raises:
            DeploymentError: a registration failed or timed out.
        """
        procs = {site: subprocess.Popen([str(self.bin_dir / "flwr"), "supernode", "register",
                                         str(self.keys.site_public[site]), "fedtab", "--format", "json"],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env,
                                        cwd=self.workdir, start_new_session=True)
                 for site in sites}
        self._procs.extend(procs.values())  # killed by stop() if anything below fails
        out = {}
        for site, proc in procs.items():
            try:
                text, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise DeploymentError(f"flwr supernode register {site!r} did not finish within {timeout:g} s") from None
            try:
                out[site] = int(json.loads(text[text.index("{"):])["node-id"])
            except (ValueError, KeyError, TypeError):
                raise DeploymentError(f"flwr supernode register refused the key of site {site!r}: {text[-1000:]}") from None
        return out

    def add_supernode(self, node_config: Mapping[str, Any], *, private_key: str | Path | None = None,
                      root_certificates: str | Path | None = None, name: str | None = None,
                      deadline: float | None = None, wait: bool = True,
                      fab_guard: str | Path | None = None) -> subprocess.Popen:
        """Start one more SuperNode (stopped with the deployment); returns its process.

        ``root_certificates`` defaults to the consortium's CA (unless insecure);
        ``private_key`` is the OpenSSH EC key it authenticates with. With ``wait``, waits
        until its Runtime API listens (which does not mean the SuperLink accepted it).
        ``fab_guard``: a folder of :func:`fedtab.engines.flower_guard.write_fab_guard`, put first
        on the SuperNode's ``PATH`` (and its SuperExec's): its ClientApps run only pinned FABs.
        """
        name = name or f"supernode-extra{len(self._procs)}"
        if root_certificates is None and not self.insecure:
            root_certificates = self.keys.ca_cert
        node_port = free_port()
        isolation = ["--isolation", "process"] if self.isolation == "process" else []
        proc = self._spawn(name, [str(self.bin_dir / "flower-supernode"), *isolation,
                                  *supernode_args(f"127.0.0.1:{self.port}", node_config, node_port,
                                                  root_certificates=root_certificates, private_key=private_key)],
                           path_first=fab_guard)
        if wait or isolation:
            _wait_port(node_port, deadline or time.monotonic() + self.start_timeout, proc, self.workdir / f"{name}.log")
        if isolation:  # the ClientApps' executor, long-running, talking to the SuperNode's Runtime API
            self._spawn(f"{name}-superexec", [str(self.bin_dir / "flower-superexec"), "--insecure",
                                              "--runtime-api-address", f"127.0.0.1:{node_port}"], path_first=fab_guard)
        return proc

    def _stragglers(self) -> set[int]:
        """Processes that inherited this deployment's ``FLWR_HOME`` (so were started by it)."""
        return self.stragglers()

    # -- runs ------------------------------------------------------------------------------
    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``: where SuperNodes and ``flwr`` reach the SuperLink."""
        return f"127.0.0.1:{self.port}"

    def run_log(self, run_id: int) -> str:
        """The run's log as ``flwr log --show`` prints it (empty if unavailable); saved in ``workdir``."""
        return self.client.log(run_id, save_to=self.workdir / f"run-{run_id}.log")

    def run(self, run_config: Mapping[str, Any] | None = None, *, timeout: float = 300.0,
            poll: float = 0.2, status_every: float = 5.0, app: str | Path | None = None) -> dict[str, Any]:
        """``flwr run`` the app (``app``, default the deployment's), wait until the run
        finishes, return its JSON summary (plus ``run_id`` and ``run_seconds``: from
        ``flwr run`` until the result file exists).

        The ServerApp writes its summary to ``result-path`` (set here to a file in
        ``workdir``); ``min-sites`` defaults to the number of SuperNodes.

        Waiting: the result file is looked for every ``poll`` seconds (cheap); the run's
        status is asked with ``flwr ls``, to notice a failed run, first after ``status_every``
        seconds and then at doubling intervals up to 30 s (each ``flwr ls`` is a Python process
        of about a CPU second, taken from the run it watches), and once the result exists
        (see :meth:`SuperLinkClient.wait`).

        Raises:
            DeploymentError: ``flwr run`` failed, the run ended in another state than
                ``finished:completed`` or did not finish within ``timeout`` seconds.
        """
        result_path = self.workdir / f"result-{time.time_ns()}.json"
        cfg = {"min-sites": len(self.node_configs), **dict(run_config or {}), "result-path": str(result_path)}
        if not self.insecure:
            cfg.setdefault("site-keys", json.dumps(self.keys.fingerprints()))
        started = time.perf_counter()
        finished: list[float] = []

        def done() -> bool:
            if not finished and result_path.is_file():
                finished.append(time.perf_counter() - started)
            return bool(finished)

        try:
            run_id = self.client.submit(cfg, app=app or self.app, timeout=timeout)
            status = self.client.wait(run_id, timeout=max(1.0, timeout - (time.perf_counter() - started)), poll=poll,
                                      status_every=status_every, done=done)
        except RunError as exc:
            raise DeploymentError(f"{exc}; logs in {self.workdir}") from None
        if status != "finished:completed":
            raise DeploymentError(str(self.client.failure(run_id, f"ended as {status!r}", logs=self.workdir)))
        if not result_path.is_file():
            raise DeploymentError(f"Flower run {run_id} completed but wrote no result to {result_path}")
        out = json.loads(result_path.read_text())
        out["run_id"] = run_id
        out["run_seconds"] = finished[0] if finished else time.perf_counter() - started
        return out
