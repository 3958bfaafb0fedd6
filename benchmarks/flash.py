"""FLASH protocol reproduction: Feature Election on Mushroom, Adult, Heart, Breast Cancer.

Protocol (as the FLASH paper describes it): 3 sites with 50/30/20 % of the rows
(stratified); each site holds out 20 % of its rows as its test split (stratified).
Categorical columns are one-hot encoded with a category list agreed across sites
(each site sends only the set of categories it observes; the server takes the sorted
union; see ``fedtab.federation.steps.encoding``). For every dataset × selector the
sites vote once (on their *fit* rows: 75 % of training rows; the other 25 % are
validation rows), and for every model the freedom degree is tuned by the default
grid search (grid 0, 0.1, …, 1, refined by ±0.025 around the best, parsimony
tolerance 0.01) on the sample-weighted validation F1. The final model is trained by
FedAvg (GaussianNB: exact aggregation) on all training rows with the tuned mask and
scored on the test rows. ``f1_all`` is the same model on all features.

Metric: weighted F1 pooled over the three sites' test rows (macro F1 in the details).
Selectors: ``lasso`` = L1-logistic with its strength chosen by 3-fold CV on each site
(``lasso_cv``; the FLASH code tunes it), ``markov_blanket`` (PyImpetus-style),
``sequential_attention``. Models: ``gnb``, ``sgd`` (10 rounds × 1 epoch), ``mlp``
(one hidden layer of 64, 10 rounds × 1 epoch). One run, seed 0 (``--seeds`` for more).

Run: ``python -m benchmarks.flash`` (``--quick``: two small datasets, coarse grid, for
tests); writes ``flash.json`` (rows ``{model, dataset, selector, f1_all, f1_fe,
freedom_degree, param_reduction}``), ``flash_details.json``, ``flash.md``, ``flash.png``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedtab import LocalFederation, Site
from fedtab.data.election_datasets import load_dataset
from fedtab.data.synthetic import split_rows
from fedtab.federation import federated_one_hot, run_training, tune_flow
from fedtab.federation.workflows.tuning.server import gather_fit_ballots  # the sites draw their own fit/validation parts
from fedtab.learn.accounting import param_reduction, round_cost

RESULTS = Path(__file__).resolve().parent / "results"

DATASETS = ["mushroom", "adult", "heart", "breast_cancer"]
SELECTORS = {"lasso": {"name": "lasso_cv"}, "markov_blanket": {"name": "markov_blanket"},
             "sequential_attention": {"name": "sequential_attention"}}
MODELS = {"gnb": ({"name": "gnb"}, 1, 1), "sgd": ({"name": "sgd"}, 10, 1),
          "mlp": ({"name": "mlp", "params": {"hidden": [64]}}, 10, 1)}

#: the FLASH paper's figures quoted in the issue (F1 without → with Feature Election).
PAPER = [
    {"model": "mlp", "dataset": "breast_cancer", "selector": "PyImpetus", "ours": "markov_blanket", "f1_all": 0.41, "f1_fe": 0.94},
    {"model": "sgd", "dataset": "adult", "selector": "PyImpetus", "ours": "markov_blanket", "f1_all": 0.02, "f1_fe": 0.35},
    {"model": "gnb", "dataset": "mushroom", "selector": "PyImpetus", "ours": "markov_blanket", "f1_all": 0.81, "f1_fe": 0.88},
    {"model": "gnb", "dataset": "breast_cancer", "selector": "Lasso", "ours": "lasso", "f1_all": 0.93, "f1_fe": 0.85},
]
PAPER_REDUCTION = {"mean": 0.49, "max": 0.888}


def build_federation(name: str, seed: int, max_rows: int | None = None) -> tuple[LocalFederation, dict[str, Any]]:
    """Load ``name``, split 50/30/20 stratified into 3 sites (80/20 train/test each), one-hot federatedly."""
    ds = load_dataset(name)
    table = ds.table
    if max_rows is not None and len(table) > max_rows:
        table = split_rows(table, [max_rows / len(table), 1 - max_rows / len(table)], stratify=ds.target,
                           seed=seed)[0]
    parts = split_rows(table, [0.5, 0.3, 0.2], stratify=ds.target, seed=seed)
    sites = [Site(f"site{i + 1}", p, ds.target, test_size=0.2, seed=seed + i) for i, p in enumerate(parts)]
    fed = LocalFederation(sites)
    cats = federated_one_hot(fed, ds.categorical) if ds.categorical else {}
    info = {"rows": int(len(table)), "raw_features": int(table.shape[1] - 1),
            "features": len(sites[0].feature_names), "categorical": len(cats),
            "classes": int(table[ds.target].nunique())}
    return fed, info


def run(quick: bool, seeds: list[int], out: Path) -> list[dict[str, Any]]:
    datasets = ["breast_cancer", "mushroom"] if quick else DATASETS
    models = dict(MODELS)
    selectors = dict(SELECTORS)
    tune_opts: dict[str, Any] = {}
    if quick:
        models = {k: (spec, min(r, 2), e) for k, (spec, r, e) in MODELS.items()}
        selectors["sequential_attention"] = {"name": "sequential_attention", "params": {"steps_per_phase": 20,
                                                                                         "n_phases": 3}}
        selectors["markov_blanket"] = {"name": "markov_blanket", "params": {"n_splits": 3}}
        tune_opts = {"grid": (0.0, 0.5, 1.0), "refine_step": 0.0}
    details: list[dict[str, Any]] = []
    for seed in seeds:
        for dname in datasets:
            fed, info = build_federation(dname, seed, 300 if quick else None)
            print(f"[{dname}] seed {seed}: {info}", flush=True)
            baselines: dict[str, Any] = {}
            for mname, (mspec, rounds, epochs) in models.items():
                t0 = time.time()
                full = run_training(fed, None, model=mspec, rounds=rounds, local_epochs=epochs, seed=seed)
                baselines[mname] = (full, time.time() - t0)
            for sname, sspec in selectors.items():
                t0, c0 = time.time(), time.process_time()
                ballots = gather_fit_ballots(fed, sspec)
                select_s, select_cpu = time.time() - t0, time.process_time() - c0
                for mname, (mspec, rounds, epochs) in models.items():
                    t1 = time.time()
                    tuned = tune_flow(fed, selector=sspec, model=mspec, rounds=rounds, local_epochs=epochs,
                                      ballots=ballots, seed=seed, **tune_opts)
                    tune_s = time.time() - t1
                    final = run_training(fed, tuned.features, model=mspec, rounds=rounds, local_epochs=epochs,
                                         seed=seed)
                    full, _ = baselines[mname]
                    d_all, d_sel, n_cls = len(full.features), len(final.features), len(full.classes)
                    cost_all = round_cost(mspec, d_all, n_cls)
                    cost_fe = round_cost(mspec, d_sel, n_cls)
                    row = {
                        "model": mname, "dataset": dname, "selector": sname, "seed": seed,
                        "f1_all": full.pooled["weighted_f1"], "f1_fe": final.pooled["weighted_f1"],
                        "macro_f1_all": full.pooled["macro_f1"], "macro_f1_fe": final.pooled["macro_f1"],
                        "freedom_degree": tuned.tuning.freedom_degree,
                        "validation_f1": tuned.tuning.score,
                        "features_all": d_all, "features_fe": d_sel,
                        "union": tuned.election.stats["union"], "intersection": tuned.election.stats["intersection"],
                        "params_all": full.n_params, "params_fe": final.n_params,
                        "param_reduction": param_reduction(mspec, d_all, d_sel, n_cls),
                        "bytes_per_round_all": cost_all["bytes_down"] + cost_all["bytes_up"],
                        "bytes_per_round_fe": cost_fe["bytes_down"] + cost_fe["bytes_up"],
                        "measured_bytes_per_round_fe": (final.bytes_down + final.bytes_up) / max(final.rounds, 1),
                        "measured_bytes_per_round_all": (full.bytes_down + full.bytes_up) / max(full.rounds, 1),
                        "rounds": final.rounds, "tuning_evaluations": tuned.tuning.evaluations,
                        "selector_seconds": select_s,
                        "selector_seconds_per_feature": select_s / (len(fed.sites) * d_all),
                        "selector_cpu_seconds_per_feature": select_cpu / (len(fed.sites) * d_all),
                        "tune_seconds": tune_s, "curve": tuned.tuning.curve(),
                    }
                    details.append(row)
                    print(f"  {mname:4s} {sname:21s} f1 {row['f1_all']:.3f} -> {row['f1_fe']:.3f}  fd "
                          f"{row['freedom_degree']:.3f}  kept {d_sel}/{d_all}  red {row['param_reduction']:.2f} "
                          f"({tune_s:.0f}s tune, {select_s:.1f}s select)", flush=True)
    return details


def aggregate(details: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of ``flash.json``: mean over seeds per (model, dataset, selector)."""
    keys: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in details:
        keys.setdefault((r["model"], r["dataset"], r["selector"]), []).append(r)
    rows = []
    for (m, d, s), rs in keys.items():
        rows.append({"model": m, "dataset": d, "selector": s,
                     "f1_all": float(np.mean([r["f1_all"] for r in rs])),
                     "f1_fe": float(np.mean([r["f1_fe"] for r in rs])),
                     "freedom_degree": float(np.mean([r["freedom_degree"] for r in rs])),
                     "param_reduction": float(np.mean([r["param_reduction"] for r in rs]))})
    return rows


