"""NVIDIA FLARE 2.9 engine: a Controller that drives fedtab workflows, an Executor per site.

Needs the ``nvflare`` extra (``pip install fedtab[nvflare]``); ``import fedtab`` does not
import this module.

* :class:`FedtabController` runs the server app its ``config`` names (``server-app``, written by
  the job's side: :func:`fedtab.job.apps.engine_config`) on a :class:`FlareFederation`, whose
  :meth:`~FlareFederation.ask` sends each request as a FLARE task to the named clients
  and waits for all of them. It writes the JSON summary to ``fedtab_result.json`` in
  the server's run directory and, if given, to ``result_path``.
* :class:`FedtabExecutor` builds the client's :class:`~fedtab.federation.site.core.Site` from
  the site's own configuration, ``local/fedtab-site.json`` (:data:`SITE_FILE`: its data files,
  disclosure policy, state folder, identity) over its job arguments (keys of
  :mod:`fedtab.engines.site_config`; the site name is the FLARE client name): the job is written
  by the server's side, so its keys fill in only what the site's file leaves out and its policy
  settings can only tighten the site's. Its secure-aggregation identity comes from ``local/``
  too (:data:`SITE_FILE` or :data:`IDENTITY_FILE`), never from the job. Per-site state survives
  between tasks even when FLARE rebuilds the executor: the live site is kept per
  process and job, and its state is also written to the client's run directory after
  every task (arrays + JSON, see :mod:`fedtab.engines.site_state`).
* Payloads are :meth:`Message.to_bytes` in the task's Shareable (``bytes`` travel
  natively in FLARE's serialiser) — never pickle.
* :func:`build_job` returns a ``FedJob`` for N sites; :func:`run_simulator` runs it with
  ``simulator_run(..., threads=N)``, checks the return code (the simulator does not
  raise on failure) and returns the summary.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.impl.controller import Controller, Task
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.signal import Signal

from fedtab.federation.protocol.messages import Message, MessageError
from ..federation.protocol import Federation, FederationError, Traffic
from ..federation.site.core import RowSplit
from .errors import RunError
from .site_config import (IDENTITY_KEYS, SPLIT_KEYS, build_site, own_over_job, own_split, site_config,
                          split_differs)
from .site_state import SiteCache, decode_state, encode_state

__all__ = ["allow_fedtab_components", "FLARE_COMPONENTS", "FedtabController", "FedtabExecutor", "FlareFederation",
           "RowSplit", "SITE_FILE", "local_site_config", "write_site_files",
           "SimulatorError", "STATE_FOLDER", "build_job", "flare_run_id", "provision_identities", "run_simulator", "site_state_dir"]

TASK_NAME = "fedtab"
#: how a job reads a site's table: the executor's ``reading`` argument (``{key: value}``)
READING_KEYS = ("na_values", "label_map", "sep", "decimal", "task")
_PAYLOAD = "fedtab"
_RESULT_FILE = "fedtab_result.json"
#: written to the server's run directory when the workflow raises (the exception's type and text)
ERROR_FILE = "fedtab_error.txt"
_STATE_FILE = "fedtab_site_state.bin"
#: a FLARE site's default state folder (its ledger), in its own ``local/`` folder, which outlives jobs
STATE_FOLDER = "fedtab-state"
#: the site's own configuration, in its own ``local/`` folder (a FLARE job is written by the server's
#: side): a JSON object of site-config keys (:mod:`fedtab.engines.site_config`: ``data-path``,
#: ``test-path``, ``state-dir``, ``policy``, ``min-rows``, the identity keys, and any other key the
#: site pins), or ``{site: {...}}`` for several sites. Its keys win over the job's; the job's
#: policy can only tighten its policy (:func:`fedtab.engines.site_config.own_over_job`).
SITE_FILE = "fedtab-site.json"
#: the site's secure-aggregation identity, in its own ``local/`` folder (not the job's):
#: ``{"identity-key": ..., "consortium-keys": ..., "root-certificates": ...}`` (site-config
#: keys, see :mod:`fedtab.engines.site_config`; relative paths are files in ``local/``), or
#: ``{site: {...}}`` for several sites
IDENTITY_FILE = "fedtab-identity.json"

_SITES = SiteCache()
log = logging.getLogger("fedtab.engines.nvflare")


#: the key of fedtab's progress lines in the server's ``show_stats``, and how many are kept there
PROGRESS_STATS_KEY = "fedtab_progress"
PROGRESS_KEPT = 200


class SimulatorError(RunError):
    """The FLARE simulator returned a non-zero code or the job wrote no result."""


# ----------------------------------------------------------------------------- server side
class FlareFederation(Federation):
    """The FLARE clients of a running job, seen through a controller.

    Args:
        controller: the running :class:`~nvflare.apis.impl.controller.Controller`.
        fl_ctx, abort_signal: the controller's ``control_flow`` arguments.
        sites: client names taking part (default: every client of the job).
        timeout: seconds one :meth:`ask` may take; sites that did not answer by then get
            an error reply.
    """

    def __init__(self, controller: Controller, fl_ctx: FLContext, abort_signal: Signal,
                 sites: Sequence[str] | None = None, *, timeout: float = 600.0, poll: float = 0.02) -> None:
        super().__init__()
        self.controller, self.fl_ctx, self.abort_signal = controller, fl_ctx, abort_signal
        if sites is None:
            sites = [c.name for c in fl_ctx.get_engine().get_clients()]
        self._sites = sorted(str(s) for s in sites)
        if not self._sites:
            raise FederationError("the FLARE job has no clients")
        self.timeout, self.poll = float(timeout), float(poll)
        #: ``fn(kind, answered, asked)`` after each :meth:`ask` (the controller's progress lines)
        self.on_exchange: Callable[[str, int, int], None] | None = None

    @property
    def sites(self) -> list[str]:
        return list(self._sites)

    def ask(self, requests: Mapping[str, Message]) -> dict[str, Message]:
        replies: dict[str, Message] = {}
        groups: dict[int, tuple[Message, list[str]]] = {}
        for name, req in requests.items():
            if name not in self._sites:
                replies[name] = Message.error(f"no site called {name!r} in this federation")
                continue
            groups.setdefault(id(req), (req, []))[1].append(name)  # a broadcast is one task
        tasks = []
        for req, names in groups.values():
            data = Shareable()
            data[_PAYLOAD] = req.to_bytes()
            task = Task(name=TASK_NAME, data=data, timeout=int(self.timeout))
            self.controller.broadcast(task, self.fl_ctx, targets=names, min_responses=len(names),
                                      wait_time_after_min_received=0)
            tasks.append((task, req, names))
        deadline = time.monotonic() + self.timeout + 5
        while any(t.completion_status is None for t, _, _ in tasks):
            if self.abort_signal.triggered:
                raise FederationError("the FLARE job was aborted")
            if time.monotonic() > deadline:
                break
            time.sleep(self.poll)
        for task, req, names in tasks:
            got = {}
            for ct in task.client_tasks:
                if ct.result is None:
                    continue
                rc = ct.result.get_return_code()
                if rc != ReturnCode.OK or _PAYLOAD not in ct.result:
                    got[ct.client.name] = Message.error(f"FLARE return code {rc}")
                    continue
                try:
                    got[ct.client.name] = Message.from_bytes(ct.result[_PAYLOAD])
                except (MessageError, TypeError) as exc:
                    got[ct.client.name] = Message.error(f"undecodable reply: {exc}")
            for name in names:
                reply = got.get(name) or Message.error(f"no reply (task {task.completion_status})")
                self.traffic.records.append(Traffic(name, req.kind, req.nbytes(), reply.nbytes()))
                replies[name] = reply
        if self.on_exchange is not None and requests:
            self.on_exchange(next(iter(requests.values())).kind,
                             sum(not replies[n].is_error for n in requests), len(requests))
        return {name: replies[name] for name in requests}


class FedtabController(Controller):
    """Runs the server app its ``config`` names on the job's clients (:mod:`fedtab.engines.server_apps`).

    Args:
        config: the run configuration (the mapping, or it as JSON text): ``server-app``, the
            ``"module:function"`` of the server app, and what the app reads — for a fedtab job
            ``{"job": plan, "server-app": ...}`` as :func:`fedtab.job.apps.engine_config` writes it
            (the plan, :meth:`fedtab.job.spec.JobSpec.plan`, as JSON text). The app's progress
            lines go to the server's log and FLARE's ``show_stats``.
        min_sites: clients that must be connected before the workflow starts.
        timeout: seconds per request round.
        result_path: also write the JSON summary there.
    """

    def __init__(self, config: Any = None, min_sites: int = 1, timeout: float = 600.0,
                 result_path: str = "") -> None:
        super().__init__(task_check_period=0.05)
        self.config = config if config is not None else {}
        self.min_sites = min_sites
        self.timeout = timeout
        self.result_path = result_path
        self.result: dict[str, Any] | None = None
        #: the run's progress lines (:mod:`fedtab.engines.progress`), for FLARE's ``show_stats``
        self.progress_lines: list[str] = []

    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        """Answer FLARE's stats query (``show_stats JOB server``) with the latest progress lines."""
        super().handle_event(event_type, fl_ctx)
        from nvflare.widgets.info_collector import InfoCollector

        if event_type == InfoCollector.EVENT_TYPE_GET_STATS:
            collector = fl_ctx.get_prop(InfoCollector.CTX_KEY_STATS_COLLECTOR, None)
            if collector is not None:
                collector.add_info(group_name="fedtab", info={PROGRESS_STATS_KEY: self.progress_lines[-PROGRESS_KEPT:]})

    def start_controller(self, fl_ctx: FLContext) -> None:
        pass

    def stop_controller(self, fl_ctx: FLContext) -> None:
        pass

    def process_result_of_unknown_task(self, client, task_name, client_task_id, result, fl_ctx) -> None:  # noqa: ANN001
        self.log_warning(fl_ctx, f"result of unknown task {task_name!r} from {client.name}")

    def control_flow(self, abort_signal: Signal, fl_ctx: FLContext) -> None:
        cfg = json.loads(self.config) if isinstance(self.config, str) else dict(self.config)
        engine = fl_ctx.get_engine()
        deadline = time.monotonic() + 120
        while len(engine.get_clients()) < self.min_sites and time.monotonic() < deadline:
            time.sleep(0.2)
        t0 = time.perf_counter()
        fed = FlareFederation(self, fl_ctx, abort_signal, timeout=self.timeout)
        if len(fed.sites) < self.min_sites:
            raise FederationError(f"{len(fed.sites)} FLARE client(s) connected, {self.min_sites} needed")
        try:
            from .server_apps import SERVER_APP_KEY, load_server_app

            app = load_server_app(cfg.get(SERVER_APP_KEY))  # named by the job's side, never by this engine
            result = dict(app(fed, cfg, lambda line: (self.progress_lines.append(line), self.log_info(fl_ctx, line))))
        except Exception as exc:  # the job fails; its workspace tells an admin who downloads it why
            run_dir = engine.get_workspace().get_run_dir(fl_ctx.get_job_id())
            Path(run_dir, ERROR_FILE).write_text(f"{type(exc).__name__}: {exc}")
            raise
        result["engine"] = "nvflare"
        result["seconds_total"] = time.perf_counter() - t0
        down, up = fed.traffic.total()
        result["bytes"] = {"down": down, "up": up}
        self.result = result
        text = json.dumps(result, indent=2)
        run_dir = engine.get_workspace().get_run_dir(fl_ctx.get_job_id())
        Path(run_dir, _RESULT_FILE).write_text(text)
        if self.result_path:
            Path(self.result_path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.result_path).write_text(text)
        self.log_info(fl_ctx, f"fedtab workflow finished in {result['seconds_total']:.2f} s")


