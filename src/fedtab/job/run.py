"""``run_job(path_or_dict)``: validate the job, run its steps on an engine, write the outputs.

Engines (``[run] engine`` or the ``engine`` argument):

* ``local`` — every site in this process (:class:`~fedtab.engines.local.LocalFederation`);
* ``flower`` — the real Flower ServerApp and ClientApps in this process
  (:func:`fedtab.engines.flower.run_in_process`, every message answered as if by a new
  ClientApp process), or with ``deployment="loopback"`` a real SuperLink and one SuperNode
  per site on 127.0.0.1 (:class:`~fedtab.engines.flower_deploy.LoopbackDeployment`), or with
  ``superlink="HOST:PORT"`` the consortium's running SuperLink and SuperNodes
  (:class:`~fedtab.engines.flower_remote.SuperLinkClient`: ``flwr run``, then the result
  read back from the run's log; the loopback deployment is run the same way);
* ``nvflare`` — NVIDIA FLARE's simulator (:func:`fedtab.engines.nvflare.run_simulator`), or
  with ``flare_project=KIT`` a running provisioned FLARE project, the job submitted with its
  admin's startup kit (:func:`fedtab.engines.nvflare_remote.run_on_project`), or with
  ``deployment="loopback"`` such a project provisioned and started on 127.0.0.1
  (:class:`~fedtab.engines.nvflare_deploy.LoopbackProject`).

All of them run the one step loop :func:`fedtab.job.workflow.run_workflow` on the job's
:class:`~fedtab.job.spec.JobSpec` (a distributed engine's server runs the job's server app,
:func:`fedtab.job.apps.server_app`, which this module names in the run config it writes,
:func:`fedtab.job.apps.engine_config`, and which reads the spec back from the plan there);
sites are built from the same site configs (:func:`site_configs`), each reading its table when a step first needs it, so a job
gives the same elected columns and model on each, and a site whose table cannot be used fails
(and, under ``[trust] min_sites``, is dropped and named) like any site that cannot answer.
Outputs in ``[run] out``: ``model.fedtab``, ``result.json`` and ``report.html``, written
side by side and moved into place only when all three are complete (an interrupted or failed run
leaves a folder's earlier outputs as they were); a folder that already holds them is replaced only
with ``overwrite=True`` (``fedtab run --force``). Every run has a run id (:func:`new_run_id`), in
``result.json``, the model file's provenance and the first progress line; with ``[run] mlflow``
the run is also logged to MLflow (:mod:`fedtab.job.tracking`).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

from .apps import engine_config
from .outputs import SELECTION_KEYS
from .spec import ENGINES, JobError, JobSpec, load_job

__all__ = ["ARTIFACTS", "Connection", "EngineTarget", "OutputsExist", "SuperLink", "new_run_id", "run_job", "site_configs", "site_settings", "write_outputs",
           "RESULT_KEYS"]

#: keys of the engine's result copied into ``result.json`` (besides the sites)
RESULT_KEYS = ("schema", "imputation", "tuning", "election", "training", "baselines", "all_columns", "steps",
               "privacy", "trust", "participation", "deployment", *SELECTION_KEYS)


log = logging.getLogger(__name__)

#: what a run writes into its output folder (the keys of ``result["artifacts"]``)
ARTIFACTS = {"model": "model.fedtab", "result": "result.json", "report": "report.html"}


def new_run_id() -> str:
    """A run id: the UTC start time and 6 random hex digits (``20261201-181203-3fa9c1``); sorts by start."""
    return f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _check_out_dir(out_dir: Path, overwrite: bool) -> None:
    """Refuse (``JobError``) a folder that holds a run's outputs unless ``overwrite``, before anything runs."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise JobError(f"output folder {out_dir} is a file")
    held = [f for f in ARTIFACTS.values() if (out_dir / f).exists()]
    if held and not overwrite:
        raise OutputsExist(out_dir, held)


