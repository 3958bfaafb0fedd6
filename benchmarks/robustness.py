"""Robust mode under poisoning: 0, 1 and 2 hostile sites out of 5, ``robust=False`` vs ``True``.

Hostile sites answer every step honestly and then rewrite the reply
(:class:`fedtab.testing.HostileSite`, attack ``rows_reversed``: they claim 10⁶× their rows,
every count and sum scaled alike, and reverse what they send — inverted ballots, negated
parameters (Newton: reversed gradients), a perfect confusion matrix, the correlations of every other column mirrored,
negated GNN weights). Scores are measured on the **honest** sites' held-out rows with the
model the run returns (ground truth, not what the sites report); the training table also
shows the pooled F1 the run reports.

* **Seed demo** (:mod:`fedtab.cli.demo`'s table: 2,000 rows, 100 features of which 20 carry
  signal) split into 5 equal stratified sites voting with the demo's selectors in turn
  (Lasso C=0.05, random forest, mutual information, ...); election at fd 0.5, then
  logistic regression with its default solver: federated Newton–Raphson (at most 10
  iterations) in a plain run; in robust mode FedAvg, 10 rounds × 5 epochs, robust by the
  coordinate-wise median (Newton–Raphson serves plain and secure sums only: the run's
  ``training.solver_reason``). Metric: weighted F1 on the honest sites' test rows (20 % of each site).
* **AirQuality** (UCI, 9,357 × 13) with ``benchmarks.impute``'s protocol over 5 sites:
  rows shuffled and split equally, each site keeps a random 60 % of the columns (every
  column held somewhere), 80/20 train/test, z-scored with the training rows; each site
  holds 10 % of its training rows out for FedHF-Impute's validation. FedHF-Impute with its
  defaults. Metric: RMSE (z-space) on the honest sites' test rows over 60 % hidden
  observed cells of their own columns and over the columns they do not hold.

Hostile sites are the last sites (``site-5``, then ``site-4``). ``--seeds N`` repeats with
seeds 0..N-1 and reports mean ± std.

    python -m benchmarks.robustness            # the published table
    python -m benchmarks.robustness --quick    # seconds-long smoke run (tests)

Writes ``benchmarks/results/robustness.json`` and ``robustness.md`` (or ``--out DIR``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benchmarks.impute import prepare, score
from fedtab.data.impute_datasets import SchemaSplit, load_impute_dataset
from fedtab.data.synthetic import classification_table, split_rows
from fedtab.engines.local import LocalFederation
from fedtab.federation import Site, run_election, run_training
from fedtab.federation.protocol import FederationError
from fedtab.federation.site.matrices import label_key, site_matrix
from fedtab.learn.metrics import confusion, scores_from_confusion
from fedtab.learn.models import make_model
from fedtab.testing import HostileSite
from fedtab.federation.protocol import set_options

RESULTS = Path(__file__).resolve().parent / "results"
ATTACK = "rows_reversed"
N_SITES = 5
HOSTILE_COUNTS = (0, 1, 2)
SELECTORS = ({"name": "lasso", "params": {"C": 0.05}}, "random_forest", "mutual_info")
MASK = 0.6


def _names(n_hostile: int) -> list[tuple[str, bool]]:
    return [(f"site-{i + 1}", i >= N_SITES - n_hostile) for i in range(N_SITES)]


# ----------------------------------------------------------------------------- seed demo
def demo_f1(n_hostile: int, robust: bool, seed: int, quick: bool) -> dict:
    """Honest sites' test F1 (ground truth) and the reported pooled F1 of election + training."""
    rows, rounds = (600, 2) if quick else (2000, 10)
    table = classification_table(rows, 100, 12, 8, 0, shuffle=False, seed=seed)
    parts = split_rows(table, [1 / N_SITES] * N_SITES, stratify="target", seed=seed)
    sites = []
    for (name, hostile), part, k in zip(_names(n_hostile), parts, range(N_SITES)):
        selector = {"name": "lasso", "params": {"C": 0.5}} if quick else SELECTORS[k % len(SELECTORS)]
        cls, extra = (HostileSite, {"step": "training", "attack": ATTACK}) if hostile else (Site, {})
        sites.append(cls(name, part, "target", seed=seed, selector=selector, **extra))
    fed = LocalFederation(sites)
    set_options(fed, robust=robust)
    election = run_election(fed, 0.5)
    signal = set([c for c in table.columns if c != "target"][:20]) & set(election.result.selected_names)
    try:
        outcome = run_training(fed, rounds=rounds, local_epochs=5, seed=seed)
    except FederationError as exc:  # e.g. every site refuses the coefficients a liar's sums drove out of range
        return {"f1": None, "reported_f1": None, "kept": len(election.result.selected_names),
                "signal_kept": len(signal), "left_out": [], "failed": f"{type(exc).__name__}: {exc}"}
    model = make_model(outcome.model)
    index = {c: i for i, c in enumerate(outcome.classes)}
    total = np.zeros((len(index), len(index)), dtype=np.int64)
    for site, (_, hostile) in zip(sites, _names(n_hostile)):
        if hostile:
            continue
        X, y_raw = site_matrix(site, outcome.features, "test")
        Z = np.nan_to_num((X - outcome.mean) / outcome.std)
        total += confusion([index[label_key(v)] for v in y_raw], model.predict(outcome.params, Z), len(index))
    return {"f1": scores_from_confusion(total)["weighted_f1"], "reported_f1": outcome.pooled["weighted_f1"],
            "kept": len(election.result.selected_names), "signal_kept": len(signal),
            "left_out": sorted(outcome.left_out)}