# ----------------------------------------------------------------------------- client side
#: the class paths of fedtab's FLARE job components, for a site's ``class_allow_list``
#: (:func:`allow_fedtab_components`): the controller and executor (``fedtab.engines.``) and the one
#: class of a site's row split, :class:`~fedtab.federation.site.core.RowSplit`, which a site's
#: executor takes as a component of its own — allowed by its exact path, not its package
FLARE_COMPONENTS = ("fedtab.engines.", f"{RowSplit.__module__}.{RowSplit.__qualname__}")

#: the site config keys :class:`FedtabExecutor` takes as one :class:`~fedtab.federation.site.core.RowSplit`
#: (:data:`fedtab.engines.site_config.SPLIT_KEYS`; FLARE writes it into the job as a component of its
#: own, ``{"path", "args"}``, which the site builds back: its class path is on a fedtab site's allow
#: list, :data:`FLARE_COMPONENTS`). The site ignores it unless it equals its own split.


class FedtabExecutor(Executor):
    """Answers fedtab tasks with the client's :class:`~fedtab.federation.site.core.Site`.

    Args (the site config; the site's name is the FLARE client name):
        data_path: the site's CSV/Parquet file. target: label column ("" = none).
        test_path: optional held-out rows (then no random split).
        selector: the site's selector (name, ``{"name", "params"}`` dict or alias).
        split: the job's :class:`RowSplit` (``test_size``, ``seed``, ``folds``): ignored, and logged
            when it differs from the site's own. How a site draws its row parts is its own
            (:func:`~fedtab.engines.site_config.own_split`): the ``test-size``, ``seed`` and ``folds``
            of its ``local/`` :data:`SITE_FILE`, else 0.2, 5 folds and a secret seed it draws once and
            keeps in its state folder (a server that varied the seed or test size between two jobs
            could otherwise difference releases over two test parts that differ by a few rows).
        min_rows, policy: settings that may only *tighten* the site's own disclosure policy (see
            below); a job asking for less (a lower ``min_rows``, ``allow_server_row_sets``, a
            require flag off) changes nothing at the site, and the site logs what it ignored.
        state_dir: ignored (a warning says so when set): the job is written by the server's side,
            which must not choose where a site keeps its ledger (a fresh folder per job would reset
            its ε budget). The site's state folder is the ``state-dir`` of its own ``local/``
            :data:`SITE_FILE` (or :data:`IDENTITY_FILE`), by default ``local/``:data:`STATE_FOLDER`.
        reading: how the job reads the site's table, ``{key: value}`` of :data:`READING_KEYS`
            (``na_values``, the strings read as missing, see
            :func:`~fedtab.engines.site_config.parse_na_values`; ``label_map``; the CSV's ``sep`` and
            ``decimal`` mark; ``task`` ``classes``/``regression``;
            keys a job may set, :data:`~fedtab.engines.site_config.JOB_SITE_KEYS`); the site's own
            file wins where it sets them.

    Every argument is what the *job* says, and the job is written by whoever submits it. The site's
    own configuration is its ``local/`` :data:`SITE_FILE` (:func:`local_site_config`): each key it sets
    wins over the job's (``data-path``, ``test-path``, identity, any key it pins), and its policy
    (``policy`` + ``min-rows``; the defaults of :class:`~fedtab.privacy.policy.DisclosurePolicy`
    without one) is the floor a job's settings can only raise
    (:func:`~fedtab.engines.site_config.own_over_job`). A key the site's file does not set is taken
    from the job (a site without the file reads the table the job names).

    The site answers each task with ``Site.run_id`` = ``"flare:<job id>"``: the ledger's per-run
    caps count per FLARE job; its ε budget composes over the jobs of the period.
    """

    def __init__(self, data_path: str, target: str = "", test_path: str = "", selector: Any = "lasso",
                 split: RowSplit | None = None, min_rows: Any = None,
                 policy: Any = None, state_dir: str = "", reading: Any = None) -> None:
        super().__init__()
        # FLARE writes the job from these attributes: each keeps its parameter's name
        self.reading = reading
        self.min_rows, self.policy, self.state_dir = min_rows, policy, state_dir
        self.data_path = data_path
        self.target = target
        self.test_path = test_path
        self.selector = selector
        self.split = split

    def _site(self, fl_ctx: FLContext):
        name = fl_ctx.get_identity_name()
        job_id = fl_ctx.get_job_id()
        site, fresh = _SITES.get((job_id, name), lambda: build_site(self._config(fl_ctx, name)))
        state_file = self._state_file(fl_ctx)
        if fresh and state_file.is_file():
            site.state = decode_state(Message.from_bytes(state_file.read_bytes()))
        site.run_id = flare_run_id(job_id)
        return site, state_file

    def _job_config(self, name: str) -> dict[str, Any]:
        """What the job (written by the server's side) says of this site, as a site config (its
        split aside: :meth:`_config` never takes it)."""
        return {"name": name, "data_path": self.data_path, "target": self.target, "test_path": self.test_path,
                "selector": self.selector, "min_rows": self.min_rows,
                "policy": self.policy, **{k: v for k, v in dict(self.reading or {}).items()
                                          if k in READING_KEYS and v not in (None, "")}}

    def _config(self, fl_ctx: FLContext, name: str) -> dict[str, Any]:
        """The site's config: its own (``local/`` :data:`SITE_FILE`, :data:`IDENTITY_FILE`) over the
        job's (:func:`~fedtab.engines.site_config.own_over_job`: the job may only tighten the policy),
        its state folder and its split always its own (:func:`~fedtab.engines.site_config.own_split`);
        what of the job's was ignored is logged, naming it."""
        local_dir = Path(fl_ctx.get_engine().get_workspace().get_site_config_dir())
        own = local_site_config(local_dir, name)
        own["state_dir"] = str(site_state_dir(own, local_dir))
        job = self._job_config(name)
        if self.state_dir not in (None, "") and str(self.state_dir) != own["state_dir"]:
            log.warning("site %r: the job's state_dir %r is ignored; the site keeps its ledger in %s (its own "
                        "local/ configuration)", name, self.state_dir, own["state_dir"])
        config, ignored = own_over_job(own, job)
        config = own_split(config)  # its own split; its seed the secret kept in its state folder
        sent = {} if self.split is None else {key: getattr(self.split, key) for key in SPLIT_KEYS}
        ignored += split_differs(sent, config)
        config["name"] = name
        if ignored:
            log.warning("site %r: the job's %s ignored: the site's own configuration (local/%s) is stricter or "
                        "sets it (a job may only tighten a site's policy; its row split is its own)", name,
                        ", ".join(ignored) + (" is" if len(ignored) == 1 else " are"), SITE_FILE)
        return config

    @staticmethod
    def _state_file(fl_ctx: FLContext) -> Path:
        run_dir = fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id())
        return Path(run_dir, _STATE_FILE)

    def execute(self, task_name: str, shareable: Shareable, fl_ctx: FLContext, abort_signal: Signal) -> Shareable:
        if task_name != TASK_NAME:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        try:
            request = Message.from_bytes(shareable[_PAYLOAD])
            site, state_file = self._site(fl_ctx)
            reply = site.handle(request)
            snapshot, _ = encode_state(site.state)
            tmp = state_file.with_suffix(".tmp")
            tmp.write_bytes(snapshot.to_bytes())
            os.replace(tmp, state_file)
        except Exception as exc:  # noqa: BLE001 - reported to the server, naming the site
            reply = Message.error(f"site {fl_ctx.get_identity_name()!r}: {type(exc).__name__}: {exc}")
        out = make_reply(ReturnCode.OK)
        out[_PAYLOAD] = reply.to_bytes()
        return out