def markdown(rows: list[dict[str, Any]], details: list[dict[str, Any]], seeds: list[int], quick: bool,
             seconds: float) -> str:
    by = {(r["model"], r["dataset"], r["selector"]): r for r in rows}
    det: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in details:
        det.setdefault((r["model"], r["dataset"], r["selector"]), []).append(r)
    cmd = "python -m benchmarks.flash" + (" --quick" if quick else "")
    lines = [f"# FLASH protocol reproduction{' (quick mode)' if quick else ''}", "",
             f"Command: `{cmd}` (seeds {seeds}; {seconds / 60:.1f} min on this machine). "
             "Metric: weighted F1 on the pooled test rows of the 3 sites. fd tuned by grid search on "
             "validation rows (never the test rows). Bytes per round = payload per site and round, down + up "
             "(GaussianNB: statistics up only, one round).", "",
             "| model | dataset | selector | F1 all | F1 FE | fd | kept / all | param. reduction | bytes/round all → FE |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for key, r in by.items():
        d = det[key]
        kept = np.mean([x["features_fe"] for x in d])
        lines.append(f"| {r['model']} | {r['dataset']} | {r['selector']} | {r['f1_all']:.3f} | {r['f1_fe']:.3f} | "
                     f"{r['freedom_degree']:.3f} | {kept:.0f} / {d[0]['features_all']} | {100 * r['param_reduction']:.1f} % | "
                     f"{np.mean([x['bytes_per_round_all'] for x in d]):,.0f} → {np.mean([x['bytes_per_round_fe'] for x in d]):,.0f} |")
    red = [r["param_reduction"] for r in rows]
    lines += ["", f"Parameter reduction: mean {100 * np.mean(red):.1f} %, max {100 * np.max(red):.1f} % "
              f"(paper: mean {100 * PAPER_REDUCTION['mean']:.0f} %, max {100 * PAPER_REDUCTION['max']:.1f} %).", "",
              "## Beside the paper's figures", "",
              "| model | dataset | paper selector → ours | paper F1 all → FE | ours F1 all → FE |", "|---|---|---|---|---|"]
    for p in PAPER:
        r = by.get((p["model"], p["dataset"], p["ours"]))
        ours = f"{r['f1_all']:.3f} → {r['f1_fe']:.3f}" if r else "not run"
        lines.append(f"| {p['model']} | {p['dataset']} | {p['selector']} → {p['ours']} | {p['f1_all']:.2f} → "
                     f"{p['f1_fe']:.2f} | {ours} |")
    sel_speed: dict[str, list[tuple[float, float]]] = {}
    for r in details:
        sel_speed.setdefault(r["selector"], []).append((r["selector_seconds_per_feature"],
                                                        r["selector_cpu_seconds_per_feature"]))
    lines += ["", "Selector time per site and feature, mean over datasets (wall / CPU; the machine was shared, "
              "so wall time includes waiting for a core): " + ", ".join(
                  f"{k} {np.mean([w for w, _ in v]):.4f} s / {np.mean([c for _, c in v]):.4f} s"
                  for k, v in sel_speed.items()) + " (PyImpetus: ~0.4 s per feature on 2 cores).", ""]
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    from fedtab.report.plots import plt, save_figure

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [f"{r['model']}/{r['dataset']}/{r['selector'][:6]}" for r in rows]
    x = np.arange(len(rows))
    axes[0].bar(x - 0.2, [r["f1_all"] for r in rows], 0.4, label="all features")
    axes[0].bar(x + 0.2, [r["f1_fe"] for r in rows], 0.4, label="Feature Election (fd tuned)")
    axes[0].set_ylabel("weighted F1 (test)")
    axes[0].set_ylim(0, 1.05)
    axes[1].bar(x, [100 * r["param_reduction"] for r in rows], color="C2")
    axes[1].set_ylabel("parameter reduction %")
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
    axes[0].legend(fontsize=8)
    fig.suptitle("FLASH protocol: F1 and parameter reduction")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small datasets and settings (used by the tests)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    details = run(args.quick, args.seeds, args.out)
    rows = aggregate(details)
    seconds = time.time() - t0
    (args.out / "flash.json").write_text(json.dumps(rows, indent=1))
    (args.out / "flash_details.json").write_text(json.dumps(details, indent=1))
    (args.out / "flash.md").write_text(markdown(rows, details, args.seeds, args.quick, seconds))
    plot(rows, args.out / "flash.png")
    print(f"wrote {args.out}/flash.json, flash_details.json, flash.md, flash.png in {seconds:.0f}s")


if __name__ == "__main__":
    main()