class OutputsExist(JobError):
    """The output folder already holds a run's outputs (``folder``, ``files``) and overwriting was not asked."""

    def __init__(self, folder: Path, files: list[str], option: str = "overwrite=True") -> None:
        self.folder, self.files = folder, files
        super().__init__(f"output folder {folder} already holds a run's outputs ({', '.join(files)}); replace them "
                         f"with {option}, or choose another output folder")


def site_configs(spec: JobSpec, *, check_files: bool = True) -> list[dict[str, Any]]:
    """One flat site config per site (keys of :mod:`fedtab.engines.site_config`).

    With ``check_files=False`` (a deployment whose sites read their own files) a site
    without ``path`` gets no ``data-path`` and nothing is checked on this machine.

    Raises:
        JobError: (``check_files``) a site without ``path``, or whose file does not exist.
    """
    out = []
    default_selector = spec.election.selector if spec.election is not None else "lasso"
    for s in spec.sites:
        if check_files and s.path is None:
            raise JobError(f"{spec.source}: [sites.{s.name}] needs path = \"<CSV or Parquet file>\"")
        if check_files and not s.path.is_file():
            raise JobError(f"{spec.source}: [sites.{s.name}] path: no such file {s.path}")
        selector = s.selector if s.selector is not None else default_selector
        # absolute: a SuperNode, a FLARE client or the simulator reads it from another working directory
        cfg = {"name": s.name, "data-path": None if s.path is None else str(s.path.resolve()), "target": spec.target,
               "na-values": json.dumps(list(dict.fromkeys([*spec.na_values, *s.na_values]))),
               "selector": selector if isinstance(selector, str) else json.dumps(selector),
               "test-size": spec.run.test_size, "seed": spec.run.seed, "min-rows": s.min_rows, "sep": s.sep,
               "decimal": s.decimal,
               "policy": json.dumps({"allow_server_row_sets": True}) if s.allow_server_row_sets else None,
               "label-map": None if spec.labels.map is None else json.dumps(spec.labels.map, sort_keys=True),
               "task": _site_task(spec)}
        out.append({k: v for k, v in cfg.items() if v is not None})
    return out


def _site_task(spec: JobSpec) -> str | None:
    """How the job tells its sites to read the target (``None``: each reads it from its values)."""
    task = spec.training.task if spec.training is not None else None
    return None if task is None else "regression" if task == "regression" else "classes"