def flare_run_id(job_id: Any) -> str:
    """``Site.run_id`` of a FLARE job: ``"flare:<job id>"``.

    Raises:
        ValueError: an empty job id (a site never answers outside a job).
    """
    if job_id in (None, ""):
        raise ValueError("the FLARE task carries no job id")
    return f"flare:{job_id}"


def site_state_dir(own: Mapping[str, Any], local_dir: str | Path) -> Path:
    """A FLARE site's state folder: ``state-dir`` of its own ``local/`` config ``own`` (relative
    paths are in ``local_dir``), else ``local_dir/``:data:`STATE_FOLDER`."""
    value = site_config(own).get("state_dir")
    return Path(local_dir, str(value)) if value not in (None, "") else Path(local_dir, STATE_FOLDER)


def local_site_config(local_dir: str | Path, name: str) -> dict[str, Any]:
    """A FLARE site's own config keys (normalised) from its ``local/`` folder: :data:`IDENTITY_FILE`,
    then :data:`SITE_FILE` (which wins); ``{}`` without either. Each file is a JSON object of
    site-config keys, or ``{site: {...}}`` for several sites (the simulator's shared ``local/``);
    relative paths (the data files, the state folder, the identity files) are in ``local_dir``.

    Raises:
        ValueError: a file that is not valid JSON, not an object of site-config keys for ``name``,
            or (:data:`IDENTITY_FILE`) sets a key besides the identity and ``state-dir``.
    """
    out: dict[str, Any] = {}
    for file, allowed in ((IDENTITY_FILE, {*IDENTITY_KEYS, "state_dir"}), (SITE_FILE, None)):
        path = Path(local_dir, file)
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        entry = doc.get(name, doc) if isinstance(doc, dict) else None
        if isinstance(doc, dict) and name not in doc and any(
                isinstance(v, dict) and site_config({k: v}).keys().isdisjoint(_OBJECT_KEYS) for k, v in doc.items()):
            entry = {}  # a file for several sites that does not name this one
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: must be a JSON object of site-config keys")
        entry = site_config(entry)
        if allowed is not None and not set(entry) <= allowed:
            raise ValueError(f"{path}: sets {sorted(set(entry) - allowed)}; only the identity keys and state-dir "
                             f"belong there (the rest goes into {SITE_FILE})")
        out.update({k: (str(path.parent / str(v)) if k in _PATH_KEYS else v) for k, v in entry.items()
                    if v not in (None, "")})
    return out


