"""Submit a fedtab job to a running, provisioned NVIDIA FLARE project and fetch its result.

The analyst's side of a FLARE deployment (``fedtab run JOB --engine nvflare --flare-project KIT``):
a project provisioned with ``nvflare provision`` (the ``project.yml`` that ``fedtab deploy``
writes) gives its project admin a startup kit (``prod_00/admin@fedtab.org``: certificates
of the project's root CA, ``fed_admin.json``). With it :func:`run_on_project` opens a FLARE
API session (``nvflare.fuel.flare_api.new_secure_session``, mutual TLS), submits the job
built by :func:`fedtab.engines.nvflare.build_job`, waits until it is final, aborts it if it
is not final in time or on Ctrl-C, downloads the server's job workspace and reads the
``fedtab_result.json`` that :class:`~fedtab.engines.nvflare.FedtabController` wrote there.

Every participant must allow fedtab's components (:data:`~fedtab.engines.nvflare.FLARE_COMPONENTS` on
the ``class_allow_list`` of its ``local/resources.json``,
:func:`fedtab.engines.nvflare.allow_fedtab_components`), and the site paths in the job are
read at the sites (the FLARE job carries them to each site's executor).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .errors import RunError
from .nvflare import _RESULT_FILE, ERROR_FILE, build_job
from .site_config import site_config

__all__ = ["find_admin_kit", "run_on_project"]


def find_admin_kit(path: str | Path) -> tuple[Path, str]:
    """``(kit folder, user name)`` of the project admin's startup kit at or under ``path``.

    ``path`` is the admin's kit (it holds ``startup/fed_admin.json``), the provisioned
    folder that holds it (``prod_00``) or the provisioning workspace (``-w`` of
    ``nvflare provision``). The user name is the kit's ``admin.username``.

    Raises:
        ValueError: no admin kit there, or several (name the one to use).
    """
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"FLARE project: no such folder {root}")
    kits = sorted({f.parent.parent for pattern in ("startup/fed_admin.json", "*/startup/fed_admin.json",
                                                  "*/prod_*/*/startup/fed_admin.json")
                   for f in root.glob(pattern)})
    if not kits:
        raise ValueError(f"FLARE project {root}: no admin startup kit (startup/fed_admin.json) here; give the "
                         "project admin's kit, e.g. <workspace>/<project>/prod_00/admin@fedtab.org")
    if len(kits) > 1:
        raise ValueError(f"FLARE project {root}: several admin startup kits ({', '.join(map(str, kits))}); give one")
    kit = kits[0]
    try:
        user = json.loads((kit / "startup" / "fed_admin.json").read_text())["admin"]["username"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"FLARE admin kit {kit}: unreadable startup/fed_admin.json ({exc})") from None
    return kit, str(user)


def run_on_project(sites: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None, admin_kit: str | Path,
                   workdir: str | Path, *, timeout: float = 3600.0, connect_timeout: float = 60.0,
                   name: str = "fedtab", progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Submit ``build_job(sites, config)`` to the project, wait, return its result.

    Args:
        sites: one site config per FLARE client (``name`` = the client's name in the
            project; ``data-path`` etc. as read at that site).
        config: ``{"job": plan}`` (see :class:`~fedtab.engines.nvflare.FedtabController`).
        admin_kit: see :func:`find_admin_kit`.
        workdir: folder for the exported job and the downloaded workspace (created).
        timeout: seconds to wait for the job; it is aborted after that (and on Ctrl-C).
        connect_timeout: seconds to try to open the admin session.
        progress: gets the job id once submitted, then a line per exchange as the job goes.

    Returns:
        The workflow's JSON summary plus ``flare_job_id``.

    Raises:
        ValueError: no usable admin kit.
        RunError: the server cannot be reached, the job was refused, did not finish in
            time (then aborted), ended in another state than ``FINISHED:COMPLETED``, or
            left no result.
    """
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    kit, user = find_admin_kit(admin_kit)
    workdir = Path(workdir)
    jobs = workdir / "jobs"
    shutil.rmtree(jobs, ignore_errors=True)
    build_job(sites, config, name=name).export_job(str(jobs))
    try:
        session = new_secure_session(user, str(kit), timeout=connect_timeout)
    except Exception as exc:  # noqa: BLE001 - FLARE raises several types for an unreachable server
        raise RunError(f"cannot open a FLARE admin session as {user} with {kit}: {type(exc).__name__}: {exc}") from None
    try:
        _wait_for_sites(session, [str(site_config(s)["name"]) for s in sites], connect_timeout)
        try:
            job_id = session.submit_job(str(jobs / name))
        except Exception as exc:  # noqa: BLE001
            raise RunError(f"the FLARE server refused the job: {type(exc).__name__}: {exc}") from None
        if progress is not None:
            progress(f"submitted as FLARE job {job_id}")
        meta = _wait(session, job_id, timeout, progress)
        status = str(meta.get("status", ""))
        try:
            location = session.download_job_result(job_id, str(workdir / "download"))
        except Exception:  # noqa: BLE001 - a failed job may have no workspace to download
            if status == "FINISHED:COMPLETED":
                raise
            location = None
        if status != "FINISHED:COMPLETED":
            error = Path(location or "", "workspace", ERROR_FILE)
            why = f": {error.read_text()[:3000]}" if location and error.is_file() else (
                "; see the server's and sites' logs (does every participant's local/resources.json allow "
                "fedtab's components, FLARE_COMPONENTS? allow_fedtab_components)")
            raise RunError(f"FLARE job {job_id} ended as {status!r}{why}")
        result = Path(location or "", "workspace", _RESULT_FILE)
        if not location or not result.is_file():
            raise RunError(f"FLARE job {job_id} completed but its workspace holds no {_RESULT_FILE}")
        out = json.loads(result.read_text())
        out["flare_job_id"] = job_id
        return out
    finally:
        session.close()


