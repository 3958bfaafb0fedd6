"""High-dimensional, few samples: Feature Election vs local, federated-all and centralised.

Datasets (scikit-feature ``.mat`` files): ALLAML (5 sites), Prostate_GE (10 sites),
leukemia (5 sites), arcene (10 sites; stand-in for SMK_CAN_187, not obtainable).
Each repeat splits the rows into equal stratified sites (seed = repeat) and each site
holds out 20 % of its rows (stratified) as its test split. Methods:

* ``local``: every site fits its own L1-logistic regression (scikit-learn, liblinear,
  C = 1, standardised on its rows) and predicts its own test rows;
* ``federated_l1_all``: L1-logistic regression on all features trained by FedAvg
  (fedtab ``sgd`` model with a proximal L1 step, 20 rounds × 5 local epochs);
* ``feature_election``: every site votes with Lasso (L1-logistic, C = 1) on its fit rows,
  fd tuned by the grid search on validation rows (25 % of training rows), then logistic
  regression (L2, FedAvg, 10 rounds × 5 iterations) on the elected features;
* ``centralised``: one L1-logistic regression on the pooled training rows.

Metric: weighted F1 on the pooled test rows of all sites (every method is scored on
the same rows); ``mean`` and ``std`` over the repeats. Accuracy is in the details.

Run: ``python -m benchmarks.high_dim`` (``--repeats``; ``--quick`` for tests); writes
``high_dim.json`` (rows ``{dataset, sites, method, metric, mean, std, repeats}``),
``high_dim_details.json`` and ``high_dim.md``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from fedtab import LocalFederation, Site
from fedtab.data.election_datasets import load_mat
from fedtab.data.synthetic import split_rows
from fedtab.privacy import DisclosurePolicy
from fedtab.federation import run_training, tune_flow
from fedtab.learn.metrics import confusion, scores_from_confusion

RESULTS = Path(__file__).resolve().parent / "results"
DATASETS = {"ALLAML": 5, "Prostate_GE": 10, "leukemia": 5, "arcene": 10}
PUBLISHED_FE = {"ALLAML": 0.985, "Prostate_GE": 0.922, "leukemia": 0.934}
METHODS = ("local", "federated_l1_all", "feature_election", "centralised")


def _l1(X: np.ndarray, y: np.ndarray) -> Any:
    if np.unique(y).size < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LogisticRegression(l1_ratio=1.0, solver="liblinear", C=1.0, max_iter=1000, random_state=0).fit(X, y)


def _predict(model: Any, scaler: StandardScaler, X: np.ndarray, y_train: np.ndarray) -> np.ndarray:
    if model is None:
        return np.full(len(X), int(np.bincount(y_train.astype(int)).argmax()))
    return model.predict(scaler.transform(X))


def _xy(site: Site, part: str) -> tuple[np.ndarray, np.ndarray]:
    frame, y = site.xy(part)
    return frame.to_numpy(dtype=np.float64), np.asarray(y, dtype=np.int64)


def run_repeat(name: str, n_sites: int, seed: int, quick: bool) -> dict[str, dict[str, float]]:
    ds = load_mat(name)
    table = ds.table
    if quick:
        table = table[[c for c in table.columns[:300]] + [ds.target]] if ds.target not in table.columns[:300] else table
    parts = split_rows(table, [1 / n_sites] * n_sites, stratify=ds.target, seed=seed)
    # sites of 7-40 rows are the point of this benchmark (p >> n): they answer under an explicit
    # permissive disclosure policy instead of the default min_rows=10
    sites = [Site(f"site{i + 1}", p, ds.target, test_size=0.2, seed=seed * 100 + i, policy=DisclosurePolicy.permissive())
             for i, p in enumerate(parts)]
    fed = LocalFederation(sites)
    out: dict[str, dict[str, float]] = {}
    # local-only and centralised (scikit-learn), scored on the same pooled test rows
    cm_local = np.zeros((2, 2), dtype=np.int64)
    Xs, ys, Xt, yt = [], [], [], []
    for s in sites:
        Xtr, ytr = _xy(s, "train")
        Xte, yte = _xy(s, "test")
        sc = StandardScaler().fit(Xtr)
        cm_local += confusion(yte, _predict(_l1(sc.transform(Xtr), ytr), sc, Xte, ytr), 2)
        Xs.append(Xtr), ys.append(ytr), Xt.append(Xte), yt.append(yte)
    out["local"] = scores_from_confusion(cm_local)
    Xtr, ytr, Xte, yte = np.vstack(Xs), np.concatenate(ys), np.vstack(Xt), np.concatenate(yt)
    sc = StandardScaler().fit(Xtr)
    out["centralised"] = scores_from_confusion(confusion(yte, _predict(_l1(sc.transform(Xtr), ytr), sc, Xte, ytr), 2))
    rounds = 3 if quick else 20
    fl1 = run_training(fed, None, model={"name": "sgd", "params": {"lr": 0.05, "l1": 0.01, "alpha": 0.0}},
                       rounds=rounds, local_epochs=5, seed=seed)
    out["federated_l1_all"] = fl1.pooled
    opts: dict[str, Any] = {"grid": (0.0, 0.5, 1.0), "refine_step": 0.0} if quick else {}
    tuned = tune_flow(fed, selector={"name": "lasso", "params": {"C": 1.0}}, model="logistic",
                      rounds=3 if quick else 10, local_epochs=5, seed=seed, **opts)
    fe = run_training(fed, tuned.features, model="logistic", rounds=3 if quick else 10, local_epochs=5, seed=seed)
    out["feature_election"] = {**fe.pooled, "kept": len(tuned.features), "freedom_degree": tuned.tuning.freedom_degree}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 5)
    datasets = {"ALLAML": 5} if args.quick else DATASETS
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    details, rows = [], []
    for name, n_sites in datasets.items():
        per: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}
        for r in range(repeats):
            res = run_repeat(name, n_sites, r, args.quick)
            for m in METHODS:
                per[m].append(res[m])
                details.append({"dataset": name, "sites": n_sites, "repeat": r, "method": m, **res[m]})
            fe = res["feature_election"]
            print(f"{name} repeat {r}: " + ", ".join(f"{m} {res[m]['weighted_f1']:.3f}" for m in METHODS)
                  + f" (FE kept {fe['kept']}, fd {fe['freedom_degree']:.3f})", flush=True)
        for m in METHODS:
            v = [x["weighted_f1"] for x in per[m]]
            rows.append({"dataset": name, "sites": n_sites, "method": m, "metric": "weighted_f1",
                         "mean": float(np.mean(v)), "std": float(np.std(v)), "repeats": repeats})
    seconds = time.time() - t0
    (args.out / "high_dim.json").write_text(json.dumps(rows, indent=1))
    (args.out / "high_dim_details.json").write_text(json.dumps(details, indent=1))
    cmd = "python -m benchmarks.high_dim" + (" --quick" if args.quick else "")
    lines = [f"# High-dimensional, few samples{' (quick mode)' if args.quick else ''}", "",
             f"Command: `{cmd}` ({repeats} repeated stratified splits per dataset, {seconds / 60:.1f} min). "
             "Metric: weighted F1 on the pooled test rows (20 % of each site), mean ± sd over repeats.", "",
             "| dataset | sites | local | federated L1 (all) | Feature Election + FedAvg | centralised | FE kept (mean) | published FE |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, n_sites in datasets.items():
        cell = {r["method"]: f"{r['mean']:.3f} ± {r['std']:.3f}" for r in rows if r["dataset"] == name}
        kept = np.mean([d["kept"] for d in details if d["dataset"] == name and d["method"] == "feature_election"])
        lines.append(f"| {name} | {n_sites} | {cell['local']} | {cell['federated_l1_all']} | {cell['feature_election']} | "
                     f"{cell['centralised']} | {kept:.0f} | {PUBLISHED_FE.get(name, '–')} |")
    (args.out / "high_dim.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out}/high_dim.json, high_dim_details.json, high_dim.md in {seconds:.0f}s")


if __name__ == "__main__":
    main()