#: site-config keys whose value may be a JSON object (any other object value in a site file is a site's entry)
_OBJECT_KEYS = frozenset({"policy", "selector", "label_map"})
#: site-config keys that name a file or folder (relative ones are in the site's ``local/``)
_PATH_KEYS = frozenset({"data_path", "test_path", "state_dir", *IDENTITY_KEYS})


# ----------------------------------------------------------------------------- jobs
def build_job(sites: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None = None, *, name: str = "fedtab",
              timeout: float = 600.0, result_path: str = "",
              task_request_interval: float | None = 0.2):
    """A ``FedJob`` running the workflow on one :class:`FedtabExecutor` per site.

    Args:
        sites: one site config per client (``name`` becomes the FLARE client name; the
            other keys are :class:`FedtabExecutor` arguments, hyphens allowed).
        config: the run configuration, e.g. :func:`fedtab.job.apps.engine_config` of a job plan (see
            :class:`FedtabController`).
        task_request_interval: FLARE's ``server.task_request_interval``, the seconds a
            client waits before asking for its next task (FLARE's default is 2 s, which
            then dominates a workflow of many short steps); ``None`` keeps FLARE's default.

    Raises:
        ValueError: a site config without a name, or duplicate names.
    """
    from nvflare.job_config.api import FedJob

    names = [str(s.get("name", "")) for s in sites]
    if not all(names) or len(set(names)) != len(names):
        raise ValueError(f"every site needs a unique name, got {names}")
    job = FedJob(name=name, min_clients=len(sites))
    job.set_app_packages(["fedtab"])  # installed at every site; do not copy its source into the job
    if task_request_interval is not None:
        job.to_server({"server": {"task_request_interval": float(task_request_interval)}})
    # FLARE reads "{...}" strings in job configs as variable references: pass dicts, not JSON text.
    job.to_server(FedtabController(config=dict(config or {}), min_sites=len(sites),
                                   timeout=timeout, result_path=result_path))
    allowed = {"data_path", "target", "test_path", "selector", "test_size", "seed", "na_values", "min_rows", "policy",
               "folds", "state_dir", *READING_KEYS}
    for site in sites:
        args = {str(k).replace("-", "_"): v for k, v in site.items() if k != "name"}
        unknown = set(args) - allowed
        if unknown:
            raise ValueError(f"site {site['name']!r}: unknown executor arguments {sorted(unknown)}")
        for key in ("selector", "policy", "label_map"):  # JSON text as the site config allows; FLARE needs the object
            if isinstance(args.get(key), str) and args[key].strip().startswith("{"):
                args[key] = json.loads(args[key])
        if any(key in args for key in READING_KEYS):
            args["reading"] = {key: args.pop(key) for key in READING_KEYS if key in args}
        if any(key in args for key in SPLIT_KEYS):
            args["split"] = RowSplit(**{key: args.pop(key) for key in SPLIT_KEYS if key in args})
        job.to(FedtabExecutor(**args), str(site["name"]), tasks=[TASK_NAME])
    return job