def _wait_for_sites(session, names: Sequence[str], timeout: float) -> None:  # noqa: ANN001 - FLARE's Session
    """Wait until every site of the job is connected to the FLARE server: a job submitted
    before its clients registered ends ``FAILED_TO_RUN`` at once (a project just started).

    Raises:
        RunError: sites still not connected after ``timeout`` seconds, naming them.
    """
    deadline = time.monotonic() + timeout
    missing = list(names)
    while True:
        try:
            connected = {str(c.name) for c in session.get_connected_client_list()}
        except Exception:  # noqa: BLE001 - the server may not answer the status query yet
            connected = set()
        missing = [n for n in names if n not in connected]
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    if missing:
        raise RunError(f"FLARE sites {missing} are not connected to the server after {timeout:g} s (start their "
                       "clients, check their names against the project)")


#: how many times the job's monitoring may lose the admin connection (a busy server can drop one
#: status query: ``ERROR_SERVER_CONNECTION``) before the wait gives up; the job runs on meanwhile
MONITOR_RETRIES = 5


def _wait(session, job_id: str, timeout: float,  # noqa: ANN001 - FLARE's Session
          progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Wait until the job is final and return its meta; abort it on timeout and on Ctrl-C.

    While it runs, the controller's progress lines (``show_stats JOB server``, see
    :class:`~fedtab.engines.nvflare.FedtabController`) go to ``progress`` once each, as
    :func:`fedtab.engines.progress.describe` words them.

    A dropped admin connection while monitoring is retried (:data:`MONITOR_RETRIES` times, 2 s
    apart, within ``timeout``): the job runs on at the server whatever the admin's session does.

    Raises:
        RunError: not final within ``timeout`` seconds (the job is aborted), or the connection lost
            more than :data:`MONITOR_RETRIES` times.
    """
    from nvflare.fuel.flare_api.api_spec import MonitorReturnCode

    seen = [0]

    def report(sess, jid, meta, *_a, **_k) -> bool:  # noqa: ANN001 - FLARE's callback
        if progress is not None and str(meta.get("status", "")).startswith("RUNNING"):
            for event in _progress_events(sess, jid):
                if event.get("seq", 0) > seen[0]:
                    seen[0] = event["seq"]
                    progress(describe(event))
        return True

    from .progress import describe

    deadline, lost = time.monotonic() + timeout, 0
    while True:
        try:
            rc, meta = session.monitor_job_and_return_job_meta(
                job_id, timeout=max(deadline - time.monotonic(), 1.0), poll_interval=1.0, cb=report)
            break
        except KeyboardInterrupt:  # Ctrl-C: the job must not go on running on the server
            try:
                session.abort_job(job_id)
            finally:
                raise
        except Exception as exc:  # noqa: BLE001 - a dropped admin connection: the job runs on at the server
            lost += 1
            if lost > MONITOR_RETRIES or time.monotonic() >= deadline:
                raise RunError(f"lost the FLARE admin connection while job {job_id} ran ({lost} time(s)): "
                               f"{type(exc).__name__}: {exc}") from None
            time.sleep(2.0)
    if rc == MonitorReturnCode.TIMEOUT:
        try:
            session.abort_job(job_id)
        finally:
            raise RunError(f"FLARE job {job_id} did not finish within {timeout:g} s (aborted)") from None
    return meta


def _progress_events(session, job_id: str) -> list[dict[str, Any]]:  # noqa: ANN001 - FLARE's Session
    """The progress events in the server's stats of the job, in order (none if it cannot answer yet)."""
    from .nvflare import PROGRESS_STATS_KEY
    from .progress import parse_event

    try:
        stats = session.show_stats(job_id, "server")
    except Exception:  # noqa: BLE001 - a job that is starting or ending may not answer
        return []
    lines: list[str] = []
    todo = [stats]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            found = node.get(PROGRESS_STATS_KEY)
            if isinstance(found, list):
                lines.extend(x for x in found if isinstance(x, str))
            todo.extend(v for k, v in node.items() if k != PROGRESS_STATS_KEY)
    events = [e for e in map(parse_event, lines) if e is not None]
    return sorted(events, key=lambda e: e.get("seq", 0))
