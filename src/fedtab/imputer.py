"""``FederatedImputer``: the scikit-learn-style front door of FedHF-Impute."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator

__all__ = ["FederatedImputer"]


class FederatedImputer(BaseEstimator):
    """Federated imputation of missing cells *and* structurally unavailable columns.

    ``fit(tables)`` takes one DataFrame per site (its own columns, NaN = missing),
    wraps each in a :class:`~fedtab.federation.site.Site`, and runs
    :func:`~fedtab.federation.impute_flow.run_imputation` over an in-process
    :class:`~fedtab.engines.local.LocalFederation` (the same workflow runs unchanged on
    other engines). ``transform(table)`` returns the table over the global schema,
    original units, every gap filled; observed values are kept as they are.

    Args (all kept as given; see :class:`~fedtab.federation.impute_flow.ImputeConfig`):
        k_neighbors, min_abs_corr: feature graph.
        hidden_dim, n_layers, dropout: GNN size.
        rounds, local_epochs, lr, weight_decay, batch_size, mask_fraction,
        structural_share, max_steps_per_round: training.
        validation_fraction: share of each site's rows held out for validation
            (0 = none; then no validation report and no best-round selection).
        validation_mask_fraction, keep_best: validation.
        block_unavailable: ablation (reference behaviour, no messages into unavailable nodes).
        use_prior, prior_rank, prior_max_rank: the linear (factor-model) prior the GNN
            corrects; ``use_prior=False`` is the plain GNN (ablation).
        seed, n_threads: reproducibility / CPU threads.

    Learned attributes: ``columns_`` (global schema), ``mean_``, ``std_`` ((F,) pooled),
    ``graph_`` (:class:`~fedtab.impute.graph.FeatureGraph`), ``model_`` (torch module, with
    the linear prior installed when ``use_prior``),
    ``history_`` (per-round curve), ``validation_`` (z-space RMSE per site / column),
    ``site_names_``, ``site_columns_``, ``result_`` (the full
    :class:`~fedtab.federation.impute_flow.ImputationResult`).
    """

    def __init__(
        self,
        k_neighbors: int = 10,
        min_abs_corr: float = 0.05,
        hidden_dim: int = 32,
        n_layers: int = 3,
        dropout: float = 0.0,
        rounds: int = 20,
        local_epochs: int = 2,
        lr: float = 3e-3,
        weight_decay: float = 1e-5,
        batch_size: int = 64,
        mask_fraction: float = 0.4,
        structural_share: float = 0.5,
        max_steps_per_round: int | None = None,
        validation_fraction: float = 0.1,
        validation_mask_fraction: float = 0.2,
        keep_best: bool = True,
        block_unavailable: bool = False,
        use_prior: bool = True,
        prior_rank: int | None = None,
        prior_max_rank: int = 20,
        seed: int = 0,
        n_threads: int | None = None,
    ) -> None:
        self.k_neighbors = k_neighbors
        self.min_abs_corr = min_abs_corr
        self.hidden_dim = hidden_dim
        self.n_layers = n_layers
        self.dropout = dropout
        self.rounds = rounds
        self.local_epochs = local_epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.mask_fraction = mask_fraction
        self.structural_share = structural_share
        self.max_steps_per_round = max_steps_per_round
        self.validation_fraction = validation_fraction
        self.validation_mask_fraction = validation_mask_fraction
        self.keep_best = keep_best
        self.block_unavailable = block_unavailable
        self.use_prior = use_prior
        self.prior_rank = prior_rank
        self.prior_max_rank = prior_max_rank
        self.seed = seed
        self.n_threads = n_threads

    # ------------------------------------------------------------------------------
    def _config(self):
        from .federation.impute_flow import ImputeConfig

        names = {f.name for f in fields(ImputeConfig)}
        return ImputeConfig(**{k: v for k, v in self.get_params().items() if k in names})

    @staticmethod
    def _named_tables(tables: Any) -> dict[str, pd.DataFrame]:
        if isinstance(tables, pd.DataFrame):
            return {"site0": tables}
        if isinstance(tables, Mapping):
            return {str(k): v for k, v in tables.items()}
        if isinstance(tables, Sequence) and not isinstance(tables, (str, bytes)):
            return {f"site{i}": t for i, t in enumerate(tables)}
        raise ValueError(f"tables must be a DataFrame, a list of DataFrames or a dict name -> DataFrame, "
                         f"got {type(tables).__name__}")

    def fit(self, tables: Any, y: Any = None, progress: Callable[[int, int, dict], None] | None = None) -> "FederatedImputer":
        """Learn the imputer from one table per site.

        Args:
            tables: a list of DataFrames (sites ``site0``, ``site1``...), a dict
                name -> DataFrame, or a single DataFrame (one site).
            y: ignored (scikit-learn compatibility).
            progress: optional ``fn(round, rounds, info)`` callback.

        Raises:
            ValueError: no tables, or a site table that is empty, non-numeric, has
                infinite values or an all-NaN column (message names the site), or
                invalid settings.
            fedtab.federation.protocol.FederationError: the sites share no column, or a
                site failed during the run.
        """
        from .engines.local import LocalFederation
        from .federation.impute_flow import run_imputation, validate_site_table
        from .federation.site import Site
        from .impute.model import GNNImputer, GNNConfig, graph_tensors, numpy_to_state

        named = self._named_tables(tables)
        if not named:
            raise ValueError("fit needs at least one site table")
        cfg = self._config()
        cfg.validate()
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        sites = []
        for name, t in named.items():
            validate_site_table(t, name)
            t = t.copy()
            t.columns = [str(c) for c in t.columns]
            test_size = self.validation_fraction if len(t) >= 10 else 0.0
            sites.append(Site(name, t.astype(np.float64), test_size=test_size, seed=self.seed))
        result = run_imputation(LocalFederation(sites), cfg, progress=progress)
        self.result_ = result
        self.columns_ = list(result.columns)
        self.mean_ = result.mean
        self.std_ = result.std
        self.graph_ = result.graph
        self.history_ = result.history
        self.validation_ = result.validation
        self.site_names_ = list(named)
        self.site_columns_ = result.site_columns
        self.model_ = GNNImputer(GNNConfig(**result.model_config))
        numpy_to_state(self.model_, result.weights)
        if self.model_.config.prior_rank > 0:
            self.model_.set_prior(result.prior_W, result.prior_psi)
        self.model_.eval()
        self._adj = graph_tensors(result.graph)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise RuntimeError("this FederatedImputer is not fitted yet; call fit(tables) first")

    def predict_z(self, table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Model output for ``table``: ``(pred, given)``, both (n, F) in z-space over
        ``columns_``; ``given`` holds the z-scored input (NaN where not given)."""
        from .impute.train import predict

        self._check_fitted()
        if not isinstance(table, pd.DataFrame):
            raise ValueError(f"transform expects a DataFrame, got {type(table).__name__}")
        cols = [str(c) for c in table.columns]
        unknown = [c for c in cols if c not in self.columns_]
        if unknown:
            raise ValueError(f"columns {unknown[:8]} were not seen in fit (global schema has {len(self.columns_)} columns)")
        bad = [c for c in table.columns if not pd.api.types.is_numeric_dtype(table[c])]
        if bad:
            raise ValueError(f"non-numeric columns {[str(c) for c in bad[:8]]}")
        pos = {c: i for i, c in enumerate(self.columns_)}
        given = np.full((len(table), len(self.columns_)), np.nan)
        idx = [pos[c] for c in cols]
        given[:, idx] = table.to_numpy(dtype=np.float64, na_value=np.nan)
        given = (given - self.mean_) / self.std_
        available = np.zeros(len(self.columns_), dtype=bool)
        available[idx] = True
        pred = predict(self.model_, given, available, self._adj) if len(table) else np.zeros((0, len(self.columns_)))
        return pred, given

    def transform(self, table: pd.DataFrame) -> pd.DataFrame:
        """``table`` over the global schema (``columns_``), original units, no NaN left.

        Raises:
            RuntimeError: not fitted. ValueError: a column unknown to the fit, or
            non-numeric columns.
        """
        pred, given = self.predict_z(table)
        z = np.where(np.isnan(given), pred, given)
        return pd.DataFrame(z * self.std_ + self.mean_, columns=self.columns_, index=table.index)

    def fit_transform(self, tables: Any, y: Any = None, **kw: Any) -> Any:
        """Fit, then transform every site table (a list or dict like the input)."""
        self.fit(tables, **kw)
        named = self._named_tables(tables)
        out = {k: self.transform(t) for k, t in named.items()}
        return out if isinstance(tables, Mapping) else (out["site0"] if isinstance(tables, pd.DataFrame) else list(out.values()))
