"""Where the time goes: the same small job on every engine, next to a bare Flower app.

    python -m benchmarks.engines                       # every engine, the default job
    python -m benchmarks.engines --quick               # small data, 1 round (smoke run)
    python -m benchmarks.engines --engines local,flower-inprocess   # a subset

The job is benchmarks/vs_nvflare.py's (3 sites of NVFlare's feature-election example data,
FLARE's Lasso selector, freedom degree 0.5, ``rounds`` FedAvg rounds); every site has a
state folder, as ``fedtab deploy`` writes one (so the table cache of
:mod:`fedtab.engines.table_cache` is in play). Engines, one after another:

* ``local``: in-process (:class:`fedtab.engines.LocalFederation`);
* ``flower-inprocess``: Flower's real ServerApp and ClientApp in one process
  (:func:`fedtab.engines.flower.run_in_process`, fresh ClientApp state per message). Flower's
  own simulation runtime needs Ray, which this environment does not have: this is the
  closest Flower run without a SuperLink;
* ``flower-loopback``: a Flower deployment on 127.0.0.1 with TLS and SuperNode
  authentication (:class:`fedtab.engines.flower_deploy.LoopbackDeployment`; seconds are
  ``flwr run`` until the result, without starting the deployment), then ``flower-bare``
  (benchmarks/flower_bare.py: no fedtab, the same exchanges with the same payload sizes)
  on the same SuperLink and SuperNodes, then fedtab again with the ServerApp pulling replies
  every 3 s (Flower's ``Grid.send_and_receive``) instead of every 0.05 s, then the first run
  again (run order matters: the first run of a site reads its CSV, later ones its table cache);
* ``nvflare-sim``: FLARE's simulator (threads = 3, ``task_request_interval`` 0.2 s).

Printed per engine: exchanges (the site-naming hello not counted), seconds, seconds per
exchange, fedtab's own seconds per site message, and the ratio of seconds per exchange to
``flower-bare``'s. "fedtab s / site message" is measured where it can be told apart: on a
Flower deployment, the mean over exchanges of the ClientApp's own stage timings (importing
fedtab, restoring the site, the handler, storing its state: wall seconds of single-threaded
stages, so a loaded machine inflates them); in-process and on FLARE's simulator it is this
process's (and its children's) CPU seconds divided by the site messages, which for FLARE
includes FLARE's own work (marked ``≤``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ENGINES = ("local", "flower-inprocess", "flower-loopback", "nvflare-sim")
#: engines cheap enough for the test suite (no SuperLink, no FLARE processes)
CHEAP = ("local", "flower-inprocess")
#: ClientApp stages that are fedtab's own work (fedtab.engines.flower.handle_message)
FEDTAB_STAGES = ("fedtab_import", "restore", "work", "store")


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _workflow_exchanges(result: dict[str, Any]) -> int:
    if result.get("exchanges"):
        return len(result["exchanges"])
    return len(result.get("participation", {}).get("exchanges", []))


def _clientapp_cpu(result: dict[str, Any]) -> float | None:
    """Mean over the workflow's exchanges of fedtab's ClientApp stages (seconds per site message)."""
    per = [sum(float(e["clientapp"].get(s, 0.0)) for s in FEDTAB_STAGES)
           for e in result.get("exchanges", []) if e.get("clientapp")]
    return sum(per) / len(per) if per else None


def _row(engine: str, seconds: float, exchanges: int, cpu_per_message: float | None, bound: bool = False,
         note: str = "") -> dict[str, Any]:
    return {"engine": engine, "exchanges": exchanges, "seconds": seconds,
            "seconds_per_exchange": seconds / exchanges if exchanges else float("nan"),
            "fedtab_cpu_per_message": cpu_per_message, "cpu_is_upper_bound": bound, "note": note}


def run_engines(engines: tuple[str, ...], *, quick: bool, workdir: Path, n_sites: int = 3) -> list[dict[str, Any]]:
    """Run the job on each of ``engines`` (names from :data:`ENGINES`); one row per engine
    (plus ``flower-bare`` after ``flower-loopback``).

    Raises:
        ValueError: an unknown engine name.
    """
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engine(s) {unknown}; choose from {', '.join(ENGINES)}")
    from benchmarks.vs_nvflare import example_data, run_config, write_data

    rounds = 1 if quick else 5
    configs = write_data(example_data(100 if quick else 1000), workdir / "data")[:n_sites]
    cfg = run_config(rounds, 0.5)
    rows: list[dict[str, Any]] = []
    for engine in engines:
        sites = [{**c, "state-dir": str(workdir / engine / "state" / c["name"])} for c in configs]
        runner: Callable[[], list[dict[str, Any]]] = {
            "local": lambda: _local(sites, cfg),
            "flower-inprocess": lambda: _flower_inprocess(sites, cfg),
            "flower-loopback": lambda: _flower_loopback(sites, cfg, workdir / engine),
            "nvflare-sim": lambda: _nvflare_sim(sites, cfg, workdir / engine),
        }[engine]
        rows.extend(runner())
    bare = next((r for r in rows if r["engine"] == "flower-bare"), None)
    for r in rows:
        r["ratio_to_bare"] = (r["seconds_per_exchange"] / bare["seconds_per_exchange"]) if bare else None
    return rows


def _local(sites: list[dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.vs_nvflare import run_fedtab_local

    cpu = _cpu()
    seconds, result = run_fedtab_local(sites, cfg)
    n = _workflow_exchanges(result)
    return [_row("local", seconds, n, (_cpu() - cpu) / (n * len(sites)))]


def _flower_inprocess(sites: list[dict[str, Any]], cfg: dict[str, Any]) -> list[dict[str, Any]]:
    import logging

    from fedtab.engines.flower import run_in_process

    logging.getLogger("flwr").setLevel(logging.WARNING)
    cpu, t0 = _cpu(), time.perf_counter()
    result = run_in_process(sites, cfg)
    seconds = time.perf_counter() - t0
    n = _workflow_exchanges(result)
    return [_row("flower-inprocess", seconds, n, (_cpu() - cpu) / (n * len(sites)),
                 note="ServerApp + ClientApps in one process, no SuperLink")]


def _flower_loopback(sites: list[dict[str, Any]], cfg: dict[str, Any], workdir: Path, *,
                     slow_poll: bool = True) -> list[dict[str, Any]]:
    """fedtab, then ``flower-bare`` with fedtab's exchange plan, then (``slow_poll``) fedtab again
    pulling replies every 3 s as ``Grid.send_and_receive`` does, on one loopback deployment."""
    from benchmarks.vs_nvflare import BARE_APP, bare_plan

    from fedtab.engines.flower_deploy import LoopbackDeployment

    dep = LoopbackDeployment(sites, workdir, start_timeout=120)
    t0 = time.perf_counter()
    try:
        dep.start()
        started = time.perf_counter() - t0
        result = dep.run(cfg, timeout=900)
        bare = dep.run({"plan": json.dumps(bare_plan(result))}, timeout=900, app=BARE_APP)
        slow = dep.run({**cfg, "poll-interval": 3.0}, timeout=900) if slow_poll else None
        again = dep.run(cfg, timeout=900) if slow_poll else None  # the same as the first, after the others
    finally:
        dep.stop()
    n = _workflow_exchanges(result)
    rows = [_row("flower-loopback", float(result["run_seconds"]), n, _clientapp_cpu(result),
                 note=f"TLS + auth; `flwr run` until the result (hello + {n} exchanges); deployment start "
                      f"{started:.1f} s not counted"),
            _row("flower-bare", float(bare["run_seconds"]), n, None, note="no fedtab; same exchanges and bytes")]
    if slow is not None:
        rows.append(_row("flower-loopback, 3 s reply poll", float(slow["run_seconds"]), _workflow_exchanges(slow),
                         _clientapp_cpu(slow), note="run config poll-interval = 3 (Grid.send_and_receive's sleep)"))
    if again is not None:
        rows.append(_row("flower-loopback, again", float(again["run_seconds"]), _workflow_exchanges(again),
                         _clientapp_cpu(again), note="the first run repeated last (table cache warm)"))
    return rows


def _nvflare_sim(sites: list[dict[str, Any]], cfg: dict[str, Any], workdir: Path) -> list[dict[str, Any]]:
    from fedtab.engines.nvflare import run_simulator

    cpu, t0 = _cpu(), time.perf_counter()
    result = run_simulator(sites, cfg, workdir, threads=len(sites), task_request_interval=0.2)
    seconds = time.perf_counter() - t0
    n = _workflow_exchanges(result)
    return [_row("nvflare-sim", seconds, n, (_cpu() - cpu) / (n * len(sites)), bound=True,
                 note="threads = sites, task_request_interval 0.2 s")]


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    def num(v: float | None, fmt: str) -> str:
        return "—" if v is None or v != v else format(v, fmt)

    lines = ["| engine | exchanges | seconds | s / exchange | fedtab s / site message | × bare per exchange | note |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cpu = num(r["fedtab_cpu_per_message"], ".3f")
        lines.append(f"| {r['engine']} | {r['exchanges']} | {r['seconds']:.2f} | {num(r['seconds_per_exchange'], '.3f')} "
                     f"| {'≤ ' if r['cpu_is_upper_bound'] and cpu != '—' else ''}{cpu} "
                     f"| {num(r.get('ratio_to_bare'), '.2f')} | {r['note']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, 1 FedAvg round")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {', '.join(ENGINES)}")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fedtab-engines-") as tmp:
        try:
            rows = run_engines(engines, quick=args.quick, workdir=Path(tmp))
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; at end: "
          + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
