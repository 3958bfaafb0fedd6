"""Gradient-boosted trees on UCI Adult: fedtab's histogram GBDT against XGBoost.

``--pooled-only`` (phase 1, the only mode so far): one process, the standard split
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

Phase 2 adds the federated rows (3 unequal sites, heterogeneous schemas, secure
aggregation on/off, federated logistic, local-only XGBoost).

Run: ``python -m benchmarks.gbdt --pooled-only`` (``--quick``: 10 rounds, depth 4).
"""

from __future__ import annotations

import argparse
import json
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
    args = ap.parse_args(argv)
    if not args.pooled_only:
        print("only --pooled-only is implemented so far (the federated rows come with the protocol path)")
    trees, depth = (10, 4) if args.quick else (args.trees, args.max_depth)
    params = GBDTParams(n_trees=trees, max_depth=depth, learning_rate=args.learning_rate, max_bins=args.max_bins)
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


if __name__ == "__main__":
    main()