# ----------------------------------------------------------------------------- AirQuality
def airquality_rmse(x: pd.DataFrame, n_hostile: int, robust: bool, seed: int, quick: bool) -> dict:
    """Observed-gap and structural RMSE (z-space) on the honest sites' test rows
    (:func:`benchmarks.impute.prepare` and :func:`benchmarks.impute.score` over 5 sites)."""
    from fedtab.imputer import FederatedImputer

    train, tests, queries, cols, split = prepare(x, seed, n_sites=N_SITES)
    sites = []
    for (name, hostile), table in zip(_names(n_hostile), train):
        cls, extra = (HostileSite, {"step": "imputation", "attack": ATTACK}) if hostile else (Site, {})
        sites.append(cls(name, table, test_size=0.1, seed=seed, **extra))
    params = {"rounds": 2, "max_steps_per_round": 5} if quick else {}
    imp = FederatedImputer(seed=seed, robust=robust, **params).fit_federation(LocalFederation(sites))
    honest = [i for i, (_, hostile) in enumerate(_names(n_hostile)) if not hostile]
    q = [queries[MASK][i] for i in honest]
    preds = [imp.transform(t)[cols].to_numpy() for t in q]
    kept = SchemaSplit(rows=[split.rows[i] for i in honest], columns=[split.columns[i] for i in honest])
    observed, structural = score(preds, [tests[i] for i in honest], q, kept, cols)
    return {"observed_rmse": observed, "structural_rmse": structural, "left_out": sorted(imp.result_.left_out)}


# ----------------------------------------------------------------------------- report
def run(seeds: list[int], quick: bool, log=print, partial: Path | None = None) -> list[dict]:
    """Every (seed, hostile count, mode); ``partial``: JSON file rewritten after each row so an
    interrupted run leaves what it measured."""
    rows = []
    if quick:
        rng = np.random.default_rng(0)
        z = rng.normal(size=(600, 2))
        air = pd.DataFrame(z @ rng.normal(size=(2, 8)) + 0.3 * rng.normal(size=(600, 8)),
                           columns=[f"c{i}" for i in range(8)])
    else:
        air = load_impute_dataset("airquality")
    for seed in seeds:
        for n_hostile in HOSTILE_COUNTS:
            for robust in (False, True):
                t0 = time.perf_counter()
                d = demo_f1(n_hostile, robust, seed, quick)
                t1 = time.perf_counter()
                a = airquality_rmse(air, n_hostile, robust, seed, quick)
                t2 = time.perf_counter()
                rows.append({"seed": seed, "hostile": n_hostile, "robust": robust, "demo": d, "airquality": a,
                             "demo_seconds": t1 - t0, "airquality_seconds": t2 - t1})
                if partial is not None:
                    partial.write_text(json.dumps(rows, indent=1))
                log(f"seed {seed} hostile {n_hostile} robust {robust!s:5}: F1 {_f(d['f1'], 3)} (reported "
                    f"{_f(d['reported_f1'], 3)}), AirQuality RMSE {a['observed_rmse']:.4f} / {a['structural_rmse']:.4f}"
                    f"  [{t1 - t0:.0f}s + {t2 - t1:.0f}s]")
    return rows


