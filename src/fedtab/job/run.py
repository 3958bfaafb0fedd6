"""``run_job(path_or_dict)``: validate the job, run its steps on an engine, write the outputs.

Engines (``[run] engine`` or the ``engine`` argument):

* ``local`` — every site in this process (:class:`~fedtab.engines.local.LocalFederation`);
* ``flower`` — the real Flower ServerApp and ClientApps in this process
  (:func:`fedtab.engines.flower.run_in_process`, every message answered as if by a new
  ClientApp process), or with ``deployment="loopback"`` a real SuperLink and one SuperNode
  per site on 127.0.0.1 (:class:`~fedtab.engines.flower_deploy.LoopbackDeployment`);
* ``nvflare`` — NVIDIA FLARE's simulator (:func:`fedtab.engines.nvflare.run_simulator`).

All of them run :func:`fedtab.job.flow.job_workflow`; sites are built from the same site
configs (:func:`site_configs`), so a job gives the same elected columns and model on each.
Outputs in ``[run] out``: ``model.fedtab``, ``result.json`` and ``report.html``.
"""

from __future__ import annotations

import datetime as _dt
import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from .spec import ENGINES, JobError, JobSpec, load_job

__all__ = ["run_job", "site_configs", "write_outputs", "WORKFLOW"]

#: import path of the workflow the distributed engines run
WORKFLOW = "fedtab.job.flow:job_workflow"


def site_configs(spec: JobSpec) -> list[dict[str, Any]]:
    """One flat site config per site (keys of :mod:`fedtab.engines.site_config`).

    Raises:
        JobError: a site's file does not exist.
    """
    out = []
    default_selector = spec.election.selector if spec.election is not None else "lasso"
    for s in spec.sites:
        if not s.path.is_file():
            raise JobError(f"{spec.source}: [sites.{s.name}] path: no such file {s.path}")
        selector = s.selector if s.selector is not None else default_selector
        out.append({"name": s.name, "data-path": str(s.path), "target": spec.target,
                    "na-values": json.dumps(list(dict.fromkeys([*spec.na_values, *s.na_values]))),
                    "selector": selector if isinstance(selector, str) else json.dumps(selector),
                    "test-size": spec.run.test_size, "seed": spec.run.seed})
    return out


def _run_engine(spec: JobSpec, engine: str, configs: list[dict[str, Any]], plan: dict[str, Any],
                progress: Callable[[str], None], deployment: str | None, workdir: Path) -> dict[str, Any]:
    from .flow import job_workflow

    if engine == "local":
        from ..engines.local import LocalFederation
        from ..engines.site_config import build_site

        try:
            sites = [build_site(c) for c in configs]
        except ValueError as exc:
            raise JobError(f"{spec.source}: {exc}") from None
        return job_workflow(LocalFederation(sites), {"job": json.dumps(plan)}, progress)
    if engine == "flower":
        if deployment == "loopback":
            from ..engines.flower_deploy import LoopbackDeployment

            progress("starting a Flower SuperLink and SuperNodes on 127.0.0.1")
            with LoopbackDeployment(configs, workdir / "flower") as dep:
                return dep.run(run_config={"workflow": WORKFLOW, "job": json.dumps(plan)})
        from ..engines.flower import make_server_app, run_in_process

        progress("running on Flower (ServerApp and ClientApps in this process)")
        return run_in_process(configs, {"job": json.dumps(plan)}, app=make_server_app(job_workflow))
    from ..engines.nvflare import run_simulator

    progress("running on the NVIDIA FLARE simulator")
    flare_sites = [{k: v for k, v in c.items()} for c in configs]
    # JSON text, not a dict: FLARE takes any dict with a "name" key (a model spec) for a component
    return run_simulator(flare_sites, {"job": json.dumps(plan)}, workdir / "nvflare", workflow=WORKFLOW)


def run_job(job: str | Path | Mapping[str, Any], *, engine: str | None = None, deployment: str | None = None,
            out: str | Path | None = None, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run a job file (or its dict) and write ``model.fedtab`` and ``result.json``.

    Args:
        job: path of the TOML job file, or the same as a dict (paths relative to the cwd).
        engine: ``local``, ``flower`` or ``nvflare`` (default: the job's ``[run] engine``).
        deployment: Flower only: ``None`` (in-process ServerApp/ClientApps) or ``"loopback"``.
        out: output directory (default: the job's ``[run] out``).
        progress: called with a short line as each step starts.

    Returns:
        The ``result.json`` document (``docs/job.md`` lists its keys).

    Raises:
        JobError: the job file is invalid or a site file is missing.
        FederationError / ValueError: a step failed (the message names the site or column).
    """
    from .. import __version__
    from .model_file import write_model

    say = progress or (lambda _m: None)
    spec = load_job(job)
    engine = engine or spec.run.engine
    if engine not in ENGINES:
        raise JobError(f"unknown engine {engine!r}; known: {list(ENGINES)}")
    configs = site_configs(spec)
    plan = spec.to_dict()
    # what the server needs: steps and settings, not where the sites keep their files
    server_plan = {k: v for k, v in plan.items() if k not in ("sites", "source")}
    out_dir = Path(out) if out is not None else spec.run.out
    with tempfile.TemporaryDirectory(prefix="fedtab-job-") as tmp:
        raw = _run_engine(spec, engine, configs, server_plan, say, deployment, Path(tmp))
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    files = {s.name: str(s.path) for s in spec.sites}
    result = {
        "fedtab_version": __version__, "created": created, "job": plan, "engine": engine,
        "sites": {name: {"file": files.get(name), **info} for name, info in raw["sites"].items()},
        **{k: raw.get(k) for k in ("schema", "imputation", "tuning", "election", "training", "baselines", "steps")},
        "artifacts": {"model": "model.fedtab", "result": "result.json", "report": "report.html"},
    }
    provenance = {"fedtab_version": __version__, "created": created, "engine": engine, "job": plan,
                  "sites": [{"name": name, "rows": s["n_rows"], "columns": s["columns"]}
                            for name, s in raw["sites"].items()]}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_model(out_dir / "model.fedtab", raw["model"], provenance)
    write_outputs(result, out_dir)
    return result


def write_outputs(result: Mapping[str, Any], out_dir: str | Path) -> None:
    """``result.json`` and ``report.html`` (:func:`fedtab.report.write_report`) in ``out_dir``."""
    from ..report import write_report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1))
    write_report(result, out / "report.html")
