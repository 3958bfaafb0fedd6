"""Wall and CPU time per feature of the Markov-blanket selector on whole datasets (one process).

Run: ``python -m benchmarks.markov_blanket_speed``; prints one line per dataset (PyImpetus: ~0.4 s/feature).
"""
import time, numpy as np
from fedtab.data.election_datasets import load_dataset
from fedtab.data.categories import category_sets, one_hot
from fedtab.election import make_selector
for name, rows in [("breast_cancer", None), ("mushroom", 4000), ("adult", 15000)]:
    ds = load_dataset(name); t = ds.table.iloc[:rows] if rows else ds.table
    if ds.categorical: t = one_hot(t, category_sets(t, ds.categorical))
    X = t.drop(columns=ds.target).to_numpy(float); X = np.where(np.isnan(X), 0, X); y = t[ds.target].to_numpy()
    w, c = time.time(), time.process_time()
    s = make_selector("markov_blanket").select(X, y)
    w, c = time.time() - w, time.process_time() - c
    print(f"{name}: {X.shape}, kept {s.mask.sum()}, wall {w:.1f}s = {w/X.shape[1]:.4f} s/feature, cpu {c/X.shape[1]:.4f} s/feature")
