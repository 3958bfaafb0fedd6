"""FedHF-Impute: federated imputation across heterogeneous schemas.

Public API::

    from fedtab import FederatedImputer          # the estimator runs the federated workflow
    imp = FederatedImputer(rounds=30).fit([site_a_df, site_b_df])   # one DataFrame per site
    full_a = imp.transform(site_a_df)   # global schema, every gap filled

This package holds the pure building blocks (no engine or workflow imports): :mod:`.stats` (sufficient statistics and
exact pooling), :mod:`.graph` (feature graph), :mod:`.prior` (linear factor-model prior
fitted from pooled correlations), :mod:`.model` (GNN), :mod:`.train`
(self-supervised local training, FedAvg), :mod:`.baselines`. The federated protocol
lives in :mod:`fedtab.federation.workflows.imputation`. Torch is imported lazily, so
``import fedtab.impute`` is cheap.
"""

from .graph import FeatureGraph, build_feature_graph
from .stats import PooledStats, SiteStats, pool_stats, site_stats

__all__ = [
    "FeatureGraph", "build_feature_graph", "PooledStats", "SiteStats", "pool_stats", "site_stats",
    "GNNImputer", "GNNConfig", "fedavg", "LowRankGaussian",
]


def __getattr__(name: str):  # lazy: torch / sklearn only when needed
    if name in ("GNNImputer", "GNNConfig"):
        from . import model
        return getattr(model, name)
    if name == "fedavg":
        from .train import fedavg
        return fedavg
    if name == "LowRankGaussian":
        from .baselines import LowRankGaussian
        return LowRankGaussian
    raise AttributeError(f"module 'fedtab.impute' has no attribute {name!r}")
