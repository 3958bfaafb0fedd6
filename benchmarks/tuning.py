"""Freedom-degree tuners side by side: the peers' hill-climb vs fedtab's grid + parsimony.

Data: the peers' example — ``make_classification`` with 3,000 rows, 100 features,
20 informative, 30 redundant, 10 repeated (``random_state`` = the seed), split into 3
equal stratified sites, each holding out 20 % as its test split. Every site votes with
Lasso (L1-logistic, C = 0.1) on its fit rows (75 % of its training rows); the score of
a mask is the sample-weighted validation F1 of a logistic regression trained by FedAvg
(10 rounds × 5 L-BFGS iterations) on the fit rows. Both tuners use the same ballots,
split and scorer; the hill-climb starts at fd 0.5 with step 0.1 in [0.05, 1] (the
peers' procedure), the grid scores 0, 0.1, …, 1, refines ±0.025 around the best and
keeps the smallest mask within 0.01 of the best score (also shown with tolerance 0, i.e.
the plain arg-max, to separate the effect of the search from that of parsimony). The chosen mask is then trained
on all training rows and scored on the test rows (weighted F1, pooled).

Run: ``python -m benchmarks.tuning`` (``--quick`` for tests, ``--seeds`` to choose);
writes ``tuning.json``, ``tuning.md``, ``tuning.png`` (curves of the first seed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.datasets import make_classification

from fedtab import LocalFederation, Site
from fedtab.data.synthetic import split_rows
from fedtab.report.plots import plot_tuning_curve
from fedtab.federation import run_training, tune_flow
from fedtab.federation.workflows.tuning.server import gather_fit_ballots  # the sites draw their own fit/validation parts

RESULTS = Path(__file__).resolve().parent / "results"
SELECTOR = {"name": "lasso", "params": {"C": 0.1}}
#: the peers' procedure, fedtab's default (parsimony within 0.01), and the grid's plain arg-max.
TUNERS = ("hill-climb", "grid", "grid (tolerance 0)")


def peer_table(seed: int, n_rows: int = 3000) -> pd.DataFrame:
    """The peers' example data (signal columns first: 20 informative, 30 redundant, 10 repeated)."""
    X, y = make_classification(n_rows, 100, n_informative=20, n_redundant=30, n_repeated=10, shuffle=False,
                               random_state=seed)
    frame = pd.DataFrame(X, columns=[f"f{i:02d}" for i in range(100)])
    frame["target"] = y
    return frame


def run_seed(seed: int, quick: bool) -> tuple[list[dict[str, Any]], list[Any]]:
    table = peer_table(seed, 1200 if quick else 3000)
    parts = split_rows(table, [1 / 3, 1 / 3, 1 / 3], stratify="target", seed=seed)
    fed = LocalFederation([Site(f"site{i + 1}", p, "target", test_size=0.2, seed=seed + i)
                           for i, p in enumerate(parts)])
    rounds, epochs = (3, 3) if quick else (10, 5)
    ballots = gather_fit_ballots(fed, SELECTOR)
    rows, results = [], []
    for label in TUNERS:
        method = "grid" if label.startswith("grid") else "hill-climb"
        opts: dict[str, Any] = {"grid": (0.0, 0.25, 0.5, 0.75, 1.0), "refine_step": 0.0} if quick and method == "grid" else {}
        if label == "grid (tolerance 0)":
            opts["tolerance"] = 0.0
        t0 = time.time()
        out = tune_flow(fed, selector=SELECTOR, model="logistic", tune_method=method, rounds=rounds,
                        local_epochs=epochs, ballots=ballots, seed=seed, **opts)
        seconds = time.time() - t0
        final = run_training(fed, out.features, model="logistic", rounds=rounds, local_epochs=epochs, seed=seed)
        signal = sum(int(f[1:]) < 60 for f in out.features)
        rows.append({"seed": seed, "method": label, "freedom_degree": out.tuning.freedom_degree,
                     "kept": len(out.features), "signal_kept": signal, "validation_f1": out.tuning.score,
                     "best_validation_f1": out.tuning.best_score, "test_f1": final.pooled["weighted_f1"],
                     "evaluations": out.tuning.evaluations, "seconds": seconds, "curve": out.tuning.curve()})
        if label != "grid (tolerance 0)":
            results.append(out.tuning)
        print(f"seed {seed} {label:18s} fd {out.tuning.freedom_degree:.3f} kept {len(out.features):3d} "
              f"(signal {signal}) val {out.tuning.score:.3f} test {final.pooled['weighted_f1']:.3f} "
              f"[{out.tuning.evaluations} trainings, {seconds:.0f}s]", flush=True)
    return rows, results


def markdown(rows: list[dict[str, Any]], quick: bool, seconds: float) -> str:
    cmd = "python -m benchmarks.tuning" + (" --quick" if quick else "")
    lines = [f"# Freedom-degree tuning: hill-climb vs grid{' (quick mode)' if quick else ''}", "",
             f"Command: `{cmd}` ({seconds / 60:.1f} min). Peers' example data; 3 equal sites; Lasso ballots; "
             "logistic regression by FedAvg; validation = 25 % of each site's training rows; test = the 20 % "
             "test split (never used for a choice). Signal = the 60 informative/redundant/repeated columns.", "",
             "| seed | tuner | fd | kept | of which signal | validation F1 | test F1 | trainings |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['seed']} | {r['method']} | {r['freedom_degree']:.3f} | {r['kept']} | {r['signal_kept']} | "
                     f"{r['validation_f1']:.3f} | {r['test_f1']:.3f} | {r['evaluations']} |")
    lines += ["", "| tuner | mean kept | mean validation F1 | mean test F1 (± sd) | mean trainings |",
              "|---|---:|---:|---:|---:|"]
    for m in TUNERS:
        rs = [r for r in rows if r["method"] == m]
        t = [r["test_f1"] for r in rs]
        lines.append(f"| {m} | {np.mean([r['kept'] for r in rs]):.1f} | {np.mean([r['validation_f1'] for r in rs]):.3f} | "
                     f"{np.mean(t):.3f} ± {np.std(t):.3f} | {np.mean([r['evaluations'] for r in rs]):.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows, first = [], None
    for s in seeds:
        r, res = run_seed(s, args.quick)
        rows += r
        first = first or res
    seconds = time.time() - t0
    (args.out / "tuning.json").write_text(json.dumps(rows, indent=1))
    (args.out / "tuning.md").write_text(markdown(rows, args.quick, seconds))
    plot_tuning_curve(first, args.out / "tuning.png", f"peers' example data, seed {seeds[0]}")
    print(f"wrote {args.out}/tuning.json, tuning.md, tuning.png in {seconds:.0f}s")


if __name__ == "__main__":
    main()
