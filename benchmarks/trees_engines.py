"""Where trees should be trained: the same GBDT job in-process, on NVIDIA FLARE and on Flower.

    python -m benchmarks.trees_engines                     # 100 trees of depth 6 on local, FLARE loopback, Flower
    python -m benchmarks.trees_engines --engines local,nvflare-sim --trees 20
    python -m benchmarks.trees_engines --quick             # smoke run: 600 rows, 2 trees of depth 2, local only

The job: UCI Adult's 32,561 training rows one-hot encoded and split into 3 sites (50/30/20 %,
stratified, seed 0: :func:`benchmarks.gbdt.site_tables`, the homogeneous case), each site a
CSV file with its own state folder; ``adult.test`` (16,281 rows) is every site's test file. The
job plan (:meth:`fedtab.job.spec.JobSpec.plan`) trains ``[training] model = gbdt`` with
``n_trees`` and ``max_depth`` (XGBoost's other defaults), no election, no column profile, no
baselines. It is a **plain** run: every site's policy opts in to ``allow_server_row_sets``
(plain answers over the server's tree nodes), as ``benchmarks.gbdt``'s ``fed_gbdt`` row; secure
aggregation needs per-site identity keys, which this benchmark does not provision.

Engines, one after another:

* ``local``: in-process (:class:`fedtab.engines.LocalFederation`, the sites built from the same
  site configs);
* ``nvflare-sim``: FLARE's simulator (threads = sites, ``task_request_interval`` 0.2 s);
* ``nvflare-loopback``: a provisioned FLARE project on 127.0.0.1 (mutual TLS; server and one
  client per site started from their startup kits, :class:`fedtab.engines.nvflare_deploy.LoopbackProject`)
  and the job submitted with the admin's kit; seconds are from submission to the result (the
  project's start is printed, not counted);
* ``flower-loopback``: a Flower deployment on 127.0.0.1 with TLS and SuperNode authentication
  (:class:`fedtab.engines.flower_deploy.LoopbackDeployment`), running only ``--flower-trees``
  trees (default 2) because a Flower exchange costs seconds; its row also gives the minutes
  ``extrapolated`` to the full job's exchanges at the measured seconds per exchange (labelled
  as such: not a measured 100-tree run).

Printed per engine: trees, exchanges (the job's steps, the site-naming hello not counted), wall
minutes, seconds per exchange, and the load average before and after. Every process a
deployment starts runs in its own session and is killed with its group when the run ends
(also on error).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENGINES = ("local", "nvflare-sim", "nvflare-loopback", "flower-loopback")
DEFAULT_ENGINES = ("local", "nvflare-loopback", "flower-loopback")
TARGET = "income"
POLICY = json.dumps({"allow_server_row_sets": True})


def write_sites(folder: Path, *, rows: int | None = None) -> list[dict[str, Any]]:
    """Adult's 3 sites as CSV files in ``folder``; returns their site configs (plain-run policy,
    a state folder each). ``rows``: keep only the first ``rows`` training rows (the quick mode)."""
    import pandas as pd

    from benchmarks.gbdt import adult_matrices, site_tables

    X, y, Xt, yt, names = adult_matrices()
    if rows is not None:
        X, y, Xt, yt = X[:rows], y[:rows], Xt[: rows // 2], yt[: rows // 2]
    folder.mkdir(parents=True, exist_ok=True)
    test = folder / "adult_test.csv"
    pd.DataFrame(Xt, columns=names).assign(**{TARGET: yt}).to_csv(test, index=False)
    configs = []
    for i, part in enumerate(site_tables(X, y, names, heterogeneous=False)):
        path = folder / f"site-{i + 1}.csv"
        part.to_csv(path, index=False)
        configs.append({"name": f"site-{i + 1}", "data-path": str(path), "test-path": str(test), "target": TARGET,
                        "policy": POLICY, "state-dir": str(folder / "state" / f"site-{i + 1}")})
    return configs


def job_config(n_trees: int, max_depth: int) -> dict[str, str]:
    """The engines' run config: the GBDT job's plan as JSON under ``job``, its server app under ``server-app``."""
    from fedtab.job.apps import engine_config
    from fedtab.job.spec import parse_job

    plan = parse_job({"target": TARGET, "schema": {"profile": False}, "evaluation": {"baselines": False},
                      "training": {"model": {"name": "gbdt", "params": {"n_trees": n_trees, "max_depth": max_depth}}}},
                     sites_required=False).plan()
    return engine_config(plan)


def exchanges(result: dict[str, Any]) -> int:
    """The job's exchanges: the sum over its steps' rows (the site-naming hello is not a step)."""
    return int(sum(s["exchanges"] for s in result["steps"]))


def _local(sites: list[dict[str, Any]], cfg: dict[str, str], workdir: Path) -> tuple[dict[str, Any], str]:
    from fedtab.engines import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.workflow import engine_workflow

    return engine_workflow(LocalFederation([build_site(c) for c in sites]), cfg), "in-process"


def _nvflare_sim(sites: list[dict[str, Any]], cfg: dict[str, str], workdir: Path) -> tuple[dict[str, Any], str]:
    from fedtab.engines.nvflare import run_simulator

    return (run_simulator(sites, cfg, workdir, threads=len(sites), task_request_interval=0.2),
            "FLARE simulator, threads = sites, task_request_interval 0.2 s")


def _nvflare_loopback(sites: list[dict[str, Any]], cfg: dict[str, str], workdir: Path) -> tuple[dict[str, Any], str]:
    from fedtab.engines.nvflare_deploy import LoopbackProject
    from fedtab.engines.nvflare_remote import run_on_project

    t0 = time.perf_counter()
    with LoopbackProject(sites, workdir / "project") as project:  # stops every process on exit
        started = time.perf_counter() - t0
        result = run_on_project(sites, cfg, project.admin_kit, workdir / "run", timeout=3600)
    return result, f"provisioned project, mutual TLS; project start {started:.0f} s not counted"


def _flower_loopback(sites: list[dict[str, Any]], cfg: dict[str, str], workdir: Path) -> tuple[dict[str, Any], str]:
    from fedtab.engines.flower_deploy import LoopbackDeployment

    t0 = time.perf_counter()
    with LoopbackDeployment(sites, workdir, start_timeout=120) as dep:  # stops every process on exit
        started = time.perf_counter() - t0
        result = dep.run(cfg, timeout=3600)
    return result, f"TLS + SuperNode auth; `flwr run` until the result; deployment start {started:.0f} s not counted"


RUNNERS = {"local": _local, "nvflare-sim": _nvflare_sim, "nvflare-loopback": _nvflare_loopback,
           "flower-loopback": _flower_loopback}


def run(engines: tuple[str, ...], *, n_trees: int, max_depth: int, flower_trees: int, workdir: Path,
        rows: int | None = None) -> list[dict[str, Any]]:
    """One row per engine: ``engine, trees, exchanges, seconds, minutes, seconds_per_exchange``,
    ``auroc`` (the job's pooled test AUROC, when it reports one), ``note``; the Flower row also
    ``extrapolated_minutes`` (the ``n_trees`` job's exchanges, counted in-process when ``local``
    ran, × its seconds per exchange).

    Raises:
        ValueError: an unknown engine name, or trees / depth below 1.
    """
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; choose from {', '.join(ENGINES)}")
    if min(n_trees, max_depth, flower_trees) < 1:
        raise ValueError("trees, depth and Flower trees must be at least 1")
    sites = write_sites(workdir / "data", rows=rows)
    out: list[dict[str, Any]] = []
    for engine in engines:
        trees = min(flower_trees, n_trees) if engine == "flower-loopback" else n_trees
        engine_sites = [{**s, "state-dir": str(workdir / engine / "state" / s["name"])} for s in sites]
        t0 = time.perf_counter()
        result, note = RUNNERS[engine](engine_sites, job_config(trees, max_depth), workdir / engine)
        seconds = time.perf_counter() - t0 if engine in ("local", "nvflare-sim") else float(
            result.get("run_seconds", time.perf_counter() - t0))
        n = exchanges(result)
        auroc = ((result.get("training") or {}).get("metrics") or {}).get("pooled", {}).get("auroc")
        out.append({"engine": engine, "trees": trees, "max_depth": max_depth, "exchanges": n, "seconds": seconds,
                    "minutes": seconds / 60, "seconds_per_exchange": seconds / n, "auroc": auroc, "note": note})
    return extrapolate(out, n_trees, planned_exchanges(n_trees, max_depth))


def planned_exchanges(n_trees: int, max_depth: int) -> int:
    """The exchanges the job's plan makes (:func:`fedtab.job.exchange_plan.planned_exchanges`)."""
    from fedtab.job.exchange_plan import planned_exchanges as plan_count
    from fedtab.job.spec import spec_from_plan

    return int(sum(plan_count(spec_from_plan(json.loads(job_config(n_trees, max_depth)["job"]))).values()))


def extrapolate(rows: list[dict[str, Any]], n_trees: int, planned: int) -> list[dict[str, Any]]:
    """Give every row of fewer than ``n_trees`` trees ``extrapolated_minutes``: the full job's
    exchanges (those of a row that ran ``n_trees``, else ``planned``, the plan's count) × the row's
    measured seconds per exchange, and say so in its note. Rows are changed in place and returned."""
    ran = next((r["exchanges"] for r in rows if r["trees"] == n_trees), None)
    full, source = (ran, "counted in the full run") if ran is not None else (planned, "the plan's count")
    for r in rows:
        if r["trees"] < n_trees:
            r["extrapolated_minutes"] = full * r["seconds_per_exchange"] / 60
            r["note"] += f"; {n_trees} trees extrapolated: {full} exchanges ({source}) × measured s / exchange"
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| engine | trees × depth | exchanges | wall minutes | s / exchange | full job, minutes | note |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        full = f"{r['extrapolated_minutes']:.1f} (extrapolated)" if "extrapolated_minutes" in r else f"{r['minutes']:.2f}"
        lines.append(f"| {r['engine']} | {r['trees']} × {r['max_depth']} | {r['exchanges']} | {r['minutes']:.2f} "
                     f"| {r['seconds_per_exchange']:.3f} | {full} | {r['note']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default=None, help=f"comma-separated subset of {', '.join(ENGINES)} "
                                                        f"(default {','.join(DEFAULT_ENGINES)}; --quick: local)")
    parser.add_argument("--trees", type=int, default=100)
    parser.add_argument("--max-depth", type=int, default=6)
    parser.add_argument("--flower-trees", type=int, default=2, help="trees actually run on Flower (extrapolated)")
    parser.add_argument("--quick", action="store_true", help="600 training rows, 2 trees of depth 2, local only")
    parser.add_argument("--json", type=Path, help="also write the rows and load averages as JSON here")
    parser.add_argument("--workdir", type=Path, help="keep data, kits and logs here (default: a temporary folder)")
    args = parser.parse_args(argv)
    default = ("local",) if args.quick else DEFAULT_ENGINES
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip()) if args.engines else default
    trees, depth = (2, 2) if args.quick else (args.trees, args.max_depth)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedtab-trees-") as tmp:
        tmp = str(args.workdir) if args.workdir else tmp
        try:
            rows = run(engines, n_trees=trees, max_depth=depth, flower_trees=args.flower_trees, workdir=Path(tmp),
                       rows=600 if args.quick else None)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    load1 = os.getloadavg()
    print(f"load average (1, 5, 15 min) at start: {' '.join(f'{v:.2f}' for v in load0)}; "
          f"at end: {' '.join(f'{v:.2f}' for v in load1)}; {os.cpu_count()} CPUs")
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load_start": load0, "load_end": load1}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
