"""A provisioned NVIDIA FLARE project on loopback: server + one client per site, mutual TLS.

For tests, benchmarks and trying a consortium setup on one machine, the way a real
consortium runs FLARE in production mode: the ``project.yml`` that ``fedtab deploy``
writes (:mod:`fedtab.deploy.flare_project`, server ``localhost``, free ports), FLARE's own
provisioner (``nvflare provision``: a startup kit per participant with certificates of the
project's root CA), each participant's ``local/resources.json`` allowing fedtab's
components and, for sites given by their config, the site's own ``local/fedtab-site.json``, then the server's and every client's own startup script
(``startup/sub_start.sh --once``: the provisioned command without the restart loop). The
project admin's kit (:attr:`LoopbackProject.admin_kit`) submits jobs
(:func:`fedtab.engines.nvflare_remote.run_on_project`).

Every process is started in its own session (``setsid``) with a marker in its environment;
:meth:`LoopbackProject.stop` kills the process groups, their descendants (FLARE's job
processes) and anything still carrying the marker. Every wait is bounded.

Example::

    with LoopbackProject(["site-1", "site-2"], workdir) as project:
        result = run_on_project(site_configs, config, project.admin_kit, workdir / "run")
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import RunError
from .processes import ProcessOwner

__all__ = ["LoopbackProject"]

_MARKER = "FEDTAB_FLARE_PROJECT"


class LoopbackProject(ProcessOwner):
    """A provisioned FLARE project (server ``localhost`` + one client per site) running on 127.0.0.1.

    Args:
        sites: the client names (= fedtab site names), or site configs (``name`` and the site's own
            keys: ``data-path``, ``test-path``, ``policy``, ``min-rows``), which are written into each
            site's kit as its ``local/fedtab-site.json``
            (:func:`fedtab.engines.nvflare.write_site_files`), as a real site keeps its own; a
            site given by name only has none (it reads the table the job names, under the
            default policy tightened by the job's).
        workdir: folder for ``project.yml``, the provisioned kits, logs (created; an
            earlier project there is replaced).
        start_timeout: seconds for provisioning, and again for the server and clients
            to be up (all clients seen by the admin session).
        bin_dir: where ``nvflare`` and ``python3`` live (default: next to this interpreter).

    Attributes:
        admin_kit: the project admin's startup kit (after :meth:`start`).
        kits: ``{participant: kit folder}`` (server ``localhost``, then the sites).
    """

    def __init__(self, sites: Sequence[str | Mapping[str, Any]], workdir: str | Path, *,
                 start_timeout: float = 180.0, bin_dir: str | Path | None = None) -> None:
        super().__init__()
        self.sites = [str(s["name"]) if isinstance(s, Mapping) else str(s) for s in sites]
        self.site_configs = {str(s["name"]): s for s in sites if isinstance(s, Mapping)}
        self.workdir = Path(workdir).resolve()
        self.start_timeout = start_timeout
        self.bin_dir = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        self.kits: dict[str, Path] = {}
        self.admin_kit: Path | None = None

    @property
    def marker(self) -> str:
        """``NAME=value`` in the environment of every process of this project."""
        return f"{_MARKER}={self.workdir}"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[_MARKER] = str(self.workdir)
        env["PATH"] = f"{self.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def provision(self) -> Path:
        """Write ``project.yml`` (free ports), run ``nvflare provision``, allow fedtab's
        components in every participant's kit; returns the provisioned folder.

        Raises:
            RunError: the provisioner failed or timed out.
        """
        from ..deploy.flare_project import write_project
        from .flower_deploy import free_port
        from .nvflare import allow_fedtab_components, write_site_files

        shutil.rmtree(self.workdir / "ws", ignore_errors=True)
        self.workdir.mkdir(parents=True, exist_ok=True)
        fed_port, admin_port = free_port(), free_port()
        while admin_port == fed_port:
            admin_port = free_port()
        project = write_project(self.workdir / "project.yml", self.sites, server="localhost",
                                fed_learn_port=fed_port, admin_port=admin_port)
        try:
            proc = subprocess.run([str(self.bin_dir / "nvflare"), "provision", "-p", str(project), "-w",
                                   str(self.workdir / "ws")], capture_output=True, text=True, env=self.env,
                                  cwd=self.workdir, timeout=self.start_timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise RunError(f"nvflare provision did not finish within {self.start_timeout:g} s") from None
        prod = self.workdir / "ws" / "fedtab" / "prod_00"
        if proc.returncode != 0 or not prod.is_dir():
            raise RunError(f"nvflare provision failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        self.kits = {name: prod / name for name in ["localhost", *self.sites]}
        for kit in self.kits.values():
            allow_fedtab_components(kit)
        for name, config in self.site_configs.items():
            write_site_files(self.kits[name], [config])
        self.admin_kit = prod / "admin@fedtab.org"
        return prod

    def start(self) -> "LoopbackProject":
        """Provision, start the server and the clients, wait until the admin sees every client.

        Raises:
            RunError: provisioning failed, a process exited, or the clients were not all
                connected within ``start_timeout`` seconds (logs are named).
        """
        self.provision()
        for name, kit in self.kits.items():
            self._spawn_logged(["bash", str(kit / "startup" / "sub_start.sh"), "--once"], self.workdir / f"{name}.log",
                               env=self.env, cwd=kit)
        self._wait_clients(time.monotonic() + self.start_timeout)
        return self

    def _wait_clients(self, deadline: float) -> None:
        from nvflare.fuel.flare_api.flare_api import new_secure_session

        from .nvflare_remote import find_admin_kit

        kit, user = find_admin_kit(self.admin_kit)
        seen: list[str] = []
        while time.monotonic() < deadline:
            dead = [n for n, p in zip(self.kits, self._procs) if p.poll() is not None]
            if dead:
                raise RunError(f"FLARE {', '.join(dead)} exited; see {self.workdir}/<participant>.log")
            try:
                session = new_secure_session(user, str(kit), timeout=max(1.0, min(10.0, deadline - time.monotonic())))
            except Exception:  # noqa: BLE001 - the server is not up yet
                time.sleep(1.0)
                continue
            try:
                while time.monotonic() < deadline:
                    seen = [c.name for c in session.get_system_info().client_info]
                    if set(self.sites) <= set(seen):
                        return
                    time.sleep(0.5)
            finally:
                session.close()
        raise RunError(f"FLARE clients connected within {self.start_timeout:g} s: {sorted(seen)} of {self.sites}; "
                       f"logs in {self.workdir}")