def site_settings(configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{site: settings}``: what the job sets for each site besides where its table is and how
    it draws its row parts (``test-size``, ``seed``: each site's own, drawn from its own secret
    seed; a SuperNode ignores them, :func:`fedtab.engines.site_config.own_split`).

    The Flower run config's ``site-settings``: a SuperNode started with only ``name`` and
    ``data-path`` takes the rest from it (:func:`fedtab.engines.site_config.with_job_settings`).
    """
    return {c["name"]: {k: v for k, v in c.items() if k not in ("name", "data-path", *_SPLIT)} for c in configs}


#: the site-config keys of a site's row split (its own on a deployment, never the run config's)
_SPLIT = ("test-size", "seed", "folds")


def _superlink_run_config(spec: JobSpec, plan: dict[str, Any], site_keys: Any, insecure: bool) -> dict[str, Any]:
    """The run config of a job on an existing SuperLink (site keys checked against the job's sites)."""
    names = [s.name for s in spec.sites]
    cfg = engine_config(plan, **{"min-sites": len(names),
                                 "site-settings": json.dumps(site_settings(site_configs(spec, check_files=False)))})
    if site_keys is None:
        if not insecure:
            raise JobError("a TLS SuperLink run needs the consortium's site keys (--site-keys site-keys.json from "
                           "fedtab deploy): they bind each site name to its SuperNode's key")
        return cfg
    if insecure:
        raise JobError("site keys need SuperNode authentication, which an --insecure SuperLink does not do")
    from ..deploy.keys import load_site_keys

    try:
        keys = load_site_keys(site_keys)
    except (ValueError, OSError) as exc:
        raise JobError(f"site keys {site_keys}: {exc}") from None
    missing = [n for n in names if n not in keys]
    if missing:
        raise JobError(f"site keys {site_keys}: no key for site(s) {', '.join(missing)} of the job")
    cfg["site-keys"] = json.dumps({n: keys[n] for n in names})  # nodes of other sites are left out
    return cfg


def _plan_differences(mine: Any, theirs: Any, path: tuple[str, ...] = ()) -> list[str]:
    """The keys (``[training] rounds``, ``[privacy] dp.epsilon``, ``target``) where two plans
    (JSON data) differ."""
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
        return [d for key in sorted(set(mine) | set(theirs), key=str)
                for d in _plan_differences(mine.get(key), theirs.get(key), (*path, str(key)))]
    if mine == theirs:
        return []
    if len(path) < 2:
        return [path[0] if path else "the plan"]
    return [f"[{path[0]}] {'.'.join(path[1:])}"]


def check_attached_plan(plan: Mapping[str, Any], ran: Any, run_id: int, source: str) -> None:
    """Refuse to write a run's outputs under a job file whose plan (:meth:`JobSpec.plan`, as sent)
    differs from the plan the run ran (the server's result carries it); ``[run] out`` is where
    this machine writes and is not compared.

    Raises:
        JobError: the plans differ (naming the keys) or the run's result carries no plan.
    """
    if not isinstance(ran, Mapping):
        raise JobError(f"{source}: Flower run {run_id}'s result does not carry the plan it ran (a server older "
                       "than this fedtab): cannot check that it ran this job file")

    def comparable(p: Mapping[str, Any]) -> Any:
        data = json.loads(json.dumps(p))
        if isinstance(data.get("run"), dict):
            data["run"].pop("out", None)
        return data

    differ = _plan_differences(comparable(plan), comparable(ran))
    if differ:
        shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
        raise JobError(f"{source} is not the job Flower run {run_id} ran: they differ in {shown}; attach with the "
                       "job file the run was submitted with")


def _run_on_superlink(spec: JobSpec, plan: dict[str, Any], superlink: "SuperLink", workdir: Path,
                      progress: Callable[[str], None]) -> dict[str, Any]:
    from ..engines.flower_remote import SuperLinkClient

    client = SuperLinkClient(superlink.address, root_certificates=superlink.root_certificates,
                             insecure=superlink.insecure, home=workdir / "flwr_home")
    if superlink.attach is not None:
        progress(f"following Flower run {superlink.attach} on the SuperLink at {superlink.address}")
        raw = client.attach(superlink.attach, timeout=superlink.timeout, progress=progress)
        check_attached_plan(plan, raw.get("plan"), superlink.attach, spec.source)
    else:
        run_config = _superlink_run_config(spec, plan, superlink.site_keys, superlink.insecure)
        progress(f"submitting the job to the Flower SuperLink at {superlink.address}")
        raw = client.run(run_config, timeout=superlink.timeout, progress=progress)
    raw["deployment"] = {"superlink": superlink.address, "run_id": raw.get("run_id"),
                         "identity": raw.get("identity"), "excluded_nodes": raw.get("excluded_nodes", {})}
    return raw


@dataclass(frozen=True)
class SuperLink:
    """Where a consortium's Flower SuperLink runs and how to trust it (see ``docs/deployment.md``).

    ``address``: ``HOST:PORT``; ``root_certificates``: the consortium's CA certificate
    (``ca.pem`` of ``fedtab deploy``), required unless ``insecure``; ``site_keys``: the
    consortium's ``site-keys.json`` (path, JSON text or mapping), required unless
    ``insecure``; ``timeout``: seconds to wait for the run (then it is stopped on the SuperLink);
    ``attach``: the id of a run already submitted to wait for instead of submitting one.
    """

    address: str
    root_certificates: str | Path | None = None
    insecure: bool = False
    site_keys: Any = None
    timeout: float = 3600.0
    attach: int | None = None


@dataclass(frozen=True)
class Connection:
    """How :func:`run_job` reaches and waits for a deployment (its keywords besides the
    SuperLink's address): ``root_certificates``, ``insecure``, ``site_keys`` and ``attach`` as
    :class:`SuperLink` (with a ``superlink`` address string), ``timeout`` seconds to wait for a
    run on any deployment (a SuperLink, a loopback one or a FLARE project)."""

    root_certificates: str | Path | None = None
    insecure: bool = False
    site_keys: Any = None
    timeout: float = 3600.0
    attach: int | None = None

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> "Connection":
        """The connection of :func:`run_job`'s extra keywords ``settings``.

        Raises:
            TypeError: a keyword that is not a field (named as Python names it for ``run_job``).
        """
        known = {f.name for f in fields(cls)}
        unknown = [k for k in settings if k not in known]
        if unknown:
            raise TypeError(f"run_job() got an unexpected keyword argument {unknown[0]!r}")
        return cls(**settings)

    def link(self, address: str) -> SuperLink:
        """The :class:`SuperLink` at ``address`` reached this way."""
        return SuperLink(address, self.root_certificates, self.insecure, self.site_keys, self.timeout, self.attach)


@dataclass(frozen=True)
class EngineTarget:
    """Where a job runs, resolved and checked (:func:`_engine_target`): ``engine`` (one of
    :data:`~fedtab.job.spec.ENGINES`), ``deployment`` (``None`` or ``"loopback"``), a
    ``superlink`` (Flower only) or a ``flare_project`` (FLARE only), and ``timeout`` seconds to
    wait for a run on a loopback deployment or a FLARE project."""

    engine: str
    deployment: str | None = None
    superlink: SuperLink | None = None
    flare_project: str | Path | None = None
    timeout: float = 3600.0


def _engine_target(spec: JobSpec, engine: str | None, deployment: str | None, superlink: str | SuperLink | None,
                   flare_project: str | Path | None, connection: Connection) -> EngineTarget:
    """The checked :class:`EngineTarget` of :func:`run_job`'s arguments (default engine:
    ``flower`` with a ``superlink``, ``nvflare`` with a ``flare_project``, else the job's —
    ``flower`` instead of ``local`` with a ``deployment``).

    Raises:
        JobError: ``attach`` without a SuperLink, an unknown engine, or a deployment, SuperLink
            or FLARE project that does not fit the engine.
    """
    if isinstance(superlink, str):
        superlink = connection.link(superlink)
    attach = connection.attach
    if attach is not None and (superlink is None or superlink.attach != attach):
        raise JobError("attach (a submitted run's id) needs superlink = \"HOST:PORT\"")
    if engine is None:  # a deployment without an engine: the job's engine, Flower if that is "local"
        engine = "flower" if superlink is not None else "nvflare" if flare_project is not None else spec.run.engine
        engine = "flower" if deployment is not None and engine == "local" else engine
    if engine not in ENGINES:
        raise JobError(f"unknown engine {engine!r}; known: {list(ENGINES)}")
    if superlink is not None and (engine != "flower" or deployment is not None):
        raise JobError("superlink applies to engine 'flower' without another deployment")
    if flare_project is not None and (engine != "nvflare" or deployment is not None):
        raise JobError("flare_project applies to engine 'nvflare' without another deployment")
    if deployment not in (None, "loopback") or (deployment and engine == "local"):
        raise JobError(f"deployment {deployment!r} applies to engines 'flower' and 'nvflare' ('loopback')")
    return EngineTarget(engine, deployment, superlink, flare_project, connection.timeout)


def _run_engine(spec: JobSpec, target: EngineTarget, configs: list[dict[str, Any]], plan: dict[str, Any],
                progress: Callable[[str], None], workdir: Path) -> dict[str, Any]:
    """The engine's raw result of the job ``spec`` (``plan``: what its server needs; ``configs``:
    :func:`site_configs`) on ``target``; ``workdir`` holds what the engine writes meanwhile."""
    if target.engine == "local":
        from ..engines.local import LocalFederation
        from ..engines.site_config import build_lazy_site
        from .workflow import run_workflow

        try:
            sites = [build_lazy_site(c) for c in configs]
        except ValueError as exc:
            raise JobError(f"{spec.source}: {exc}") from None
        return run_workflow(LocalFederation(sites), spec, progress=progress).result
    if target.engine == "flower":
        return _run_flower(spec, target, configs, plan, progress, workdir)
    return _run_flare(target, configs, plan, progress, workdir)


def _run_flower(spec: JobSpec, target: EngineTarget, configs: list[dict[str, Any]], plan: dict[str, Any],
                progress: Callable[[str], None], workdir: Path) -> dict[str, Any]:
    """:func:`_run_engine` on Flower: on ``target.superlink``, on a loopback SuperLink with one
    SuperNode per site, or (no deployment) ServerApp and ClientApps in this process."""
    if target.superlink is not None:
        return _run_on_superlink(spec, plan, target.superlink, workdir, progress)
    if target.deployment == "loopback":
        from ..engines.flower_deploy import LoopbackDeployment

        progress("starting a Flower SuperLink and SuperNodes on 127.0.0.1")
        # each SuperNode knows only its name, table, own floor, policy and split, as at a real site; the job
        # brings the rest. fedtab plays every site's operator here, so it gives each the job's seed and test size
        # (a real site draws its own secret seed): the loopback run then draws the parts the other engines do,
        # and each site's own policy (e.g. its allow_server_row_sets opt-in), as FLARE loopback's site files do
        nodes = [_loopback_node(c) for c in configs]
        with LoopbackDeployment(nodes, workdir / "flower") as dep:
            link = SuperLink(dep.address, dep.keys.ca_cert, site_keys=dep.keys.site_keys, timeout=target.timeout)
            return _run_on_superlink(spec, plan, link, workdir, progress)
    from ..engines.flower import run_in_process

    progress("running on Flower (ServerApp and ClientApps in this process)")
    return run_in_process(configs, engine_config(plan))


#: the keys of a site config that a loopback SuperNode gets as its own node config (the rest the job sends)
_NODE_KEYS = ("name", "data-path", "min-rows", "policy", *_SPLIT)


def _loopback_node(config: Mapping[str, Any]) -> dict[str, Any]:
    """The node config of a loopback SuperNode for the site config ``config``: its name, table,
    floor, disclosure policy (JSON text, as a SuperNode's ``--node-config`` carries it) and split."""
    node = {k: config[k] for k in _NODE_KEYS if k in config and config[k] is not None}
    if isinstance(node.get("policy"), Mapping):
        node["policy"] = json.dumps(dict(node["policy"]), sort_keys=True)
    return node


def _run_flare(target: EngineTarget, configs: list[dict[str, Any]], plan: dict[str, Any],
               progress: Callable[[str], None], workdir: Path) -> dict[str, Any]:
    """:func:`_run_engine` on NVIDIA FLARE: on ``target.flare_project``, on a loopback project
    provisioned and started here, or (no deployment) in FLARE's simulator."""
    flare_config = engine_config(plan)  # the plan as JSON text: FLARE takes a dict with a "name" key for a component
    timeout = target.timeout
    if target.flare_project is not None or target.deployment == "loopback":
        from ..engines.nvflare_remote import run_on_project

        if target.flare_project is not None:
            progress(f"submitting the job to the FLARE project of {target.flare_project}")
            raw = run_on_project(configs, flare_config, target.flare_project, workdir / "nvflare", timeout=timeout,
                                 progress=progress)
        else:
            from ..engines.nvflare_deploy import LoopbackProject

            progress("provisioning and starting a FLARE server and one client per site on 127.0.0.1")
            with LoopbackProject(configs, workdir / "flare_project") as project:  # each kit's local/ its site's own
                progress("submitting the job to the FLARE project")
                raw = run_on_project(configs, flare_config, project.admin_kit, workdir / "nvflare", timeout=timeout,
                                     progress=progress)
        raw["deployment"] = {"flare_job_id": raw.get("flare_job_id")}
        return raw
    from ..engines.nvflare import run_simulator

    progress("running on the NVIDIA FLARE simulator")
    return run_simulator(configs, flare_config, workdir / "nvflare")


def run_job(job: str | Path | Mapping[str, Any], *, engine: str | None = None, deployment: str | None = None,
            out: str | Path | None = None, progress: Callable[[str], None] | None = None,
            superlink: str | SuperLink | None = None, flare_project: str | Path | None = None,
            overwrite: bool = True, run_id: str | None = None, **connection: Any) -> dict[str, Any]:
    """Run a job file (or its dict) and write ``model.fedtab``, ``result.json`` and ``report.html``.

    Args:
        job: path of the TOML job file, or the same as a dict (paths relative to the cwd).
        engine: ``local``, ``flower`` or ``nvflare`` (default: ``flower`` with ``superlink``,
            ``nvflare`` with ``flare_project``, else the job's ``[run] engine`` — ``flower``
            instead of ``local`` with a ``deployment``).
        deployment: ``None`` (Flower: ServerApp/ClientApps in this process; FLARE: its
            simulator) or ``"loopback"`` (Flower: a SuperLink and SuperNodes on 127.0.0.1,
            TLS + auth; FLARE: a provisioned project, server and clients on 127.0.0.1).
        out: output directory (default: the job's ``[run] out``, which a job *file* may set
            only inside its own folder; ``out`` may be anywhere).
        progress: called with a short line as each step starts.
        superlink: Flower only: ``HOST:PORT`` of the consortium's running SuperLink (or a
            :class:`SuperLink`). Its SuperNodes read their own tables (their node config's
            ``data-path``), so the job's site ``path`` values are not used; the job's other
            site settings travel in the run config. The result comes back through the
            run's log (:mod:`fedtab.engines.flower_remote`).
        root_certificates, insecure, site_keys (keywords of :class:`Connection`): as
            :class:`SuperLink` (with a ``superlink`` string).
        flare_project: FLARE only: the project admin's startup kit of a running,
            provisioned FLARE project (or the provisioned folder holding it, see
            :func:`fedtab.engines.nvflare_remote.find_admin_kit`). The job's site paths are
            read at the sites.
        timeout (keyword of :class:`Connection`): seconds to wait for a run on a deployment (a
            Flower run is then stopped on its SuperLink, a FLARE job aborted; so is either on
            Ctrl-C); default 3600.
        attach (keyword of :class:`Connection`): with ``superlink``: the id of a run submitted
            earlier (``fedtab run`` prints it) to wait for and write the outputs of, instead of
            submitting the job again.
        overwrite: replace the outputs of an earlier run in the output folder (``False``:
            such a folder is a ``JobError`` before anything runs; ``fedtab run`` passes ``--force``).
        run_id: the run's id (default: :func:`new_run_id`).

    Returns:
        The ``result.json`` document (``docs/job.md`` lists its keys).

    Raises:
        TypeError: a keyword that is neither an argument above nor a :class:`Connection` field.
        JobError: the job file is invalid, a site file is missing, (``superlink``) the site
            keys do not cover the job's sites, the output folder holds a run's outputs and
            ``overwrite`` is false, or ``[run] mlflow`` is set and mlflow is not installed.
        FederationError / ValueError: a step failed (the message names the site or column).
        fedtab.engines.flower_remote.RunError: a Flower deployment did not start, or its
            run failed, timed out or left no readable result.
    """
    from .model_file import write_model

    def say(message: str) -> None:  # each progress line is also a log record (fedtab run --log-file)
        log.info(message)
        if progress is not None:
            progress(message)

    link = Connection.of(connection)
    spec = load_job(job, out_given=out is not None)  # a job file's own out stays in its folder
    if spec.training is None:
        raise JobError(f"{spec.source}: a job run needs the training step (its model file)")
    target = _engine_target(spec, engine, deployment, superlink, flare_project, link)
    # on a deployment the sites read their own files: nothing to check on this machine
    configs = site_configs(spec, check_files=target.superlink is None and flare_project is None)
    if flare_project is not None and any("data-path" not in c for c in configs):
        raise JobError(f"{spec.source}: on a FLARE project every [sites.<name>] needs path = \"<the file at that "
                       "site>\" (the job carries it to the site)")
    plan = spec.to_dict()
    server_plan = spec.plan()  # what the server needs: steps and settings, not where the sites keep their files
    out_dir = Path(out) if out is not None else spec.run.out
    _check_out_dir(out_dir, overwrite)
    run_id = run_id or new_run_id()
    tracker = None
    if spec.run.mlflow is not None:
        from .tracking import MlflowRecord

        tracker = MlflowRecord(spec.run.mlflow, run_id, experiment=_experiment_name(spec.source))
    say(f"run {run_id}: {len(spec.sites)} sites on the {target.engine} engine, outputs to {out_dir}")
    try:
        with tempfile.TemporaryDirectory(prefix="fedtab-job-") as tmp:
            raw = _run_engine(spec, target, configs, server_plan, say, Path(tmp))
    except BaseException as exc:
        if tracker is not None:
            tracker.end("KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    files = {s.name: None if s.path is None or target.superlink is not None else str(s.path) for s in spec.sites}
    result, provenance = _documents(raw, run_id, target.engine, plan, files, tracker)
    _write_run(out_dir, result, lambda d: write_model(d / ARTIFACTS["model"], raw["model"], provenance))
    if tracker is not None:
        say(f"logging the run to MLflow at {spec.run.mlflow} (run {tracker.info['run_id']})")
        tracker.log(result, out_dir)
    return result


def _documents(raw: Mapping[str, Any], run_id: str, engine: str, plan: dict[str, Any],
               files: Mapping[str, str | None], tracker: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(result.json, the model file's provenance)`` of an engine's raw result."""
    from .. import __version__
    from ..report.data import unscored_key, unscored_sites
    from ..report.model import model_summary

    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    result = {
        "run_id": run_id, "fedtab_version": __version__, "created": created, "job": plan, "engine": engine,
        "sites": {name: {"file": files.get(name), **info} for name, info in raw["sites"].items()},
        **{k: raw.get(k) for k in RESULT_KEYS},
        "model": model_summary(raw.get("model")),  # coefficients for the report, never a network's weights
        "artifacts": dict(ARTIFACTS),
        **({"mlflow": tracker.info} if tracker is not None else {}),
    }
    key = unscored_key(result)  # why a site has no AUROC (no_auroc) or score (no_score) of its own: docs/report.md
    for name, why in unscored_sites(result).items():
        if key is not None and isinstance(result["sites"].get(name), dict):
            result["sites"][name][key] = why
    provenance = {"run_id": run_id, "fedtab_version": __version__, "created": created, "engine": engine, "job": plan,
                  "sites": [{"name": name, "rows": s["n_rows"], "columns": s["columns"]}
                            for name, s in raw["sites"].items()]}
    return result, provenance


def _experiment_name(source: str) -> str:
    """The MLflow experiment of a job: its file's stem (``"fedtab"`` for a job given as a dict)."""
    stem = Path(source).stem if source and not source.startswith("<") else ""
    return stem or "fedtab"


def _write_run(out_dir: Path, result: Mapping[str, Any], write_model_file: Callable[[Path], Any]) -> None:
    """Write the run's outputs into a staging folder beside ``out_dir``'s files, then move each
    into place: until every one is complete the folder's earlier outputs stay as they were."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fedtab-partial-", dir=out_dir))
    try:
        write_model_file(staging)
        write_outputs(result, staging)
        written = os.listdir(staging)
        for name in written:  # the artifacts and whatever the report writes beside them
            os.replace(staging / name, out_dir / name)
        for old in out_dir.glob("report-*.png"):  # an earlier report's figure this one does not draw
            if old.name not in written:
                old.unlink()
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_outputs(result: Mapping[str, Any], out_dir: str | Path, command: str = "run") -> None:
    """``result.json`` and ``report.html`` (:func:`fedtab.report.write_report`, the page of
    ``command``, with its figures as PNG files beside it) in ``out_dir``."""
    from ..report import write_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    write_report(result, out / "report.html", command)
