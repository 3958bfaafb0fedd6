"""The sites' cost model against measured time (issue 28, item 5).

A site refuses a selector or model whose estimated work (:class:`fedtab.learn.models.Cost`,
≈ arithmetic operations) passes its ``max_work`` cap — before it runs. This script checks
those estimates against the CPU time each selector and model really takes on the shipped
benchmarks' data (UCI Heart, all 303 rows; UCI Adult, the first ``--adult-rows`` rows, one-hot),
in one process (CPU time of every thread, as the site's machine spends it).

For every (dataset, selector or model) it prints the estimated work, the measured CPU
seconds and the implied rate (work per second). The rate of the whole table's median is the
calibration; ``ratio`` = (estimate at that rate) / measured — a cost model that is right up
to a constant has every ratio near 1. The check (``--check``, exit status 1 otherwise): every
ratio within 3× (between 1/3 and 3).

Run: ``python -m benchmarks.cost_model`` (about a minute; ``--quick``: heart only).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable

import numpy as np

#: selectors as a job file names them, with parameters that keep a run short
SELECTORS: dict[str, Any] = {
    "lasso": "lasso",
    "elastic_net": "elastic_net",
    "random_forest": {"name": "random_forest", "params": {"n_estimators": 50}},
    "mutual_info": "mutual_info",
    "anova": "anova",
    "chi2": "chi2",
    "lasso_cv": "lasso_cv",
    "markov_blanket (forest)": "markov_blanket",
    "markov_blanket (linear)": {"name": "markov_blanket", "params": {"model": "linear"}},
    "markov_blanket (boosting)": {"name": "markov_blanket", "params": {"model": "boosting"}},
    "sequential_attention": "sequential_attention",
}
#: models with the local epochs a fit request asks for
MODELS: dict[str, tuple[Any, int]] = {
    "logistic (newton)": ("logistic", 1),  # one Newton reply: gradient and Hessian sums (no local epochs)
    "logistic (fedavg)": ({"name": "logistic", "params": {"solver": "fedavg"}}, 5),
    "gnb": ("gnb", 1),
    "sgd": ("sgd", 5),
    "mlp": ({"name": "mlp", "params": {"hidden": [32]}}, 5),
    "gbdt": ({"name": "gbdt", "params": {"n_trees": 30, "max_depth": 4}}, 1),
}


def _data(name: str, rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    from fedtab.data.categories import category_sets, one_hot
    from fedtab.data.election_datasets import load_dataset

    ds = load_dataset(name)
    t = ds.table.iloc[:rows] if rows else ds.table
    if ds.categorical:
        t = one_hot(t, category_sets(t, ds.categorical))
    X = t.drop(columns=ds.target).to_numpy(float)
    X = np.where(np.isnan(X), 0.0, X)
    X = (X - X.mean(axis=0)) / np.where(X.std(axis=0) > 0, X.std(axis=0), 1.0)
    _, y = np.unique(t[ds.target].astype(str).to_numpy(), return_inverse=True)
    return X, y


def _cpu(fn: Callable[[], Any]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(datasets: list[tuple[str, int | None]]) -> list[dict[str, Any]]:
    """``[{dataset, kind, name, work, seconds}]`` of every selector and model on every dataset."""
    from fedtab.election.selectors import make_selector, selector_cost
    from fedtab.learn.models import make_model, model_cost

    try:  # imported before any timing: an import is no part of a selector's work
        import scipy.stats  # noqa: F401
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover - torch is an optional extra
        pass

    out = []
    for ds, rows in datasets:
        X, y = _data(ds, rows)
        n, d = X.shape
        C = int(y.max()) + 1
        Xpos = X - X.min(axis=0)  # chi2 needs non-negative inputs
        for label, spec in SELECTORS.items():
            sel = make_selector(spec)
            work = selector_cost(spec, n, d).work
            data = Xpos if sel.name == "chi2" else X
            out.append({"dataset": ds, "kind": "selector", "name": label, "rows": n, "features": d, "work": work,
                        "seconds": _cpu(lambda: sel.select(data, y))})
        for label, (spec, epochs) in MODELS.items():
            fm = make_model(spec)
            work = model_cost(spec, d, max(C, 2), n, epochs).work
            params = fm.init(d, C, seed=0)
            run = _newton_reply(params, X, y) if getattr(fm, "newton", False) else \
                (lambda: fm.local_update(params, X, y, epochs=epochs))
            out.append({"dataset": ds, "kind": "model", "name": label, "rows": n, "features": d, "work": work,
                        "seconds": _cpu(run)})
    return out


def _newton_reply(params: dict[str, np.ndarray], X: np.ndarray, y: np.ndarray) -> Callable[[], Any]:
    """What a site computes for one ``newton`` request: the log-loss's gradient and Hessian sums."""
    from fedtab.learn.newton import as_theta, logistic_sums

    theta = as_theta(params)
    return lambda: logistic_sums(theta, X, y)


def rated(results: list[dict[str, Any]], floor: float = 0.05) -> tuple[float, list[dict[str, Any]]]:
    """``(rate, results with "ratio")``: the median work per CPU second of the runs that took
    at least ``floor`` seconds (shorter ones are timer noise), and each run's estimate at that
    rate over its measured time (both raised to ``floor``: below it, any two times agree)."""
    timed = [r["work"] / r["seconds"] for r in results if r["seconds"] >= floor]
    rate = float(np.median(timed)) if timed else 1e9
    out = []
    for r in results:
        est = r["work"] / rate
        out.append({**r, "estimate_s": est, "ratio": max(est, floor) / max(r["seconds"], floor)})
    return rate, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="heart only")
    p.add_argument("--adult-rows", type=int, default=4000, help="rows of UCI Adult (default 4000)")
    p.add_argument("--check", action="store_true", help="exit 1 unless every ratio is within 3x")
    args = p.parse_args(argv)
    datasets: list[tuple[str, int | None]] = [("heart", None)] + ([] if args.quick else [("adult", args.adult_rows)])
    rate, results = rated(measure(datasets))
    print(f"calibration: {rate:.3g} work units per CPU second (median of the runs of >= 0.05 s)")
    print("| dataset | kind | name | rows × features | work | estimate (s) | measured CPU (s) | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    bad = []
    for r in results:
        flag = "" if 1 / 3 <= r["ratio"] <= 3 else " ✗"
        if flag:
            bad.append(r)
        print(f"| {r['dataset']} | {r['kind']} | {r['name']} | {r['rows']} × {r['features']} | {r['work']:.3g} | "
              f"{r['estimate_s']:.3f} | {r['seconds']:.3f} | {r['ratio']:.2f}{flag} |")
    print(f"{len(results) - len(bad)} of {len(results)} within 3x")
    return 1 if (args.check and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