def _f(value: float | None, digits: int) -> str:
    return "failed" if value is None else f"{value:.{digits}f}"


def _ms(values: list[float | None], digits: int) -> str:
    """Mean (± std over seeds); ``failed`` when a run failed (no model: ``None``), ``failed in k of n``."""
    failed = sum(x is None for x in values)
    if failed:
        return "failed" if failed == len(values) else f"failed in {failed} of {len(values)}"
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.{digits}f}" if v.size == 1 else f"{v.mean():.{digits}f} ± {v.std(ddof=0):.{digits}f}"


def summarise(rows: list[dict], command: str, seconds: float) -> str:
    seeds = sorted({r["seed"] for r in rows})
    lines = [
        "# Robust mode under poisoning",
        "",
        f"Command: `{command}` — seeds {seeds}, {N_SITES} sites, the last 1 or 2 hostile (attack "
        f"`{ATTACK}`: claims 10⁶× its rows and reverses what it sends, at every step); {seconds:.0f} s wall on "
        "2 shared CPU cores. Scores on the honest sites' held-out rows with the returned model. Seed demo: "
        "weighted F1 (higher is better), plus the pooled F1 the run reports. AirQuality: z-space RMSE (lower "
        f"is better) of hidden observed cells (p = {MASK}) and of the columns a site does not hold.",
        "",
        "| hostile sites | robust | demo F1 (honest sites) | demo F1 as reported | AirQuality RMSE observed "
        "| AirQuality RMSE structural | sites left out (demo / AirQuality) |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    table: dict[tuple[int, bool], dict] = {}
    for n_hostile in HOSTILE_COUNTS:
        for robust in (False, True):
            g = [r for r in rows if r["hostile"] == n_hostile and r["robust"] == robust]
            if not g:
                continue
            cell = {"f1": [r["demo"]["f1"] for r in g], "rep": [r["demo"]["reported_f1"] for r in g],
                    "obs": [r["airquality"]["observed_rmse"] for r in g],
                    "str": [r["airquality"]["structural_rmse"] for r in g]}
            table[(n_hostile, robust)] = cell
            out_d = sorted({s for r in g for s in r["demo"]["left_out"]})
            out_a = sorted({s for r in g for s in r["airquality"]["left_out"]})
            lines.append(f"| {n_hostile} | {'yes' if robust else 'no'} | {_ms(cell['f1'], 3)} | {_ms(cell['rep'], 3)} | "
                         f"{_ms(cell['obs'], 4)} | {_ms(cell['str'], 4)} | {', '.join(out_d) or '—'} / "
                         f"{', '.join(out_a) or '—'} |")
    if (0, False) in table and (0, True) in table:
        plain, rob = table[(0, False)], table[(0, True)]
        df1 = np.mean(rob["f1"]) - np.mean(plain["f1"])
        dobs = np.mean(rob["obs"]) / np.mean(plain["obs"]) - 1
        dstr = np.mean(rob["str"]) / np.mean(plain["str"]) - 1
        lines += ["", f"Cost of `robust=True` with no hostile site: demo F1 {df1:+.3f}, AirQuality RMSE observed "
                      f"{dobs:+.1%}, structural {dstr:+.1%}."]
    failures = [r for r in rows if r["demo"].get("failed")]
    if failures:
        lines += ["", "Training runs that failed (no model; the error the run raised):", ""]
        lines += [f"- seed {r['seed']}, {r['hostile']} hostile, robust {'yes' if r['robust'] else 'no'}: "
                  f"{r['demo']['failed'][:300]}" for r in failures]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (synthetic stand-in for AirQuality)")
    ap.add_argument("--seeds", type=int, default=1, help="number of seeds (0..N-1)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    from fedtab.impute.train import set_threads

    set_threads(1)
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / "robustness.partial.json"
    rows = run(list(range(1 if args.quick else args.seeds)), args.quick, partial=partial)
    partial.unlink(missing_ok=True)
    seconds = time.perf_counter() - t0
    command = "python -m benchmarks.robustness" + (" --quick" if args.quick else "") + (
        f" --seeds {args.seeds}" if args.seeds != 1 and not args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "robustness.json").write_text(json.dumps({"command": command, "seconds": seconds, "rows": rows},
                                                         indent=1))
    (args.out / "robustness.md").write_text(summarise(rows, command, seconds))
    print(f"wrote {args.out / 'robustness.json'} and .md in {seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
