"""Gradient-boosted trees on UCI Adult: fedtab's histogram GBDT against XGBoost.

``--pooled-only`` (phase 1): one process, the standard split
(``adult.data`` = 32,561 training rows, ``adult.test`` = 16,281 test rows), categorical
columns one-hot encoded with the categories of the training rows (a missing category is
all zeros, as fedtab's agreed encoding; missing numbers stay NaN). Rows:

* ``fedtab_pooled`` — :func:`fedtab.learn.gbdt.fit_gbdt_pooled` (bins from its site summary
  of the training rows: means of ≥ ``min_rows`` rows, ≤ ``max_bins`` bins);
* ``xgboost`` — ``xgboost.XGBClassifier(tree_method="hist")`` with the same parameters
  (its own quantile bins), ``n_jobs`` threads (default 1, like numpy's one core).

Both: ``n_trees`` rounds, ``max_depth``, ``learning_rate``, ``max_bins``, λ = 1, γ = 0,
``min_child_weight`` = 1, no subsampling. Metrics on the test rows: AUROC, log-loss; wall
time of the fit (not of loading or prediction). Ratios are fedtab / XGBoost.

Full mode (default): the training rows split into 3 unequal sites (50/30/20 %, stratified,
seed 0; every row of a site is a training row, min_rows = 10), in two cases:

* ``homogeneous`` — every site holds every column;
* ``heterogeneous`` — site 0 lacks ``capital-gain`` and ``hours-per-week``, site 1 lacks
  ``education`` (all its one-hot columns) and ``age``, site 2 lacks ``relationship`` and
  ``capital-loss``: those cells are structurally missing (no imputation: a missing value
  follows each split's learned default direction).

Rows per case, all scored on the same 16,281 ``adult.test`` rows (complete columns):

* ``fed_gbdt`` / ``fed_gbdt_secure`` — :func:`fedtab.federation.workflows.gbdt.run_gbdt` on the local
  engine (wire format on), plain and secure sums; exchanges, array payload bytes (down + up,
  all sites), wall time; whether the secure trees equal the plain ones array for array;
* ``xgb_pooled`` — centralised XGBoost on the pooled training rows with the same parameters
  (heterogeneous case: the same pooled rows, NaN where a site lacks a column; also
  ``xgb_pooled_complete`` on complete rows);
* ``fed_logistic`` — fedtab's federated logistic regression (FedAvg, ``--lr-rounds`` rounds of
  ``--lr-epochs`` L-BFGS epochs; missing cells at the federation's mean);
* ``local_xgb:<site>`` — XGBoost on one site's rows only.

NVIDIA FLARE's histogram-based XGBoost row needs XGBoost's federated plugin: the
``xgboost-cpu`` wheel installed here is not compiled with it (``FederatedTracker`` raises
"XGBoost is not compiled with federated learning support"), so that row is reported as not run.

Run: ``python -m benchmarks.gbdt`` (``--quick``: 10 rounds of depth 4; ``--pooled-only``: phase 1's rows).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedtab.data.categories import category_sets, one_hot
from fedtab.data.election_datasets import load_adult
from fedtab.learn.gbdt import GBDTParams, fit_gbdt_pooled

ADULT_TRAIN_ROWS = 32561


def adult_matrices(root: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """``X_train, y_train, X_test, y_test, feature names`` of Adult, one-hot encoded."""
    ds = load_adult(root)
    frame = ds.table.drop(columns=[ds.target])
    cats = category_sets(frame.iloc[:ADULT_TRAIN_ROWS], ds.categorical)
    test = frame.iloc[ADULT_TRAIN_ROWS:]
    for c, known in cats.items():  # a test category never seen in training is treated as missing
        test = test.assign(**{c: test[c].where(test[c].astype(str).isin(known) | test[c].isna())})
    enc_train = one_hot(frame.iloc[:ADULT_TRAIN_ROWS], cats)
    enc_test = one_hot(test, cats)
    y = ds.table[ds.target].to_numpy()
    return (enc_train.to_numpy(np.float64), y[:ADULT_TRAIN_ROWS], enc_test.to_numpy(np.float64),
            y[ADULT_TRAIN_ROWS:], list(enc_train.columns))


def _scores(y: np.ndarray, p1: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import log_loss, roc_auc_score

    return {"auroc": float(roc_auc_score(y, p1)), "log_loss": float(log_loss(y, np.clip(p1, 1e-15, 1 - 1e-15)))}


def pooled_rows(params: GBDTParams, xgb_threads: int = 1, root: str | None = None) -> list[dict[str, Any]]:
    """The ``fedtab_pooled`` and ``xgboost`` rows (see the module docstring)."""
    import xgboost

    X, y, Xt, yt, names = adult_matrices(root)
    log: list[dict[str, int]] = []
    t0 = time.perf_counter()
    model = fit_gbdt_pooled(X, y, params, feature_names=names, log=log)
    fedtab_s = time.perf_counter() - t0
    per_tree = sum(e["bytes_per_site"] for e in log) / model.n_trees
    rows = [{"row": "fedtab_pooled", **_scores(yt, model.predict_proba(Xt)[:, 1]), "seconds": fedtab_s,
             "trees": model.n_trees, "nodes": int(model.tree_ptr[-1]), "slots": model.layout.n_slots,
             "level_exchanges_per_tree": len(log) / model.n_trees, "histogram_bytes_per_site_per_tree": per_tree,
             "max_level_bytes_per_site": max(e["bytes_per_site"] for e in log)}]
    clf = xgboost.XGBClassifier(tree_method="hist", n_estimators=params.n_trees, max_depth=params.max_depth,
                                learning_rate=params.learning_rate, max_bin=params.max_bins,
                                reg_lambda=params.reg_lambda, gamma=params.gamma,
                                min_child_weight=params.min_child_weight, subsample=params.subsample,
                                n_jobs=xgb_threads)
    t0 = time.perf_counter()
    clf.fit(X, y)
    xgb_s = time.perf_counter() - t0
    nodes = int(len(clf.get_booster().trees_to_dataframe()))
    rows.append({"row": "xgboost", **_scores(yt, clf.predict_proba(Xt)[:, 1]), "seconds": xgb_s,
                 "trees": params.n_trees, "nodes": nodes, "threads": xgb_threads})
    return rows


#: the heterogeneous case: original columns each site lacks
MISSING_COLUMNS = {0: ("capital-gain", "hours-per-week"), 1: ("education", "age"), 2: ("relationship", "capital-loss")}
SITE_FRACTIONS = (0.5, 0.3, 0.2)


def _xgb(params: GBDTParams, threads: int):
    import xgboost

    return xgboost.XGBClassifier(tree_method="hist", n_estimators=params.n_trees, max_depth=params.max_depth,
                                 learning_rate=params.learning_rate, max_bin=params.max_bins,
                                 reg_lambda=params.reg_lambda, gamma=params.gamma,
                                 min_child_weight=params.min_child_weight, subsample=params.subsample, n_jobs=threads)


def site_tables(X: np.ndarray, y: np.ndarray, names: list[str], heterogeneous: bool):
    """The 3 sites' training tables (encoded columns + ``income``), 50/30/20 % stratified, seed 0."""
    import pandas as pd

    from fedtab.data import split_rows

    table = pd.DataFrame(X, columns=names).assign(income=y)
    parts = split_rows(table, list(SITE_FRACTIONS), stratify="income", seed=0)
    if heterogeneous:
        parts = [p.drop(columns=[c for c in names if c in MISSING_COLUMNS[i]
                                 or any(c.startswith(f"{m}=") for m in MISSING_COLUMNS[i])])
                 for i, p in enumerate(parts)]
    return [p.reset_index(drop=True) for p in parts]


