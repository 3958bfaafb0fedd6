"""``fedtab run JOB.toml``: the consortium job (schema → imputation → election → tuning → training → evaluation)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import console, fail, outcome

__all__ = ["run_command", "step_reporter"]


def step_reporter():
    """``(say, close)``: a progress line per step when stdout is not a terminal (plain text, no
    colour codes), a rich spinner in one; nothing under ``--quiet``."""
    t0 = time.perf_counter()
    if console.quiet:
        return (lambda _msg: None), (lambda: None)
    if console.is_terminal:
        status = console.status("starting")
        status.start()
        return (lambda msg: status.update(f"{msg} ({time.perf_counter() - t0:.0f} s)")), status.stop
    return (lambda msg: console.print(f"[{time.perf_counter() - t0:6.1f} s] {msg}", highlight=False, markup=False,
                                      soft_wrap=True)), (lambda: None)


def _check_where(engine: Optional[str], deployment: Optional[str], superlink: Optional[str],
                 flare_project: Optional[Path]) -> None:
    """Refuse (:func:`~fedtab.cli.fail`: exit 2, one line) a ``--deployment`` other than ``loopback``
    or with ``--engine local``, ``--superlink`` with an engine but Flower, ``--flare-project`` with an
    engine but FLARE, and more than one of the three."""
    if deployment not in (None, "loopback"):
        fail(f"--deployment must be 'loopback', got {deployment!r}")
    if deployment and engine == "local":
        fail("--deployment applies to --engine flower or nvflare")
    if superlink and engine not in (None, "flower"):
        fail("--superlink applies to --engine flower only")
    if flare_project and engine not in (None, "nvflare"):
        fail("--flare-project applies to --engine nvflare only")
    if sum(map(bool, (deployment, superlink, flare_project))) > 1:
        fail("give one of --deployment loopback, --superlink and --flare-project")


def _print_summary(result: dict) -> None:
    """Print a finished run's ``result`` (:func:`fedtab.job.run.run_job`) to the console: each site's
    rows and columns, the columns left out, the one-class sites, the election, the pooled test
    metrics (AUROC with its bounds when it is an estimate), the ε spent and the sites left out."""
    ev = result["training"]["metrics"]["pooled"]
    for name, s in result["sites"].items():
        console.print(f"site {name}: {s['n_rows']} rows ({s['dropped_unlabelled']} without a label dropped), "
                      f"{len(s['columns'])} columns, lacks {s['unavailable_columns'] or 'none'}", highlight=False,
                      markup=False)
    for col, why in ((result.get("schema") or {}).get("ignored") or {}).items():
        console.print(f"column {col!r} left out: {why}", style="yellow", markup=False, highlight=False)
    for name, s in result["sites"].items():
        if s.get("one_class"):
            took = s.get("participation") or {}
            console.print(f"site {name!r} holds one class only: election {took.get('election') or 'none'}, "
                          f"training {took.get('training')}, evaluation {took.get('evaluation')} (no AUROC there)",
                          style="yellow", markup=False, highlight=False)
    if result["election"]:
        el = result["election"]
        console.print(f"elected {len(el['selected'])} of {el['stats']['features']} columns at freedom degree "
                      f"{el['freedom_degree']:g}: {', '.join(el['selected'])}", highlight=False, markup=False)
    auroc = f", AUROC {ev['auroc']:.3f}" if ev.get("auroc") is not None else ""
    bounds = ev.get("auroc_bounds")
    if auroc and isinstance(bounds, list) and len(bounds) == 2 and bounds[1] - bounds[0] >= 5e-4:
        auroc += f" (an estimate: the exact value is in [{bounds[0]:.3f}, {bounds[1]:.3f}])"
    elif auroc and bounds is None:
        auroc += " (an estimate without a bound)"
    console.print(f"{result['training']['model']}: weighted F1 {ev['weighted_f1']:.3f}, accuracy {ev['accuracy']:.3f}"
                  f"{auroc} on {ev.get('n', '?')} test rows", highlight=False)
    dp = (result.get("privacy") or {}).get("dp")
    if dp is not None:
        console.print(f"differential privacy: ε spent {dp['epsilon_spent']:.3g} of the job's {dp['epsilon']:g} "
                      f"(δ = {dp['delta']:g})", highlight=False)
    for name, why in ((result.get("participation") or {}).get("dropped") or {}).items():
        console.print(f"site {name!r} was left out: {why}", style="yellow", markup=False, highlight=False)


def run_command(
    job: Annotated[Path, typer.Argument(help="The job file (TOML): sites, target and steps (see docs/job.md).")],
    engine: Annotated[Optional[str], typer.Option(help="local, flower or nvflare (default: the job's [run] engine, "
                                                  "else local).")] = None,
    deployment: Annotated[Optional[str], typer.Option(help="'loopback': Flower: a SuperLink and one SuperNode per "
                                                      "site on 127.0.0.1 (TLS + auth); FLARE: a provisioned project "
                                                      "on 127.0.0.1 (default: Flower's apps in this process, FLARE's "
                                                      "simulator).")] = None,
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default: the job's [run] out).")] = None,
    superlink: Annotated[Optional[str], typer.Option(help="Flower only: HOST:PORT of the consortium's running "
                                                     "SuperLink; each SuperNode reads its own table (node config "
                                                     "data-path), the job's site paths are not used.")] = None,
    root_certificates: Annotated[Optional[Path], typer.Option(help="With --superlink: the consortium's CA "
                                                              "certificate (ca.pem of fedtab deploy).")] = None,
    site_keys: Annotated[Optional[Path], typer.Option(help="With --superlink: the consortium's site-keys.json "
                                                      "(fedtab deploy), binding each site to its SuperNode's "
                                                      "key.")] = None,
    insecure: Annotated[bool, typer.Option(help="With --superlink: the SuperLink runs without TLS and SuperNode "
                                                "authentication (Flower's --insecure); only for trials.")] = False,
    flare_project: Annotated[Optional[Path], typer.Option(help="NVIDIA FLARE only: the project admin's startup kit "
                                                          "of a running provisioned project (prod_00/admin@...) or "
                                                          "the provisioned folder holding it; site paths are read "
                                                          "at the sites.")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="With --superlink, --flare-project or --deployment: seconds "
                                                       "to wait for the run.")] = 3600.0,
    force: Annotated[bool, typer.Option("--force", help="Replace the outputs of an earlier run in the output "
                                        "directory (without it such a directory is an error).")] = False,
) -> None:
    """Run a job: one file per site in, model.fedtab, result.json and report.html out.

    Prints the run id first and a progress line per step; Ctrl-C stops the run (exit 130)
    and leaves the output directory as it was."""
    from ..engines.errors import RunError
    from ..federation.protocol import FederationError
    from ..job import JobError
    from ..job.run import OutputsExist, run_job

    _check_where(engine, deployment, superlink, flare_project)
    if not superlink and (root_certificates or site_keys or insecure):
        fail("--root-certificates, --site-keys and --insecure apply to --superlink only")
    say, close = step_reporter()
    try:
        result = run_job(job, engine=engine, deployment=deployment, out=out, progress=say, superlink=superlink,
                         root_certificates=root_certificates, insecure=insecure, site_keys=site_keys,
                         flare_project=flare_project, timeout=timeout, overwrite=force)
    except OutputsExist as exc:
        close()
        fail(str(OutputsExist(exc.folder, exc.files, "--force")))
    except (JobError, FederationError, RunError, ValueError, OSError) as exc:
        close()
        fail(str(exc))
        return
    finally:
        close()
    _print_summary(result)
    where = Path(out) if out is not None else Path(result["job"]["run"]["out"])
    tracked = f"; MLflow run {result['mlflow']['run_id']}" if result.get("mlflow") else ""
    outcome(f"run {result['run_id']}: wrote {', '.join(str(where / f) for f in result['artifacts'].values())}"
            f"{tracked}")
