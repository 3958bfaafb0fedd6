"""Privacy benchmark: DP utility against ε, and the cost of secure aggregation.

* ``dp`` rows — utility of each workflow under differential privacy, ε ∈ {0.5, 1, 2, 4, 8, ∞}
  (∞ = no noise), δ = 1e-5, one run per ε (the noise is drawn from OS entropy):

  - ``election`` on the seed demo (2000×100, signal = first 20 columns; three sites with
    Lasso / random forest / mutual information): noisy ballots and a noisy description,
    fd = 0.5; metrics ``signal_kept`` (signal columns elected) and ``f1`` (weighted F1
    of a non-private FedAvg logistic regression on the elected columns, 10 rounds);
  - ``training`` on the seed demo: logistic regression by DP gradient descent (per-example
    clip 1, 10 rounds × 20 full-batch steps) on the columns a plain election elects at
    fd 0.5, noisy description and confusion matrices; metric ``f1`` (pooled weighted F1
    from the noisy confusion matrices); ε = ∞ is the plain (L-BFGS) FedAvg run;
  - ``imputation`` on AirQuality (4 heterogeneous sites, the split of
    ``benchmarks.impute``, seed 0, FedHF-Impute defaults but 10 rounds): noisy moments and
    co-observed statistics, DP-FedAvg GNN; metric ``rmse`` = observed-gap z-space RMSE
    at mask fraction 0.6 (scored by the benchmark on the held-out rows); ``rmse_prior_only``
    = the same with ``rounds=0`` (the linear factor prior from the DP correlations, no GNN
    updates released, so the whole budget goes to the statistics).

  Public bounds the DP statistics clip into: ``[-10, 10]`` for the demo table (a few of
  its values reach |x| ≈ 20 and are clipped) and ``[-5, 5]`` in the z-space the imputation
  benchmark works in. Chosen by hand, not computed from the data.

* ``secure_aggregation`` rows — plain vs secure run of the same job on the in-process
  engine: seconds (wall), bytes (all traffic, both directions), ``max_rel_diff`` = the
  largest ``max|secure - plain| / max|plain|`` over the learned arrays (model parameters;
  imputation also mean, std and correlations).

Run: ``python -m benchmarks.privacy`` (``--quick`` for a smoke run); writes
``benchmarks/results/privacy.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedtab.cli.demo import SIGNAL_FEATURES, DemoConfig
from fedtab.data.synthetic import classification_table, split_rows
from fedtab.engines.local import LocalFederation
from fedtab.federation import Site, run_election, run_training

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
DELTA = 1e-5
DEMO_BOUNDS = [-10.0, 10.0]
Z_BOUNDS = [-5.0, 5.0]
RESULTS = Path(__file__).parent / "results"


def _demo_federation(cfg: DemoConfig) -> tuple[LocalFederation, list[str]]:
    table = classification_table(cfg.n_samples, 100, 12, 8, 0, shuffle=False, seed=cfg.seed)
    parts = split_rows(table, cfg.fractions, stratify="target", seed=cfg.seed)
    sites = [Site(f"site-{i + 1}", p, "target", seed=cfg.seed, selector=sel)
             for i, (p, sel) in enumerate(zip(parts, cfg.selectors))]
    return LocalFederation(sites), [c for c in table.columns if c != "target"]


def _dp(eps: float, bounds: list[float]) -> dict[str, Any] | None:
    return None if math.isinf(eps) else {"epsilon": eps, "delta": DELTA, "bounds": bounds, "clip": 1.0}


def _row(task: str, dataset: str, eps: float, metric: str, value: float) -> dict[str, Any]:
    return {"task": task, "dataset": dataset, "epsilon": None if math.isinf(eps) else eps, "delta": DELTA,
            "metric": metric, "value": float(value)}


def dp_election_and_training(cfg: DemoConfig, epsilons, log) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    fed, features = _demo_federation(cfg)
    signal = set(features[:SIGNAL_FEATURES])
    plain_features = run_election(fed, 0.5).result.selected_names
    for eps in epsilons:
        t0 = time.perf_counter()
        fed, _ = _demo_federation(cfg)
        el = run_election(fed, 0.5, describe="train", dp=_dp(eps, DEMO_BOUNDS))
        kept = el.result.selected_names
        f1 = run_training(fed, rounds=cfg.rounds, local_epochs=cfg.local_epochs, seed=cfg.seed,
                          described=el.described).pooled["weighted_f1"] if kept else 0.0
        rows += [_row("election", "seed_demo", eps, "signal_kept", len(set(kept) & signal)),
                 _row("election", "seed_demo", eps, "f1", f1)]
        fed, _ = _demo_federation(cfg)
        tr = run_training(fed, plain_features, rounds=cfg.rounds, local_epochs=cfg.local_epochs, seed=cfg.seed,
                          dp=_dp(eps, DEMO_BOUNDS))
        rows.append(_row("training", "seed_demo", eps, "f1", tr.pooled["weighted_f1"]))
        spent = (f"election ε spent {el.privacy['total']:.3f} (z = {el.privacy['noise_multiplier']:.2f}), "
                 f"training ε spent {tr.privacy['total']:.3f} (z = {tr.privacy['noise_multiplier']:.2f}, "
                 f"per step { {k: round(v, 3) for k, v in tr.privacy['steps'].items()} })") if el.privacy else "no noise"
        notes.append(f"election/training ε = {eps}: {spent}")
        log(f"ε={eps}: election kept {len(kept)} ({len(set(kept) & signal)} signal), F1 {f1:.4f}; "
            f"DP training F1 {tr.pooled['weighted_f1']:.4f}  [{time.perf_counter() - t0:.1f}s]")
    return rows, notes


def _airquality(quick: bool):
    from benchmarks.impute import load, prepare

    data = load("tiny" if quick else "airquality")
    return prepare(data, 0)


#: FedAvg rounds of every AirQuality run here (FedHF-Impute's default is 20; halved to keep
#: the benchmark within 15 minutes on the shared box — the plain and the private runs alike).
IMPUTE_ROUNDS = 10


def _impute(train, columns, queries, quick: bool, **params):
    from fedtab.imputer import FederatedImputer

    settings = {"rounds": 2 if quick else IMPUTE_ROUNDS, **params}
    imp = FederatedImputer(seed=0, **settings).fit(list(train))
    pos = {c: i for i, c in enumerate(imp.columns_)}
    order = [pos[c] for c in columns]
    preds = [imp.predict_z(q)[0][:, order] * imp.std_[order] + imp.mean_[order] for q in queries]
    return imp, preds


def dp_imputation(epsilons, quick: bool, log) -> tuple[list[dict], list[str]]:
    from benchmarks.impute import score

    train, tests, queries, cols, split = _airquality(quick)
    rows, notes = [], []
    dataset = "tiny" if quick else "airquality"
    for eps in epsilons:
        for metric, extra in (("rmse", {}), ("rmse_prior_only", {"rounds": 0})):
            t0 = time.perf_counter()
            imp, preds = _impute(train, cols, queries[0.6], quick, dp=_dp(eps, Z_BOUNDS), **extra)
            rmse, _ = score(preds, tests, queries[0.6], split, cols)
            rows.append(_row("imputation", dataset, eps, metric, rmse))
            p = imp.result_.privacy
            notes.append(f"imputation ({metric}) ε = {eps}: " + (
                f"ε spent {p['total']:.3f} (z = {p['noise_multiplier']:.2f}, per step "
                f"{ {k: round(v, 3) for k, v in p['steps'].items()} })" if p else "no noise"))
            log(f"ε={eps}: imputation {metric} {rmse:.4f}  [{time.perf_counter() - t0:.1f}s]")
    return rows, notes


def _rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    out = 0.0
    for k in a:
        x, y = np.asarray(a[k], np.float64), np.asarray(b[k], np.float64)
        ok = np.isfinite(x) & np.isfinite(y)
        scale = np.max(np.abs(x[ok])) if ok.any() else 0.0
        if scale > 0:
            out = max(out, float(np.max(np.abs(x[ok] - y[ok])) / scale))
    return out


def secure_demo(cfg: DemoConfig, log) -> dict[str, Any]:
    runs = {}
    for secure in (False, True):
        fed, _ = _demo_federation(cfg)
        t0 = time.perf_counter()
        el = run_election(fed, 0.5, describe="train", secure_aggregation=secure)
        tr = run_training(fed, rounds=cfg.rounds, local_epochs=cfg.local_epochs, seed=cfg.seed,
                          described=el.described, secure_aggregation=secure)
        seconds = time.perf_counter() - t0
        runs[secure] = (seconds, sum(fed.traffic.total()), tr)
        log(f"seed demo election+training secure={secure}: {seconds:.2f}s, {runs[secure][1]} bytes, "
            f"F1 {tr.pooled['weighted_f1']:.4f}")
    (sp, bp, p), (ss, bs, s) = runs[False], runs[True]
    diff = _rel({**p.params, "mean": p.mean, "std": p.std}, {**s.params, "mean": s.mean, "std": s.std})
    return {"task": "election+training", "dataset": "seed_demo", "seconds_plain": sp, "seconds_secure": ss,
            "bytes_plain": int(bp), "bytes_secure": int(bs), "max_rel_diff": diff}


def secure_imputation(quick: bool, log) -> dict[str, Any]:
    train, tests, queries, cols, split = _airquality(quick)
    runs = {}
    for secure in (False, True):
        t0 = time.perf_counter()
        imp, _ = _impute(train, cols, queries[0.6], quick, secure_aggregation=secure)
        seconds = time.perf_counter() - t0
        r = imp.result_
        runs[secure] = (seconds, int(sum(r.bytes)), r)
        log(f"imputation secure={secure}: {seconds:.2f}s, {runs[secure][1]} bytes")
    (sp, bp, p), (ss, bs, s) = runs[False], runs[True]
    learned = lambda r: {**r.weights, "mean": r.mean, "std": r.std, "corr": r.pooled.corr}  # noqa: E731
    return {"task": "imputation", "dataset": "tiny" if quick else "airquality", "seconds_plain": sp,
            "seconds_secure": ss, "bytes_plain": bp, "bytes_secure": bs, "max_rel_diff": _rel(learned(p), learned(s))}


def summarise(result: dict[str, Any], notes: list[str], command: str, seconds: float) -> str:
    lines = ["# Privacy benchmark", "", f"Command: `{command}` ({seconds / 60:.1f} min on the shared 2-core box).", "",
             "## Differential privacy: utility against ε (δ = 1e-5, one run per ε)", "",
             "| task | dataset | metric | " + " | ".join("∞" if math.isinf(e) else f"ε={e:g}" for e in EPSILONS) + " |",
             "|---|---|---|" + "---|" * len(EPSILONS)]
    keys = sorted({(r["task"], r["dataset"], r["metric"]) for r in result["dp"]})
    for task, ds, metric in keys:
        vals = {r["epsilon"]: r["value"] for r in result["dp"]
                if (r["task"], r["dataset"], r["metric"]) == (task, ds, metric)}
        cells = [f"{vals[None if math.isinf(e) else e]:.4f}" if (None if math.isinf(e) else e) in vals else ""
                 for e in EPSILONS]
        lines.append(f"| {task} | {ds} | {metric} | " + " | ".join(cells) + " |")
    lines += ["", "Privacy spent (dp-accounting RDP accountant):", ""] + [f"- {n}" for n in notes]
    lines += ["", "## Secure aggregation: plain vs secure on the in-process engine", "",
              "| task | dataset | seconds plain | seconds secure | ratio | bytes plain | bytes secure | max rel diff |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["secure_aggregation"]:
        lines.append(f"| {r['task']} | {r['dataset']} | {r['seconds_plain']:.2f} | {r['seconds_secure']:.2f} | "
                     f"{r['seconds_secure'] / r['seconds_plain']:.2f}× | {r['bytes_plain']} | {r['bytes_secure']} | "
                     f"{r['max_rel_diff']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: small demo, tiny imputation, 2 ε values")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cfg = DemoConfig(n_samples=600, rounds=2, local_epochs=1) if args.quick else DemoConfig()
    epsilons = (8.0, math.inf) if args.quick else EPSILONS
    dp_rows, notes = dp_election_and_training(cfg, epsilons, print)
    rows, more = dp_imputation(epsilons, args.quick, print)
    result = {"dp": dp_rows + rows, "secure_aggregation": [secure_demo(cfg, print), secure_imputation(args.quick, print)]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "privacy.json").write_text(json.dumps(result, indent=2) + "\n")
    command = "python -m benchmarks.privacy" + (" --quick" if args.quick else "")
    (args.out / "privacy.md").write_text(summarise(result, notes + more, command, time.perf_counter() - t0))
    print((args.out / "privacy.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
