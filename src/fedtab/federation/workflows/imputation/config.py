"""The imputation's settings (:class:`ImputeConfig`, sent to the sites in the setup) and what
the server learns (:class:`ImputationResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedtab.impute.graph import FeatureGraph
from fedtab.impute.stats import PooledStats

__all__ = ["ImputeConfig", "ImputationResult"]


@dataclass
class ImputeConfig:
    """Everything the workflow needs; JSON-able so it can be sent to sites.

    Graph: ``k_neighbors`` per node, edges need ``|r| >= min_abs_corr``.
    Model: ``hidden_dim``, ``n_layers``, ``dropout``, ``block_unavailable`` (ablation).
    Prior: ``use_prior`` (the GNN predicts a factor model's conditional mean plus a
    learned correction; ``False`` = the plain GNN, kept as an ablation), ``prior_rank``
    (``None`` = from the correlation spectrum, at most ``prior_max_rank``).
    Training: ``rounds`` of FedAvg, ``local_epochs`` per round, Adam ``lr`` and
    ``weight_decay``, ``batch_size``, ``mask_fraction`` of observed entries hidden per
    batch, ``structural_share`` of those flagged unavailable, ``max_steps_per_round``
    (cap on local optimiser steps, ``None`` = no cap). ``batch_size=None`` (the default):
    each site takes about 8 steps per epoch, in batches of 32 to 256 rows
    (:func:`fedtab.impute.train.auto_batch_size`). The defaults, 3 rounds of 8 local epochs at
    ``lr`` 6e-3, cost 3 exchanges where the earlier 20 rounds of one epoch cost 20, for the same
    heart small-site AUROCs (within 0.005 per seed) and AirQuality z-RMSE (within 3 %); they take
    as many optimiser steps as 4 rounds of 6 epochs, which took about 1.08x the CPU of those 20 rounds on AirQuality, which took 0.39x that of
    the defaults before them (64-row batches, two epochs, 3e-3; ``benchmarks/README.md``, issue 31).
    Validation: ``validation_mask_fraction`` of observed cells hidden in each site's
    validation rows (the rows come from ``Site.test_size``); ``keep_best`` returns the
    round with the lowest validation RMSE instead of the last one. Early stopping: the rounds
    stop once the median site's validation RMSE has not improved by more than ``tolerance``
    (relative) for ``patience`` rounds (``patience = 0``: every round runs); ``rounds`` stays the
    cap. It needs the sites' validation errors one by one: under secure sums or DP (errors
    summed or not released) every round runs.
    The run's modes are not settings of the imputation: secure sums, DP and the robust
    reducers (with ``max_site_share``) are the run's options
    (:func:`fedtab.federation.protocol.set_options`, ``federation.options``), see
    :func:`~fedtab.federation.workflows.imputation.run_imputation`.
    """

    k_neighbors: int = 10
    min_abs_corr: float = 0.05
    hidden_dim: int = 32
    n_layers: int = 3
    dropout: float = 0.0
    block_unavailable: bool = False
    use_prior: bool = True
    prior_rank: int | None = None
    prior_max_rank: int = 20
    rounds: int = 3
    local_epochs: int = 8
    lr: float = 6e-3
    weight_decay: float = 1e-5
    batch_size: int | None = None
    mask_fraction: float = 0.4
    structural_share: float = 0.5
    max_steps_per_round: int | None = None
    validation_mask_fraction: float = 0.2
    keep_best: bool = True
    patience: int = 0
    tolerance: float = 0.005
    seed: int = 0
    n_threads: int | None = None

    def validate(self) -> None:
        """Raise ``ValueError`` for out-of-range settings."""
        checks = {
            "k_neighbors": self.k_neighbors >= 1,
            "min_abs_corr": 0 <= self.min_abs_corr < 1,
            "hidden_dim": self.hidden_dim >= 1,
            "n_layers": self.n_layers >= 0,
            "prior_rank": self.prior_rank is None or self.prior_rank >= 0,
            "prior_max_rank": self.prior_max_rank >= 1,
            "dropout": 0 <= self.dropout < 1,
            "rounds": self.rounds >= 0,
            "local_epochs": self.local_epochs >= 1,
            "lr": self.lr > 0,
            "weight_decay": self.weight_decay >= 0,
            "batch_size": self.batch_size is None or self.batch_size >= 1,
            "mask_fraction": 0 < self.mask_fraction <= 1,
            "structural_share": 0 <= self.structural_share <= 1,
            "validation_mask_fraction": 0 < self.validation_mask_fraction <= 1,
            "patience": not isinstance(self.patience, bool) and isinstance(self.patience, int) and self.patience >= 0,
            "tolerance": 0 <= self.tolerance < 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid imputation settings: {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}")


@dataclass
class ImputationResult:
    """What the server learned. Arrays are over the global schema ``columns`` (F).

    Attributes:
        columns: global schema. mean, std: (F,) pooled (std 1 for constant columns).
        pooled: the pooled statistics (correlations, co-observed counts).
        graph: the feature graph sent to the sites.
        prior_W, prior_psi: the linear prior's (F, k) loadings and (F,) noise
            variances (``None`` when ``use_prior`` is off).
        model_config: kwargs of :class:`~fedtab.impute.model.GNNConfig`.
        weights: final model parameters (numpy, float32).
        site_columns: site -> its columns. site_rows: site -> training rows.
        history: per round ``{"round", "train_loss", "val_rmse"}`` (val of the model
            the sites received at the start of that round).
        validation: ``{"overall", "per_site", "per_column"}`` z-space RMSE of the returned
            model on the validation cells (empty dicts / None if no site has validation rows),
            and ``"per_column_mean_fill"``: the z-space RMSE of filling the same cells with the
            pooled mean (the baseline; sites send its squared-error sums ``val_mean_sse``).
        unobserved_pairs: column pairs no site observes together.
        privacy: with ``dp``, ε spent per step and in total (see
            :meth:`~fedtab.privacy.accountant.PrivacyLedger.report`).
        best_round: round whose model is returned. seconds: wall time. bytes: (down, up).
        participation: per exchange ``{"step", "sites"}``: the sites whose reply was used.
        dropped: ``{site: reason}`` of the sites left out during this run.
        left_out: robust mode: ``{site: reason}`` of the sites whose statistics were
            left out of the pooled statistics.
    """

    columns: list[str]
    mean: np.ndarray
    std: np.ndarray
    pooled: PooledStats
    graph: FeatureGraph
    model_config: dict
    weights: dict[str, np.ndarray]
    site_columns: dict[str, list[str]]
    site_rows: dict[str, int]
    prior_W: np.ndarray | None = None
    prior_psi: np.ndarray | None = None
    history: list[dict] = field(default_factory=list)
    validation: dict = field(default_factory=dict)
    unobserved_pairs: int = 0
    best_round: int = 0
    seconds: float = 0.0
    bytes: tuple[int, int] = (0, 0)
    participation: list[dict] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)
    privacy: dict | None = None