def _federation(parts, secure: bool = False):
    from fedtab.engines.local import LocalFederation
    from fedtab.federation.protocol import set_options
    from fedtab.federation.site.core import Site

    # a plain run's sites opt in to plain answers over the server's tree nodes; a secure run's keep the default
    policy = {"allow_server_row_sets": not secure}
    fed = LocalFederation([Site(f"site{i}", p, "income", test_size=0.0, seed=i, policy=policy)
                           for i, p in enumerate(parts)])
    if secure:
        set_options(fed, secure_aggregation=True)
    return fed


def _pooled_with_nan(parts, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    X = np.vstack([np.column_stack([p[c].to_numpy(np.float64) if c in p else np.full(len(p), np.nan) for c in names])
                   for p in parts])
    return X, np.concatenate([p["income"].to_numpy() for p in parts])


def federated_rows(params: GBDTParams, case: str, *, xgb_threads: int = 1, lr_rounds: int = 10, lr_epochs: int = 5,
                   root: str | None = None, compute_only: bool = False, packed_levels: bool = False
                   ) -> list[dict[str, Any]]:
    """The rows of one case (``homogeneous`` / ``heterogeneous``), see the module docstring.

    Every timed row also carries ``cpu_seconds`` (this process's CPU time, :func:`time.process_time`:
    the server and the in-process sites together for the federated rows, all of XGBoost's
    threads for XGBoost's). ``compute_only``: only ``fed_gbdt`` (plain) and ``xgb_pooled``.
    ``packed_levels``: the plain run's level histograms travel packed (``run_gbdt(packed_levels=True)``)."""
    from fedtab.federation.workflows.gbdt import run_gbdt
    from fedtab.federation.workflows.training import run_training
    from fedtab.learn.models import LogisticRegressionModel

    X, y, Xt, yt, names = adult_matrices(root)
    parts = site_tables(X, y, names, case == "heterogeneous")
    rows: list[dict[str, Any]] = []
    trees = {}
    for secure in (False,) if compute_only else (False, True):
        fed = _federation(parts, secure)
        t0, c0 = time.perf_counter(), time.process_time()
        # importance=False: the per-site gains exchange runs in plain mode only; timing both modes on the same work
        out = run_gbdt(fed, names, params=params, eval_part="train", score_bins=None, importance=False,
                       packed_levels=packed_levels)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        lv = out.level_exchanges
        trees[secure] = out.model.to_arrays()
        rows.append({"case": case, "row": "fed_gbdt_secure" if secure else "fed_gbdt",
                     **_scores(yt, out.model.predict_proba(Xt)[:, 1]), "seconds": seconds, "cpu_seconds": cpu,
                     "exchanges": len(out.exchanges), "level_exchanges": len(lv),
                     "exchanges_per_tree": out.exchanges_per_tree,
                     "bytes": int(sum(e["bytes_down"] + e["bytes_up"] for e in out.exchanges)),
                     "mean_level_bytes": float(np.mean([e["bytes_down"] + e["bytes_up"] for e in lv])),
                     "max_level_bytes": int(max(e["bytes_down"] + e["bytes_up"] for e in lv)),
                     "wire_bytes": int(sum(e["wire_down"] + e["wire_up"] for e in out.exchanges)),
                     "mean_level_wire_bytes": float(np.mean([e["wire_down"] + e["wire_up"] for e in lv])),
                     "withheld_nodes": int(sum(out.withheld.values())), "slots": out.model.layout.n_slots,
                     "trees": out.model.n_trees})
    if not compute_only:
        rows[-1]["same_trees_as_plain"] = all(np.array_equal(trees[False][k], trees[True][k]) for k in trees[False])
        rows[-1]["time_vs_plain"] = rows[-1]["seconds"] / rows[-2]["seconds"]
    Xp, yp = _pooled_with_nan(parts, names)
    pooled = [("xgb_pooled", Xp)] + ([("xgb_pooled_complete", X)] if case == "heterogeneous" and not compute_only else [])
    for row, Xtrain in pooled:
        clf = _xgb(params, xgb_threads)
        t0, c0 = time.perf_counter(), time.process_time()
        clf.fit(Xtrain, yp if Xtrain is Xp else y)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows.append({"case": case, "row": row, **_scores(yt, clf.predict_proba(Xt)[:, 1]),
                     "seconds": seconds, "cpu_seconds": cpu})
    fed_row = next(r for r in rows if r["row"] == "fed_gbdt")
    fed_row["cpu_vs_xgb_pooled"] = fed_row["cpu_seconds"] / rows[-len(pooled)]["cpu_seconds"]
    if compute_only:
        return rows
    fed = _federation(parts)
    t0 = time.perf_counter()
    tr = run_training(fed, names, model="logistic", rounds=lr_rounds, local_epochs=lr_epochs, eval_part="train",
                      score_bins=None)
    seconds = time.perf_counter() - t0
    Z = (Xt - tr.mean) / tr.std
    Z[np.isnan(Z)] = 0.0
    rows.append({"case": case, "row": "fed_logistic", **_scores(yt, LogisticRegressionModel().predict_proba(tr.params, Z)[:, 1]),
                 "seconds": seconds, "exchanges": len(tr.participation), "bytes": int(tr.bytes_down + tr.bytes_up)})
    for i, p in enumerate(parts):
        Xs = np.column_stack([p[c].to_numpy(np.float64) if c in p else np.full(len(p), np.nan) for c in names])
        clf = _xgb(params, xgb_threads)
        t0 = time.perf_counter()
        clf.fit(Xs, p["income"].to_numpy())
        rows.append({"case": case, "row": f"local_xgb:site{i}", **_scores(yt, clf.predict_proba(Xt)[:, 1]),
                     "seconds": time.perf_counter() - t0, "rows": len(p)})
    return rows


NVFLARE_ROW = {"row": "nvflare_xgboost", "run": False,
               "why": "the installed xgboost-cpu wheel is not compiled with XGBoost's federated plugin "
                      "(xgboost.federated.FederatedTracker: 'XGBoost is not compiled with federated learning "
                      "support'), which NVIDIA FLARE's histogram-based XGBoost needs"}


def _federated_report(rows: list[dict[str, Any]], params: GBDTParams) -> dict[str, Any]:
    by = {(r["case"], r["row"]): r for r in rows}
    checks = {}
    for case in ("homogeneous", "heterogeneous"):
        if (case, "fed_gbdt") not in by:
            continue
        if (case, "fed_gbdt_secure") not in by:  # --compute-only
            checks[case] = {"cpu_vs_xgb": by[(case, "fed_gbdt")]["cpu_vs_xgb_pooled"]}
            continue
        f, x, s, lr = (by[(case, k)] for k in ("fed_gbdt", "xgb_pooled", "fed_gbdt_secure", "fed_logistic"))
        checks[case] = {"auroc_vs_xgb": f["auroc"] - x["auroc"], "auroc_vs_logistic": f["auroc"] - lr["auroc"],
                        "secure_same_trees": s["same_trees_as_plain"], "secure_time_ratio": s["time_vs_plain"],
                        "cpu_vs_xgb": f["cpu_vs_xgb_pooled"]}
    return checks


def _print_federated(rows: list[dict[str, Any]], checks: dict[str, Any]) -> None:
    print(f"{'case':<14} {'row':<22} {'AUROC':>7} {'log-loss':>9} {'seconds':>8} {'CPU s':>6} {'exch':>5} {'MB':>8}")
    for r in rows:
        mb = f"{r['bytes'] / 1e6:8.2f}" if "bytes" in r else f"{'':>8}"
        ex = f"{r['exchanges']:5d}" if "exchanges" in r else f"{'':>5}"
        cpu = f"{r['cpu_seconds']:6.2f}" if "cpu_seconds" in r else f"{'':>6}"
        print(f"{r['case']:<14} {r['row']:<22} {r['auroc']:7.4f} {r['log_loss']:9.4f} {r['seconds']:8.2f} {cpu} {ex} {mb}")
    for r in rows:
        if "mean_level_bytes" in r:
            print(f"{r['case']}: {r['row']}: a level exchange moves {r['mean_level_bytes'] / 1e3:.1f} kB of arrays on "
                  f"average ({r['mean_level_wire_bytes'] / 1e3:.1f} kB on the wire, all sites, down + up), "
                  f"{r['level_exchanges']} level exchanges")
    for case, c in checks.items():
        print(f"{case}: CPU of fed GBDT (server + sites, in-process) / XGBoost hist on the same pooled rows "
              f"{c['cpu_vs_xgb']:.2f}x (load average {os.getloadavg()[0]:.2f})")
        if "secure_same_trees" not in c:
            continue
        print(f"{case}: fed GBDT - centralised XGBoost AUROC {c['auroc_vs_xgb']:+.4f}; - federated logistic "
              f"{c['auroc_vs_logistic']:+.4f}; secure: same trees {c['secure_same_trees']}, time "
              f"{c['secure_time_ratio']:.2f}x plain")
    if any("secure_same_trees" in c for c in checks.values()):
        print(f"nvflare_xgboost: not run: {NVFLARE_ROW['why']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pooled-only", action="store_true", help="only the one-process rows (phase 1)")
    ap.add_argument("--quick", action="store_true", help="10 rounds of depth 4 (a smoke run)")
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--max-depth", type=int, default=6)
    ap.add_argument("--learning-rate", type=float, default=0.1)
    ap.add_argument("--max-bins", type=int, default=256)
    ap.add_argument("--xgb-threads", type=int, default=1)
    ap.add_argument("--data", default=None, help="the election datasets folder (default: ../shared/datasets/election)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--cases", default="homogeneous,heterogeneous", help="federated cases to run")
    ap.add_argument("--lr-rounds", type=int, default=10, help="federated logistic: FedAvg rounds")
    ap.add_argument("--lr-epochs", type=int, default=5, help="federated logistic: local L-BFGS epochs per round")
    ap.add_argument("--markdown", default=None, help="write the federated table as markdown here")
    ap.add_argument("--packed-levels", action="store_true",
                    help="plain level histograms sent packed (non-zero slots in grid units; the same trees)")
    ap.add_argument("--compute-only", action="store_true",
                    help="only the plain fed_gbdt and xgb_pooled rows: the CPU ratio, quickly")
    args = ap.parse_args(argv)
    trees, depth = (10, 4) if args.quick else (args.trees, args.max_depth)
    params = GBDTParams(n_trees=trees, max_depth=depth, learning_rate=args.learning_rate, max_bins=args.max_bins)
    if not args.pooled_only:
        fed_rows = [r for case in args.cases.split(",") for r in
                    federated_rows(params, case, xgb_threads=args.xgb_threads, lr_rounds=args.lr_rounds,
                                   lr_epochs=args.lr_epochs, root=args.data, compute_only=args.compute_only,
                                   packed_levels=args.packed_levels)]
        checks = _federated_report(fed_rows, params)
        print(f"Adult, 3 sites {SITE_FRACTIONS}, {trees} rounds, depth {depth}, eta {args.learning_rate}, "
              f"{args.max_bins} bins")
        _print_federated(fed_rows, checks)
        out = {"params": params.to_dict(), "rows": fed_rows, "checks": checks, "nvflare": NVFLARE_ROW,
               "command": "python -m benchmarks.gbdt " + " ".join(argv if argv is not None else __import__("sys").argv[1:])}
        if args.out:
            Path(args.out).write_text(json.dumps(out, indent=1))
        if args.markdown and not args.compute_only:
            Path(args.markdown).write_text(markdown(out))
        return out
    rows = pooled_rows(params, args.xgb_threads, args.data)
    ours, ref = rows
    ratio = {"auroc_diff": ours["auroc"] - ref["auroc"], "log_loss_ratio": ours["log_loss"] / ref["log_loss"],
             "seconds_ratio": ours["seconds"] / ref["seconds"]}
    print(f"Adult, {trees} rounds, depth {depth}, eta {args.learning_rate}, {args.max_bins} bins")
    print(f"{'row':<15} {'AUROC':>7} {'log-loss':>9} {'seconds':>8} {'nodes':>6}")
    for r in rows:
        print(f"{r['row']:<15} {r['auroc']:7.4f} {r['log_loss']:9.4f} {r['seconds']:8.2f} {r['nodes']:6d}")
    f = rows[0]
    print(f"fedtab histograms: {f['slots']} slots (features x bins + missing), {f['level_exchanges_per_tree']:.1f} "
          f"level exchanges per tree, {f['histogram_bytes_per_site_per_tree'] / 1e3:.0f} kB per site per tree "
          f"(float64; largest level {f['max_level_bytes_per_site'] / 1e3:.0f} kB)")
    print(f"fedtab - xgboost AUROC {ratio['auroc_diff']:+.4f}; log-loss ratio {ratio['log_loss_ratio']:.3f}; "
          f"time ratio {ratio['seconds_ratio']:.1f}x (xgboost on {args.xgb_threads} thread(s))")
    out = {"params": params.to_dict(), "rows": rows, "ratio": ratio}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


def markdown(out: dict[str, Any]) -> str:
    """The federated results as a markdown page (``benchmarks/results/gbdt.md``)."""
    p = out["params"]
    lines = ["# Federated GBDT on UCI Adult", "",
             f"Regenerate: `{out['command']}`", "",
             f"3 sites (50/30/20 % of the 32,561 training rows, stratified), scored on the 16,281 `adult.test` rows. "
             f"{p['n_trees']} rounds, depth {p['max_depth']}, eta {p['learning_rate']}, {p['max_bins']} bins, "
             f"lambda {p['reg_lambda']}, no subsampling; site floor min_rows = 10 (small nodes withheld, small bins "
             "merged). Local engine, wire format on, one process on a shared 2-core machine.", "",
             "| case | row | AUROC | log-loss | seconds | exchanges | MB moved |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in out["rows"]:
        mb = f"{r['bytes'] / 1e6:.2f}" if "bytes" in r else ""
        lines.append(f"| {r['case']} | {r['row']} | {r['auroc']:.4f} | {r['log_loss']:.4f} | {r['seconds']:.1f} | "
                     f"{r.get('exchanges', '')} | {mb} |")
    lines += ["", "| case | fed - centralised XGB AUROC | fed - fed logistic AUROC | secure: same trees | secure time / plain "
              "| CPU fed GBDT / XGBoost hist |", "|---|---:|---:|---|---:|---:|"]
    for case, c in out["checks"].items():
        lines.append(f"| {case} | {c['auroc_vs_xgb']:+.4f} | {c['auroc_vs_logistic']:+.4f} | {c['secure_same_trees']} | "
                     f"{c['secure_time_ratio']:.2f}x | {c['cpu_vs_xgb']:.2f}x |")
    fed = [r for r in out["rows"] if r["row"] == "fed_gbdt"]
    if fed:
        f = fed[0]
        lines += ["", f"Exchanges per tree: {f['exchanges_per_tree']:.2f} (depth {p['max_depth']}; the run's last "
                      f"leaves ride one closing exchange); mean bytes per level exchange (all sites, down + up) "
                      f"{f['mean_level_bytes'] / 1e3:.0f} kB, largest {f['max_level_bytes'] / 1e3:.0f} kB "
                      f"({f['slots']} histogram slots); measured on the local engine's wire format "
                      f"{f['mean_level_wire_bytes'] / 1e3:.0f} kB per level exchange, {f['wire_bytes'] / 1e6:.1f} MB "
                      f"in all (plain)."]
        sec = [r for r in out["rows"] if r["row"] == "fed_gbdt_secure"]
        if sec:
            lines += [f"Secure aggregation on the wire: {sec[0]['mean_level_wire_bytes'] / 1e3:.0f} kB per level "
                      f"exchange (masked sums and the unmasking round), {sec[0]['wire_bytes'] / 1e6:.1f} MB in all."]
    lines += ["", f"NVIDIA FLARE histogram-based XGBoost: not run — {out['nvflare']['why']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
