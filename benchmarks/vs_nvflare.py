"""Side by side with NVIDIA FLARE's feature election, on the FLARE example's own data.

    python -m benchmarks.vs_nvflare            # full run, writes benchmarks/results/vs_nvflare.{json,md}
    python -m benchmarks.vs_nvflare --quick    # small data, 2 rounds, results in a temp dir

Data as in NVFlare's ``examples/advanced/feature_election`` (``prepare_data.py``):
``make_classification`` with 3,000 rows, 100 features (20 informative, 30 redundant,
10 repeated, 2 clusters per class, ``flip_y=0.01``, seed 42), split into 3 sites by
successive stratified splits (seeds 42, 43), each site's rows split 80/20 into train and
validation (stratified, seed 42 + site index). Lasso selection, freedom degree 0.5,
5 FedAvg rounds.

Runs, in one process, one after another:

(a) ``nvflare-feature-election``: FLARE's ``FeatureElectionController`` and
    ``FeatureElectionExecutor`` (files instead of in-memory data) in FLARE's simulator,
    threads = 3;
(b) ``fedtab-local``: fedtab in-process; (c) ``fedtab-nvflare``: fedtab on FLARE's
    simulator (threads = 3, ``task_request_interval`` 0.2 s as ``build_job`` sets it);
    (d) ``fedtab-flower``: fedtab on a Flower loopback deployment (SuperLink + 3
    SuperNodes; time includes starting them).

For a like-for-like view the Markdown also reports (a) with a 0.2 s task request
interval and (c) with FLARE's default 2 s (``--skip same-interval`` leaves them out).

All fedtab runs use FLARE's local selector (``Lasso(alpha=0.01)`` regression on
standardised training rows, ``|coef| > 1e-6``) on the same training rows and
``normalization="selected"`` (FLARE's normalisation; on this data the masks are equal,
but only ``compat="nvflare"`` reproduces FLARE's whole rule, see ``fedtab.election.compat``).
``f1`` is the pooled weighted F1 of the final global model on the sites' validation
rows; for (a) it is computed here from the global weights FLARE's controller ends with
(FLARE's job does not report it), each site standardising with its own training-row
scaler as FLARE's executor does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification
from sklearn.metrics import f1_score
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
N_SITES = 3
TARGET = "target"


# ----------------------------------------------------------------------------- data
def example_data(n_per_site: int, seed: int = 42) -> dict[str, tuple[pd.DataFrame, pd.DataFrame]]:
    """``{site: (train, val)}`` as NVFlare's feature-election example prepares them."""
    X, y = make_classification(n_samples=n_per_site * N_SITES, n_features=100, n_informative=20, n_redundant=30,
                               n_repeated=10, n_clusters_per_class=2, flip_y=0.01, random_state=seed)
    frame = pd.DataFrame(X, columns=[f"feature_{i:03d}" for i in range(X.shape[1])])
    frame[TARGET] = y
    parts, rest = [], frame
    for i in range(N_SITES - 1):  # successive stratified splits, the last site keeps the rest
        share = (len(rest) // (N_SITES - i)) / len(rest)
        keep, take = train_test_split(np.arange(len(rest)), test_size=share, random_state=seed + i,
                                      stratify=rest[TARGET].to_numpy())
        parts.append(rest.iloc[take])
        rest = rest.iloc[keep].reset_index(drop=True)
    parts.append(rest)
    out = {}
    for i, part in enumerate(parts):
        tr, va = train_test_split(np.arange(len(part)), test_size=0.2, random_state=seed + i,
                                  stratify=part[TARGET].to_numpy())
        out[f"site-{i + 1}"] = (part.iloc[tr].reset_index(drop=True), part.iloc[va].reset_index(drop=True))
    return out


def write_data(data: dict[str, tuple[pd.DataFrame, pd.DataFrame]], folder: Path) -> list[dict[str, Any]]:
    """CSV files per site; returns fedtab site configs (FLARE's lasso as the site's selector)."""
    folder.mkdir(parents=True, exist_ok=True)
    configs = []
    for site, (train, val) in data.items():
        train.to_csv(folder / f"{site}_train.csv", index=False)
        val.to_csv(folder / f"{site}_val.csv", index=False)
        configs.append({"name": site, "data-path": str(folder / f"{site}_train.csv"),
                        "test-path": str(folder / f"{site}_val.csv"), "target": TARGET, "selector": "nvflare-lasso"})
    return configs


# ----------------------------------------------------------------------------- runs
def run_nvflare_example(data_dir: Path, workspace: Path, rounds: int, fd: float,
                        task_request_interval: float | None = None) -> dict[str, Any]:
    """(a): FLARE's own controller/executor in its simulator, threads = 3 (FLARE's default
    2 s task request interval unless ``task_request_interval`` is given)."""
    from nvflare.job_config.api import FedJob

    from benchmarks.nvflare_reference import FileDataExecutor, RecordingController

    job = FedJob(name="feature_election", min_clients=N_SITES)
    if task_request_interval is not None:
        job.to_server({"server": {"task_request_interval": task_request_interval}})
    job.to_server(RecordingController(freedom_degree=fd, aggregation_mode="weighted", min_clients=N_SITES,
                                      num_rounds=rounds, task_name="feature_election"))
    job.to_clients(FileDataExecutor(data_dir=str(data_dir), fs_method="lasso", task_name="feature_election"))
    t0 = time.perf_counter()
    rc = job.simulator_run(str(workspace), n_clients=N_SITES, threads=N_SITES, log_config="concise")
    seconds = time.perf_counter() - t0
    if rc not in (0, None):
        raise RuntimeError(f"FLARE's feature election job failed (simulator returned {rc}); see {workspace}")
    run_dir = workspace / "server" / "simulate_job"
    mask = np.asarray(json.loads((run_dir / "feature_election_results.json").read_text())["global_mask"], dtype=bool)
    weights = json.loads((run_dir / "global_weights.json").read_text())
    return {"seconds": seconds, "mask": mask, "weights": weights}


def f1_of_flare_model(data: dict[str, tuple[pd.DataFrame, pd.DataFrame]], mask: np.ndarray,
                      weights: dict[str, Any]) -> float | None:
    """Pooled weighted F1 of FLARE's final global logistic model on the validation rows."""
    if not weights:
        return None
    coef = np.atleast_2d(np.asarray(weights["weight_0"], dtype=np.float64))
    intercept = np.asarray(weights["weight_1"], dtype=np.float64)
    y_true, y_pred = [], []
    for train, val in data.values():
        names = [c for c in train.columns if c != TARGET]
        scaler = StandardScaler().fit(train[names].to_numpy()[:, mask])
        z = scaler.transform(val[names].to_numpy()[:, mask]) @ coef.T + intercept
        y_pred.append((z[:, 0] > 0).astype(int) if coef.shape[0] == 1 else z.argmax(axis=1))
        y_true.append(val[TARGET].to_numpy())
    return float(f1_score(np.concatenate(y_true), np.concatenate(y_pred), average="weighted"))


def job_plan(rounds: int, fd: float) -> dict[str, Any]:
    """The job every fedtab run makes: an election (FLARE's normalisation) and ``rounds`` of FedAvg
    (``solver = "fedavg"``: FLARE's job trains by FedAvg; fedtab's logistic default is Newton–Raphson),
    no column profile and no baselines (FLARE's job has neither): ``rounds + 3`` exchanges."""
    from fedtab.job.spec import parse_job

    return parse_job({"target": TARGET, "election": {"freedom_degree": fd, "normalization": "selected"},
                      "training": {"rounds": rounds, "local_epochs": 5,
                                   "model": {"name": "logistic", "params": {"solver": "fedavg"}}},
                      "schema": {"profile": False},
                      "evaluation": {"baselines": False}}, sites_required=False).plan()


def run_config(rounds: int, fd: float) -> dict[str, Any]:
    """The engines' run config of :func:`job_plan` (the plan as JSON under ``job``, the job's server app
    under ``server-app``: :func:`fedtab.job.apps.engine_config`)."""
    from fedtab.job.apps import engine_config

    return engine_config(job_plan(rounds, fd))


def run_fedtab_local(configs: list[dict[str, Any]], cfg: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    from fedtab.engines import LocalFederation
    from fedtab.engines.site_config import build_site
    from fedtab.job.workflow import engine_workflow

    t0 = time.perf_counter()
    result = engine_workflow(LocalFederation([build_site(c) for c in configs]), cfg)
    return time.perf_counter() - t0, result


def run_fedtab_nvflare(configs: list[dict[str, Any]], cfg: dict[str, Any], workspace: Path,
                      task_request_interval: float | None = 0.2) -> tuple[float, dict]:
    from fedtab.engines.nvflare import run_simulator

    t0 = time.perf_counter()
    result = run_simulator(configs, cfg, workspace, threads=N_SITES, task_request_interval=task_request_interval)
    return time.perf_counter() - t0, result


class ClientAppWatch:
    """Samples ``/proc`` every ``interval`` s in a thread and records how long each
    ``flwr-clientapp`` process lived (start and end to within ``interval``)."""

    def __init__(self, interval: float = 0.1) -> None:
        self.interval = interval
        self.seen: dict[int, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    cmd = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"flwr-clientapp" in cmd:
                    self.seen.setdefault(int(entry.name), [now, now])[1] = now
            self._stop.wait(self.interval)

    def __enter__(self) -> "ClientAppWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def lifetimes(self) -> list[float]:
        return sorted(end - start for start, end in self.seen.values())


BARE_APP = Path(__file__).resolve().parent / "flower_bare_app"
#: stages of a ClientApp message as fedtab's ClientApp reports them (fedtab.engines.flower.handle_message)
STAGES = ("before_fedtab", "fedtab_import", "flower_until_handler", "restore", "work", "store")


def bare_plan(result: dict[str, Any]) -> list[list[int]]:
    """``[request bytes, reply bytes]`` per exchange of a fedtab Flower run: the site-naming
    hello (empty arrays) and then the workflow's exchanges, largest message per exchange."""
    return [[0, 0]] + [[int(e.get("bytes_down", 0)), int(e.get("bytes_up", 0))] for e in result["exchanges"]]


def trace_runs(folder: Path) -> list[dict[str, Any]]:
    """Per ServerApp process of a traced deployment (``FEDTAB_FLOWER_TRACE``, one per run, in run
    order): ``server_cpu`` (the ServerApp's whole CPU seconds), ``clientapp_cpu`` (CPU seconds of
    each ``flwr-clientapp`` process of the run, whole process: Python, Flower, fedtab, the push of
    its reply), ``rounds`` (per request in order: its ``kind`` and the ``cpu`` of the processes that
    answered it), ``first_push`` (seconds from the ServerApp's start to its first request) and
    ``gaps`` (seconds from each exchange's last reply to the next request)."""
    from fedtab.engines.flower_trace import read_trace

    events = read_trace(folder)
    servers: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("role") == "serverapp":
            servers.setdefault(e["pid"], []).append(e)
    clients: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("role") == "clientapp":
            clients.setdefault(e["pid"], []).append(e)
    out = []
    for evs in sorted(servers.values(), key=lambda v: v[0]["t"]):
        start, end = evs[0]["t"], evs[-1]["t"]
        pushes = [e for e in evs if e["event"] == "push"]
        last_pull = {}
        for e in evs:
            if e["event"] == "pulled":
                last_pull[e["round"]] = e["t"]
        cpus, by_round = [], [[] for _ in pushes]
        for cev in clients.values():
            handler = next((e for e in cev if e["event"] == "handler_start"), None)
            if handler is None or not start <= handler["t"] <= end:
                continue
            done = next((e for e in cev if e["event"] == "exit"), None) or next(
                (e for e in cev if e["event"] == "handler_end"), handler)
            cpus.append(float(done["cpu"]))
            index = sum(p["t"] <= handler["t"] for p in pushes) - 1  # the request this process answered
            if index >= 0:
                by_round[index].append(float(done["cpu"]))
        exit_ = next((e for e in evs if e["event"] == "exit"), evs[-1])
        out.append({"server_cpu": float(exit_["cpu"]), "clientapp_cpu": cpus,
                    "rounds": [{"kind": p.get("kind", ""), "cpu": c} for p, c in zip(pushes, by_round)],
                    "first_push": pushes[0]["t"] - start if pushes else float("nan"),
                    "gaps": [b["t"] - last_pull[a["round"]] for a, b in zip(pushes, pushes[1:])
                             if a["round"] in last_pull]})
    return out


def run_fedtab_flower(configs: list[dict[str, Any]], cfg: dict[str, Any], workdir: Path, *,
                      bare: bool = True, pairs: int = 1, isolation: str = "subprocess") -> tuple[float, dict, dict | None]:
    """(d) fedtab on a loopback deployment with TLS + SuperNode auth, then (e) ``flower-bare``
    on the same SuperLink and SuperNodes with fedtab's exchange plan. Returns fedtab's
    seconds (start-up + run), its result, and the bare run's result (or None).

    With ``pairs`` > 1 the (fedtab, bare) pair runs that many times in turn on the same
    deployment; the first pair's runs are returned, and ``result["pairs"]`` holds every
    pair's ``flwr run`` seconds (a load change on a shared machine hits both runs of a pair).
    ``isolation``: the SuperNodes' ClientApp isolation (:class:`LoopbackDeployment`)."""
    from fedtab.engines.flower_deploy import LoopbackDeployment
    from fedtab.engines.flower_trace import ENV as TRACE_ENV

    trace = workdir / "trace"
    saved = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = str(trace)  # inherited by the SuperLink, SuperNodes and their app processes
    dep = LoopbackDeployment(configs, workdir, start_timeout=120, isolation=isolation)
    t0 = time.perf_counter()
    bare_result = None
    try:
        dep.start()
        started = time.perf_counter() - t0
        with ClientAppWatch() as watch:
            result = dep.run(cfg, timeout=900)
        seconds = time.perf_counter() - t0
        result["clientapp_seconds"] = watch.lifetimes()
        if bare:
            plan = {"plan": json.dumps(bare_plan(result))}
            with ClientAppWatch() as watch:
                bare_result = dep.run(plan, timeout=900, app=BARE_APP)
            bare_result["clientapp_seconds"] = watch.lifetimes()
            result["pairs"] = [[result["run_seconds"], bare_result["run_seconds"]]]
            for _ in range(pairs - 1):
                again = dep.run(cfg, timeout=900)["run_seconds"]
                result["pairs"].append([again, dep.run(plan, timeout=900, app=BARE_APP)["run_seconds"]])
    finally:
        dep.stop()
        if saved is None:
            os.environ.pop(TRACE_ENV, None)
        else:
            os.environ[TRACE_ENV] = saved
    result["deployment_start_seconds"] = started
    runs = trace_runs(trace) if trace.is_dir() else []
    if bare and len(runs) == 2 * len(result.get("pairs", [])):  # fedtab, bare, fedtab, bare...
        result["trace_pairs"] = [[runs[i], runs[i + 1]] for i in range(0, len(runs), 2)]
    return seconds, result, bare_result


# ----------------------------------------------------------------------------- report
def _row(name: str, seconds: float, kept: int, equal: bool, f1: float | None) -> dict[str, Any]:
    return {"name": name, "seconds": round(seconds, 3), "kept": int(kept), "mask_equals_nvflare": bool(equal),
            "f1": None if f1 is None else round(float(f1), 4)}


def _flower_lines(notes: dict[str, Any]) -> list[str]:
    """(d) and (e): fedtab on Flower against a bare Flower app, and where each message's time goes."""
    res, bare = notes["flower_result"], notes.get("bare_result")
    ex = res.get("exchanges") or []
    apps = res.get("clientapp_seconds") or []
    lines = [
        f"- (d) runs on a loopback deployment secured as in production: SuperLink with TLS (consortium CA) and "
        f"`--enable-supernode-auth`, 3 SuperNodes with registered P-384 keys, `site-keys` binding names to keys. "
        f"Its seconds include starting the SuperLink, registering the keys and starting the SuperNodes "
        f"({notes['flower_start']:.1f} s); `flwr run` until the result: {res['run_seconds']:.1f} s; inside the "
        f"ServerApp: {res['seconds_total']:.1f} s. {len(ex)} workflow exchanges after one to name the sites; "
        f"{len(apps)} `flwr-clientapp` processes (one per message), median lifetime "
        f"{float(np.median(apps)) if apps else float('nan'):.1f} s.",
    ]
    if bare is None:
        return lines
    ratio = res["run_seconds"] / bare["run_seconds"]
    pairs = res.get("pairs") or [[res["run_seconds"], bare["run_seconds"]]]
    ratios = [a / b for a, b in pairs]
    bapps = bare.get("clientapp_seconds") or []
    lines += [
        f"- (e) `flower-bare` (benchmarks/flower_bare.py): a Flower ServerApp/ClientApp pair with no fedtab import, "
        f"run on the same SuperLink and SuperNodes (TLS + auth) right after (d), making the same "
        f"{len(bare['exchanges'])} exchanges (the naming hello with empty arrays, then (d)'s exchanges with its "
        f"largest request and reply size each) and no work. `flwr run` until the result: "
        f"{bare['run_seconds']:.1f} s; inside the ServerApp: {bare['seconds_total']:.1f} s; median ClientApp "
        f"lifetime {float(np.median(bapps)) if bapps else float('nan'):.1f} s. Its row's seconds add (d)'s start-up.",
        "",
        f"**fedtab-flower / flower-bare = {float(np.median(ratios)):.2f}×** (`flwr run` until the result, median of "
        f"{len(pairs)} pair(s) run in turn on the same deployment; goal ≤ 1.25×). Pairs (fedtab s / bare s): "
        + ", ".join(f"{a:.1f} / {b:.1f} = {a / b:.2f}×" for a, b in pairs)
        + f". First pair inside the ServerApp: {res['seconds_total'] / bare['seconds_total']:.2f}× "
        f"(first pair `flwr run`: {ratio:.2f}×).",
        "",
    ]
    traced = res.get("trace_pairs") or []
    if traced:
        def per_message(run: dict[str, Any]) -> float:
            return float(np.mean(run["clientapp_cpu"])) if run["clientapp_cpu"] else float("nan")

        def first_step(run: dict[str, Any]) -> float:  # the request after the naming hello (the ballot)
            rounds = run.get("rounds") or []
            return float(np.mean(rounds[1]["cpu"])) if len(rounds) > 1 and rounds[1]["cpu"] else float("nan")

        def later(run: dict[str, Any]) -> float:  # every request after the first step
            cpu = [c for r in (run.get("rounds") or [])[2:] for c in r["cpu"]]
            return float(np.mean(cpu)) if cpu else float("nan")

        cpu_ratios = [per_message(f) / per_message(b) for f, b in traced]
        lines += [
            f"**CPU per site message (load-independent): fedtab / bare = {float(np.median(cpu_ratios)):.2f}×** "
            f"(median over the pairs; whole `flwr-clientapp` processes, from `FEDTAB_FLOWER_TRACE`). Pairs "
            "(fedtab / bare CPU-s per message; ServerApp CPU-s; ServerApp start to first request, s; largest gap "
            "from an exchange's last reply to the next request, s): "
            + ", ".join(f"{per_message(f):.3f} / {per_message(b):.3f} = {per_message(f) / per_message(b):.2f}× "
                        f"(server {f['server_cpu']:.2f} / {b['server_cpu']:.2f}; first request "
                        f"{f['first_push']:.2f} / {b['first_push']:.2f}; gap {max(f['gaps'], default=0):.2f} / "
                        f"{max(b['gaps'], default=0):.2f})" for f, b in traced) + ".",
            "",
            "Per message kind, CPU-s per `flwr-clientapp` process, fedtab / bare, each pair: the first step (the "
            "ballot) " + ", ".join(f"{first_step(f):.3f} / {first_step(b):.3f} = {first_step(f) / first_step(b):.2f}×"
                                   for f, b in traced)
            + "; every later message " + ", ".join(f"{later(f):.3f} / {later(b):.3f} = {later(f) / later(b):.2f}×"
                                                   for f, b in traced) + ".",
            "",
        ]
    lines += [
        "Per exchange (seconds; ClientApp stages are means over the 3 sites, measured inside fedtab's ClientApp "
        "process: *before fedtab* = process start, Python, Flower's imports, FAB install; *until handler* = Flower "
        "pulling the message):",
        "",
        "| exchange | bytes down / up | fedtab | bare | before fedtab | fedtab import | until handler | "
        "restore site | work | store state |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for e, b in zip(ex, bare["exchanges"][1:]):
        c = e.get("clientapp") or {}
        cells = " | ".join(f"{c[k]:.2f}" if k in c else "—" for k in STAGES)
        lines.append(f"| {e['kind']} | {e.get('bytes_down', 0):,} / {e.get('bytes_up', 0):,} | {e['seconds']:.2f} | "
                     f"{b['seconds']:.2f} | {cells} |")
    tot = sum(e["seconds"] for e in ex), sum(b["seconds"] for b in bare["exchanges"][1:])
    lines += [f"| total | | {tot[0]:.2f} | {tot[1]:.2f} | | | | | | |", ""]
    return lines


def write_markdown(path: Path, runs: list[dict[str, Any]], notes: dict[str, Any]) -> None:
    base = next(r["seconds"] for r in runs if r["name"] == "nvflare-feature-election")
    lines = [
        "# fedtab vs NVIDIA FLARE feature election (side by side)",
        "",
        f"Command: `{notes['command']}`  ",
        f"Data: NVFlare example's make_classification ({notes['rows']} rows, 100 features: 20 informative, "
        "30 redundant, 10 repeated), 3 sites, Lasso (FLARE's: alpha 0.01 on standardised X), "
        f"freedom degree {notes['fd']}, {notes['rounds']} FedAvg rounds; fedtab with `normalization=\"selected\"`.  ",
        f"Machine: {os.cpu_count()} cores; load average at start {notes['load_start']}, at end {notes['load_end']} "
        "(this benchmark's own processes included; other jobs on the machine make absolute times noisy).",
        "",
        "| run | seconds | × vs (a) | kept | mask = FLARE's | F1 (weighted, validation rows) |",
        "|---|---:|---:|---:|:---:|---:|",
    ]
    for r in runs:
        ratio = base / r["seconds"] if r["seconds"] > 0 else float("inf")
        f1 = "—" if r["f1"] is None else f"{r['f1']:.4f}"
        equal = {None: "—", True: "yes", False: "NO"}[r["mask_equals_nvflare"]]
        lines.append(f"| {r['name']} | {r['seconds']:.2f} | {ratio:.2f}× | {'—' if r['kept'] is None else r['kept']} | "
                     f"{equal} | {f1} |")
    if notes.get("extra"):
        lines += ["", "Same FLARE setting on both sides (not in the JSON):", "",
                  "| run | seconds | × vs (a) | kept | mask = FLARE's |", "|---|---:|---:|---:|:---:|"]
        for name, sec, kept, equal in notes["extra"]:
            lines.append(f"| {name} | {sec:.2f} | {base / sec:.2f}× | {kept} | {'yes' if equal else 'NO'} |")
    lines += [
        "",
        "× vs (a) = seconds of (a) / seconds of the run (above 1 = faster than FLARE's job).",
        "- fedtab's FLARE job (c) sets FLARE's `server.task_request_interval` to 0.2 s (`build_job` default); FLARE's "
        "example job (a) keeps FLARE's default of 2 s, which a client waits after every task. The second table "
        "swaps the setting so both jobs can be compared at either interval.",
        "",
        "- (a) is FLARE's own `FeatureElectionController` + `FeatureElectionExecutor` in `simulator_run(threads=3)`; "
        "its F1 is computed by this benchmark from the controller's final global weights (each site standardising "
        "with its own training scaler, as FLARE's executor does) — FLARE's job does not report it.",
        "- (c) and (a) both include starting FLARE's simulated server and clients.",
    ]
    if "flower_start" in notes:
        lines += _flower_lines(notes)
    lines += [
        f"- Masks: fedtab's elected features equal FLARE's global mask: "
        f"{all(r['mask_equals_nvflare'] is not False for r in runs)} (FLARE kept {notes['flare_kept']}).",
    ]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="600 rows, 2 rounds, results to a temporary folder")
    parser.add_argument("--out", type=Path, default=None, help="folder for vs_nvflare.json/.md")
    parser.add_argument("--pairs", type=int, default=3,
                        help="fedtab-flower/flower-bare pairs run in turn on one deployment; the ratio is their median")
    parser.add_argument("--skip", default="",
                        help="comma list of runs to skip: local,nvflare,same-interval,flower,bare")
    parser.add_argument("--isolation", choices=("subprocess", "process"), default="subprocess",
                        help="the SuperNodes' ClientApp isolation on the Flower deployment (Flower's --isolation)")
    args = parser.parse_args(argv)
    n_per_site, rounds, fd = (200, 2, 0.5) if args.quick else (1000, 5, 0.5)
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="vs_nvflare_")) if args.quick else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    load_start = os.getloadavg()[0]

    work = Path(tempfile.mkdtemp(prefix="fedtab_vs_nvflare_"))
    try:
        data = example_data(n_per_site)
        configs = write_data(data, work / "data")
        cfg = run_config(rounds, fd)
        names = [c for c in next(iter(data.values()))[0].columns if c != TARGET]

        flare = run_nvflare_example(work / "data", work / "flare_example", rounds, fd)
        flare_selected = [n for n, m in zip(names, flare["mask"]) if m]
        runs = [_row("nvflare-feature-election", flare["seconds"], int(flare["mask"].sum()), True,
                     f1_of_flare_model(data, flare["mask"], flare["weights"]))]
        notes: dict[str, Any] = {"flare_kept": int(flare["mask"].sum())}

        def add(name: str, seconds: float, result: dict[str, Any]) -> None:
            selected = result["election"]["selected"]
            runs.append(_row(name, seconds, len(selected), selected == flare_selected,
                             result["training"]["metrics"]["pooled"]["weighted_f1"]))

        if "local" not in skip:
            add("fedtab-local", *run_fedtab_local(configs, cfg))
        if "nvflare" not in skip:
            add("fedtab-nvflare", *run_fedtab_nvflare(configs, cfg, work / "fedtab_flare"))
        if "same-interval" not in skip:  # md only: both FLARE jobs with each other's interval
            extra = []
            a2 = run_nvflare_example(work / "data", work / "flare_example_fast", rounds, fd, task_request_interval=0.2)
            extra.append(("nvflare-feature-election, task_request_interval 0.2 s", a2["seconds"],
                          int(a2["mask"].sum()), True))
            sec, res = run_fedtab_nvflare(configs, cfg, work / "fedtab_flare_default", task_request_interval=None)
            extra.append(("fedtab-nvflare, FLARE's default task_request_interval (2 s)", sec,
                          len(res["election"]["selected"]), res["election"]["selected"] == flare_selected))
            notes["extra"] = extra
        if "flower" not in skip:
            seconds, result, bare = run_fedtab_flower(configs, cfg, work / "fedtab_flower", bare="bare" not in skip,
                                                      pairs=args.pairs, isolation=args.isolation)
            notes["isolation"] = args.isolation
            notes["flower_start"] = result["deployment_start_seconds"]
            notes["flower_run"] = result["run_seconds"]
            notes["flower_result"] = result
            notes["bare_result"] = bare
            add("fedtab-flower", seconds, result)
            if bare is not None:
                runs.append({"name": "flower-bare", "seconds": round(notes["flower_start"] + bare["run_seconds"], 3),
                             "kept": None, "mask_equals_nvflare": None, "f1": None,
                             "run_seconds": round(bare["run_seconds"], 3),
                             "serverapp_seconds": round(bare["seconds_total"], 3),
                             "exchanges": bare["exchanges"]})
                runs[-2].update(run_seconds=round(result["run_seconds"], 3),
                                serverapp_seconds=round(result["seconds_total"], 3),
                                exchanges=result["exchanges"],
                                pairs=[[round(a, 3), round(b, 3)] for a, b in result["pairs"]],
                                ratio_to_flower_bare=round(float(np.median([a / b for a, b in result["pairs"]])), 3))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    (out_dir / "vs_nvflare.json").write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    notes.update(command="python -m benchmarks.vs_nvflare" + (" --quick" if args.quick else ""),
                 rows=n_per_site * N_SITES, fd=fd, rounds=rounds, load_start=f"{load_start:.1f}",
                 load_end=f"{os.getloadavg()[0]:.1f}")
    write_markdown(out_dir / "vs_nvflare.md", runs, notes)
    print((out_dir / "vs_nvflare.md").read_text())
    return 0 if all(r["mask_equals_nvflare"] is not False for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
