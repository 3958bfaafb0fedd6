"""Benchmark adapters for the GNN methods (they run the federated workflow in-process).

Same interface as :mod:`fedtab.impute.baselines`: ``fn(train, columns, queries, seed)``.
"""

from __future__ import annotations

import numpy as np

from fedtab.impute.baselines import METHODS as BASELINES, _pooled_mean

def fedhf(train, columns, queries, seed=0, **params):
    """FedHF-Impute (:class:`~fedtab.imputer.FederatedImputer`)."""
    from fedtab.imputer import FederatedImputer

    imp = FederatedImputer(seed=seed, **params).fit(list(train))
    pos = {c: i for i, c in enumerate(imp.columns_)}
    order = [pos[c] for c in columns]
    return [imp.predict_z(q)[0][:, order] * imp.std_[order] + imp.mean_[order] for q in queries]


def fedhf_no_unavailable_messages(train, columns, queries, seed=0, **params):
    """Ablation: the reference behaviour, unavailable nodes zeroed (no messages in or out)."""
    return fedhf(train, columns, queries, seed=seed, block_unavailable=True, **params)


def fedhf_no_prior(train, columns, queries, seed=0, **params):
    """Ablation: the GNN without the linear (factor-model) prior path."""
    return fedhf(train, columns, queries, seed=seed, use_prior=False, **params)


def local_gnn(train, columns, queries, seed=0, **params):
    """Each site trains the GNN alone on its own columns; absent columns get the pooled mean."""
    from fedtab.imputer import FederatedImputer

    g = _pooled_mean(train, columns)
    out = []
    for t, q in zip(train, queries):
        imp = FederatedImputer(seed=seed, **params).fit([t])
        pred = np.tile(g, (len(q), 1))
        pos = {c: i for i, c in enumerate(columns)}
        idx = [pos[c] for c in imp.columns_]
        pred[:, idx] = imp.predict_z(q)[0] * imp.std_ + imp.mean_
        out.append(pred)
    return out



#: every method of the harness: FedHF-Impute, its ablations, the local-only GNN, then the baselines
METHODS = {
    "fedhf": fedhf,
    "fedhf_no_prior": fedhf_no_prior,
    "fedhf_no_unavail_msgs": fedhf_no_unavailable_messages,
    "local_gnn": local_gnn,
    **BASELINES,
}