def allow_fedtab_components(site_root: str | Path) -> Path:
    """Add fedtab's components to the ``class_allow_list`` of ``site_root/local/resources.json``.

    FLARE 2.9 only builds job components whose class path is on a site's allow list
    (NVFLARE's own classes by default; an entry ending in ``.`` allows a package, any other
    entry one class path). A real site adds :data:`FLARE_COMPONENTS` (``"fedtab.engines."`` and
    ``"fedtab.federation.site.core.RowSplit"``) to the ``class_allow_list`` of its
    ``local/resources.json``; the simulator copies
    ``<workspace>/local`` into every simulated site, so this writes it there.
    Existing settings are kept: those of ``resources.json``, else of the provisioned
    ``resources.json.default`` (FLARE reads the first that exists, so a ``resources.json``
    without the default's components would leave a provisioned site unable to run a job).
    Returns the file's path.
    """
    from nvflare.app_common.default_component_policy import DEFAULT_CLASS_ALLOW_LIST

    path = Path(site_root, "local", "resources.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    default = path.with_name("resources.json.default")
    source = path if path.is_file() else default if default.is_file() else None
    resources = json.loads(source.read_text()) if source is not None else {}
    allowed = list(resources.get("class_allow_list", DEFAULT_CLASS_ALLOW_LIST))
    for prefix in FLARE_COMPONENTS:
        if prefix not in allowed:
            allowed.append(prefix)
    resources["class_allow_list"] = allowed
    path.write_text(json.dumps(resources, indent=2))
    return path


def provision_identities(site_root: str | Path, sites: Sequence[str], keys_folder: str | Path) -> Path | None:
    """Give simulated sites secure-aggregation identities: a consortium written to
    ``keys_folder`` (as ``fedtab deploy`` makes it) and ``site_root/local/`` :data:`IDENTITY_FILE`
    naming each site's files (the simulator copies ``local/`` into every site). Returns the
    file, or ``None`` when the names are unfit for key files (the sites then refuse secure
    sums, saying why)."""
    from ..deploy.keys import write_consortium_keys

    try:
        keys = write_consortium_keys(keys_folder, sites)
    except ValueError:
        return None
    path = Path(site_root, "local", IDENTITY_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({s: keys.identity_config(s) for s in sites}, indent=2))
    return path


def write_site_files(site_root: str | Path, sites: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``site_root/local/`` :data:`SITE_FILE` with each site's own keys (the simulator copies
    ``local/`` into every simulated site; a provisioned kit's ``local/`` holds one site's): its
    files, ``policy``, ``min-rows`` and split (``test-size``, ``seed``, ``folds``, when given) from
    ``sites`` (site configs). Their owner writes the job too, so there the two agree; the file is
    what the sites read (a job can only tighten it; a site without a seed here draws a secret one
    of its own). Returns the file."""
    own = {}
    for site in sites:
        cfg = site_config(site)
        entry = {k.replace("_", "-"): cfg[k] for k in ("data_path", "test_path", "min_rows", *SPLIT_KEYS)
                 if cfg.get(k) not in (None, "")}
        if cfg.get("policy") not in (None, ""):
            policy = cfg["policy"]
            entry["policy"] = policy.to_dict() if hasattr(policy, "to_dict") else (
                json.loads(policy) if isinstance(policy, str) else dict(policy))
        for key in ("data-path", "test-path"):
            if key in entry:
                entry[key] = str(Path(str(entry[key])).expanduser().resolve())
        own[str(cfg["name"])] = entry
    path = Path(site_root, "local", SITE_FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(own, indent=2))
    return path


def run_simulator(sites: Sequence[Mapping[str, Any]], config: Mapping[str, Any] | None, workspace: str | Path, *,
                  threads: int | None = None, log_config: str | None = "concise", **job_kwargs: Any) -> dict[str, Any]:
    """Build the job, run it in FLARE's simulator and return the workflow's summary.

    Raises:
        SimulatorError: the simulator returned a non-zero code (it does not raise), or
            the job finished without writing its result.
    """
    workspace = Path(workspace)
    workspace.mkdir(parents=True, exist_ok=True)
    result_path = workspace / _RESULT_FILE
    result_path.unlink(missing_ok=True)
    job = build_job(sites, config, result_path=str(result_path), **job_kwargs)
    allow_fedtab_components(workspace / "sim")
    provision_identities(workspace / "sim", [str(s["name"]) for s in sites], workspace / "identities")
    write_site_files(workspace / "sim", sites)
    rc = job.simulator_run(str(workspace / "sim"), threads=threads or len(sites), log_config=log_config)
    if rc not in (0, None):
        raise SimulatorError(f"FLARE simulator returned {rc}; logs under {workspace / 'sim'}")
    if not result_path.is_file():
        raise SimulatorError(f"FLARE job finished without a result; logs under {workspace / 'sim'}")
    return json.loads(result_path.read_text())
