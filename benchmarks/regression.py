"""Regression across sites: federated vs centralised vs local-only RMSE on scikit-learn's
diabetes table (442 rows, 10 columns; ships with scikit-learn, no download).

The rows are split into three sites of unequal size (shuffled by ``--seed``); every site draws
its own test part (quantile-stratified, :mod:`fedtab.federation.site.parts`). Federated: ``linear``
(pooled normal equations, one exact round) and ``gbdt`` (objective regression) through
:func:`fedtab.federation.workflows.training.run_training`, scored on every site's test part (RMSE pooled
from the sites' sums). Centralised: the same model kind fitted by scikit-learn on all sites'
training rows together; local-only: each site's own model, scored on its own test rows; all
on the same test rows. ``linear cv``: the job with ``[election] tune = "cv"`` (columns chosen by
pooled CV squared error over the sites' own folds, then the linear fit on them), with its test RMSE
relative to the all-columns ``linear federated`` job (``cv/all``: must stay within 1.03).

    python -m benchmarks.regression [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd


def _sites(seed: int):
    from sklearn.datasets import load_diabetes

    from fedtab.federation.site.core import Site

    data = load_diabetes(as_frame=True).frame
    data = data.sample(frac=1.0, random_state=seed).reset_index(drop=True)
    cuts = np.cumsum([0, 200, 140, 102])
    return [Site(f"site{i}", data.iloc[cuts[i]:cuts[i + 1]].reset_index(drop=True), "target", seed=seed + i,
                 policy={"allow_server_row_sets": True}) for i in range(3)]


def _rmse(y, p) -> float:
    return float(np.sqrt(np.mean((np.asarray(y) - np.asarray(p)) ** 2)))


def run(seed: int) -> dict[str, float]:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import LinearRegression

    from fedtab.engines.local import LocalFederation
    from fedtab.federation.workflows.training import run_training

    out: dict[str, float] = {}
    gbdt = {"name": "gbdt", "params": {"n_trees": 100, "max_depth": 3, "learning_rate": 0.1}}
    for name, spec, central in (("linear", "linear", LinearRegression),
                                ("gbdt", gbdt, lambda: HistGradientBoostingRegressor(max_iter=100, max_depth=3,
                                                                                      random_state=seed))):
        sites = _sites(seed)
        tr = run_training(LocalFederation(sites), model=spec, seed=seed)
        out[f"{name} federated"] = tr.metrics["pooled"]["rmse"]
        feats = [c for c in sites[0].table.columns if c != "target"]
        train = pd.concat([s.rows("train") for s in sites])
        test = pd.concat([s.rows("test") for s in sites])
        m = central().fit(train[feats], train["target"])
        out[f"{name} centralised"] = _rmse(test["target"], m.predict(test[feats]))
        preds, ys = [], []
        for s in sites:
            own = central().fit(s.rows("train")[feats], s.rows("train")["target"])
            preds.append(own.predict(s.rows("test")[feats]))
            ys.append(s.rows("test")["target"].to_numpy())
        out[f"{name} local-only"] = _rmse(np.concatenate(ys), np.concatenate(preds))
    out["linear cv"] = _cv_job(seed)
    out["cv/all"] = out["linear cv"] / out["linear federated"]
    return out


def _cv_job(seed: int) -> float:
    """Test RMSE of the job ``[training] model = "linear"`` with ``[election] tune = "cv"``."""
    from fedtab.engines.local import LocalFederation
    from fedtab.job.spec import parse_job
    from fedtab.job.workflow import run_workflow

    spec = parse_job({"target": "target", "training": {"model": "linear"}, "election": {"tune": "cv"},
                      "run": {"seed": seed}}, sites_required=False)
    out = run_workflow(LocalFederation(_sites(seed)), spec)
    return float(out.result["training"]["metrics"]["pooled"]["rmse"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    rows = {seed: run(seed) for seed in args.seeds}
    keys = list(next(iter(rows.values())))
    print("| seed | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for seed, r in rows.items():
        print(f"| {seed} | " + " | ".join(f"{r[k]:.3f}" if k == "cv/all" else f"{r[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
