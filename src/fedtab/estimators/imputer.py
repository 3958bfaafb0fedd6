"""``FederatedImputer``: the scikit-learn-style front door of FedHF-Impute.

``fit`` builds the :class:`~fedtab.job.spec.JobSpec` of an imputation job from the
estimator's parameters (:meth:`FederatedImputer.job_spec`) and runs the job's step loop;
tables follow the estimators' input contract (:mod:`fedtab.estimators.tables`).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.exceptions import NotFittedError

from .tables import is_single, site_tables

if TYPE_CHECKING:
    from ..job.spec import JobSpec

__all__ = ["FederatedImputer", "ImputerNotFittedError"]


class ImputerNotFittedError(NotFittedError, RuntimeError):
    """scikit-learn's ``NotFittedError``; also a ``RuntimeError``, which fedtab raised before."""


class FederatedImputer(TransformerMixin, BaseEstimator, auto_wrap_output_keys=("transform",)):
    """Federated imputation of missing cells *and* structurally unavailable columns.

    ``fit(tables)`` takes one table per site (its own columns, NaN = missing),
    wraps each in a :class:`~fedtab.federation.site.core.Site`, and runs the imputation job
    (:meth:`job_spec`; its step is :func:`~fedtab.federation.workflows.imputation.run_imputation`)
    over an in-process :class:`~fedtab.engines.local.LocalFederation` (the same workflow runs
    unchanged on other engines). ``transform(table)`` returns the table over the global schema,
    original units, every gap filled; observed values are kept as they are.

    scikit-learn contract: a ``TransformerMixin`` that allows NaN; a single table (a
    DataFrame or a 2-D array, columns ``x0 …`` for an array) is one site, so it works
    as a plain transformer and in a ``Pipeline``. ``transform`` of a DataFrame may
    give any subset of the global columns (a site's table) and returns a DataFrame;
    an array must have ``n_features_in_`` columns in the global order and gives an
    array (or a DataFrame after ``set_output(transform="pandas")``). Complex and
    sparse input raise ``ValueError`` / ``TypeError``; use before ``fit`` raises
    ``NotFittedError``.

    Args (all kept as given; see :class:`~fedtab.federation.workflows.imputation.ImputeConfig`):
        k_neighbors, min_abs_corr: feature graph.
        hidden_dim, n_layers, dropout: GNN size.
        rounds, local_epochs, lr, weight_decay, batch_size, mask_fraction,
        structural_share, max_steps_per_round: training (``batch_size=None``: about 8
            steps per epoch at each site, in batches of 32 to 256 rows; the defaults, 3 rounds
            of 8 local epochs, are 3 exchanges where 20 rounds of one epoch were 20, at equal
            error, issue 31).
        validation_fraction: share of each site's rows held out for validation
            (0 = none; then no validation report and no best-round selection).
        validation_mask_fraction, keep_best: validation.
        patience, tolerance: early stopping (the rounds stop once the median site's validation
            RMSE has not improved by more than ``tolerance``, relative, for ``patience`` rounds;
            0 = every round runs; not under secure sums or DP).
        block_unavailable: ablation (reference behaviour, no messages into unavailable nodes).
        use_prior, prior_rank, prior_max_rank: the linear (factor-model) prior the GNN
            corrects; ``use_prior=False`` is the plain GNN (ablation).
        seed, n_threads: reproducibility / CPU threads.
        robust, max_site_share: robust mode (screened, capped statistics; median FedAvg;
            see :func:`~fedtab.federation.workflows.imputation.run_imputation`). ``False`` = plain.
        secure_aggregation: sums travel masked; dp: differential privacy ``{"epsilon",
            "delta", "bounds", "clip"}``. These three are the job's ``[trust]`` / ``[privacy]``
            (the run's options, :func:`fedtab.federation.protocol.set_options`).
        policy: the sites' :class:`~fedtab.privacy.DisclosurePolicy` (or its settings
            dict); default ``min_rows=10``: a table with fewer rows is refused.
        min_sites: quorum of :meth:`fit`'s federation: a site that fails, times out or
            sends a rejected reply is dropped (named in ``result_.dropped``) while this
            many remain; ``None`` = every site must answer.
        timeout: seconds each site may take per exchange in :meth:`fit` (``None`` = no limit).
        integer_codes: impute an integer-coded column (integers only, at most
            :data:`~fedtab.federation.steps.profile.MAX_LEVELS` values, e.g. ``thal`` in
            {3, 6, 7}) to the nearest value of its agreed set, as a job does: after training,
            one ``job_profile`` exchange asks each site for the values it holds in at least
            ``min_rows`` rows (through its release gate); not in a private fit
            (``secure_aggregation`` or ``dp``), which releases no value set.
        categorical: columns that must be imputed from their agreed value set (integer
            codes); a listed column that is not integer-coded at the sites raises.

    Learned attributes: ``columns_`` (global schema), ``mean_``, ``std_`` ((F,) pooled),
    ``graph_`` (:class:`~fedtab.impute.graph.FeatureGraph`), ``model_`` (torch module, with
    the linear prior installed when ``use_prior``),
    ``history_`` (per-round curve), ``validation_`` (z-space RMSE per site / column),
    ``site_names_``, ``site_columns_``, ``levels_`` (``{column: agreed values}`` of the
    integer-coded columns), ``result_`` (the full
    :class:`~fedtab.federation.workflows.imputation.ImputationResult`), ``job_result_`` (the job's
    ``steps``, ``privacy``, ``trust`` and ``participation``, as in ``result.json``), ``n_features_in_``
    (global columns) and ``feature_names_in_`` (when every table had string column names).
    """

    def __init__(
        self,
        k_neighbors: int = 10,
        min_abs_corr: float = 0.05,
        hidden_dim: int = 32,
        n_layers: int = 3,
        dropout: float = 0.0,
        rounds: int = 3,
        local_epochs: int = 8,
        lr: float = 6e-3,
        weight_decay: float = 1e-5,
        batch_size: int | None = None,
        mask_fraction: float = 0.4,
        structural_share: float = 0.5,
        max_steps_per_round: int | None = None,
        validation_fraction: float = 0.2,
        validation_mask_fraction: float = 0.2,
        keep_best: bool = True,
        patience: int = 0,
        tolerance: float = 0.005,
        block_unavailable: bool = False,
        use_prior: bool = True,
        prior_rank: int | None = None,
        prior_max_rank: int = 20,
        seed: int = 0,
        n_threads: int | None = None,
        robust: bool = False,
        max_site_share: float = 0.5,
        secure_aggregation: bool = False,
        dp: dict | None = None,
        policy: Any = None,
        min_sites: int | None = None,
        timeout: float | None = None,
        integer_codes: bool = True,
        categorical: list[str] | None = None,
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
        self.patience = patience
        self.tolerance = tolerance
        self.block_unavailable = block_unavailable
        self.use_prior = use_prior
        self.prior_rank = prior_rank
        self.prior_max_rank = prior_max_rank
        self.seed = seed
        self.n_threads = n_threads
        self.robust = robust
        self.max_site_share = max_site_share
        self.secure_aggregation = secure_aggregation
        self.dp = dp
        self.policy = policy
        self.min_sites = min_sites
        self.timeout = timeout
        self.integer_codes = integer_codes
        self.categorical = categorical

    # ------------------------------------------------------------------------------
    def job_spec(self, sites: list[str]) -> "JobSpec":
        """The validated job :meth:`fit` runs over ``sites``: imputation alone (no profile, no
        training), this estimator's settings in ``[impute]``, ``[trust]`` and ``[privacy]``.

        Raises:
            fedtab.job.spec.JobError: invalid settings (a ``ValueError``), naming them.
        """
        from ..job.spec import (EvaluationSpec, ImputeSpec, JobSpec, PrivacySpec, RunSpec, SchemaSpec, SiteSpec,
                                TrustSpec, check_spec)

        params = self.get_params()
        impute = {f.name: params[f.name] for f in fields(ImputeSpec) if f.name in params}
        impute["prior"] = self.use_prior
        test_size = self.validation_fraction if isinstance(self.validation_fraction, (int, float)) else 0.0
        return check_spec(JobSpec(
            target=None, sites=[SiteSpec(n, None) for n in sites], impute=ImputeSpec(**impute), training=None,
            run=RunSpec(seed=self.seed, test_size=test_size),
            privacy=PrivacySpec(secure_aggregation=self.secure_aggregation, dp=self.dp),
            trust=TrustSpec(robust=self.robust, max_site_share=self.max_site_share, min_sites=self.min_sites,
                            timeout=self.timeout),
            schema=SchemaSpec(profile=False), evaluation=EvaluationSpec(baselines=False),
            source=type(self).__name__))

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
        from ..engines.local import LocalFederation
        from fedtab.federation.workflows.imputation import validate_site_table
        from fedtab.federation.site.core import Site
        from ..privacy.policy import policy_from_config

        named = site_tables(tables)
        if not 0 <= self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in [0, 1), got {self.validation_fraction}")
        spec = self.job_spec(list(named))
        sites = []
        for name, t in named.items():
            validate_site_table(t, name)
            min_rows = policy_from_config(self.policy).min_rows
            if len(t) < min_rows:  # refused by every site's policy anyway: say so before any work
                raise ValueError(f"site {name!r}: {len(t)} sample(s), fewer than the disclosure policy's "
                                 f"min_rows={min_rows} (pass policy={{'min_rows': k}} to accept smaller sites)")
            t = t.copy()
            t.columns = [str(c) for c in t.columns]
            test_size = self.validation_fraction if len(t) >= 10 else 0.0
            sites.append(Site(name, t.astype(np.float64), test_size=test_size, seed=self.seed, policy=self.policy))
        self._fit_on(LocalFederation(sites), spec, progress)
        self.site_names_ = list(named)
        given = [tables] if is_single(tables) else list(tables.values() if isinstance(tables, Mapping) else tables)
        if all(isinstance(t, pd.DataFrame) and all(isinstance(c, str) for c in t.columns) for t in given):
            self.feature_names_in_ = np.asarray(self.columns_, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    def fit_federation(self, federation: Any, progress: Callable[[int, int, dict], None] | None = None,
                       ) -> "FederatedImputer":
        """Learn the imputer over an existing federation (any engine's, or one built by hand).

        The sites must answer the ``impute_*`` requests (every
        :class:`~fedtab.federation.site.core.Site` does); their ``test_size`` rows are the
        validation rows. ``validation_fraction`` is not used here.

        Raises:
            ValueError: invalid settings. fedtab.federation.protocol.FederationError: as in :meth:`fit`.
        """
        self._fit_on(federation, self.job_spec(list(federation.sites)), progress)
        self.site_names_ = list(federation.sites)
        self.feature_names_in_ = np.asarray(self.columns_, dtype=object)  # site columns are named
        return self

    def _fit_on(self, federation: Any, spec: "JobSpec", progress: Callable[[int, int, dict], None] | None) -> None:
        from ..impute.model import GNNImputer, GNNConfig, graph_tensors, numpy_to_state
        from ..job.outputs import Outputs
        from ..job.workflow import run_workflow

        out = run_workflow(federation, spec, outputs=Outputs(hooks={"imputation": progress} if progress else {}))
        result = out.outcomes["imputation"]
        self.job_result_ = {k: out.result[k] for k in ("steps", "privacy", "trust", "participation")}
        self.result_ = result
        self.columns_ = list(result.columns)
        self.n_features_in_ = len(self.columns_)
        self.mean_ = result.mean
        self.std_ = result.std
        self.graph_ = result.graph
        self.history_ = result.history
        self.validation_ = result.validation
        self.site_columns_ = result.site_columns
        self.model_ = GNNImputer(GNNConfig(**result.model_config))
        numpy_to_state(self.model_, result.weights)
        if self.model_.config.prior_rank > 0:
            self.model_.set_prior(result.prior_W, result.prior_psi)
        self.model_.eval()
        self._adj = graph_tensors(result.graph)
        self.levels_ = self._levels(federation, spec)

    def _levels(self, federation: Any, spec: "JobSpec") -> dict[str, list[float]]:
        """The agreed value sets of the integer-coded columns (one ``job_profile`` exchange).

        Raises:
            ValueError: a ``categorical`` column that is not integer-coded at the sites.
        """
        wanted = list(self.categorical or [])
        if not (self.integer_codes or wanted):
            return {}
        if spec.privacy.private:
            if wanted:
                raise ValueError("categorical columns need the sites' value sets, which a private fit "
                                 "(secure_aggregation or dp) does not release")
            return {}
        from fedtab.federation.steps.profile import pooled_levels, profile_sites

        levels = pooled_levels(profile_sites(federation))
        missing = [c for c in wanted if c not in levels]
        if missing:
            raise ValueError(f"categorical columns {missing[:5]} are not integer codes with at most 20 values "
                             "held in enough rows at the sites")
        return {c: v for c, v in levels.items() if self.integer_codes or c in wanted}

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise ImputerNotFittedError("this FederatedImputer is not fitted yet; call fit(tables) first")

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # NaN = a cell to impute
        tags.requires_fit = True
        return tags

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        """The global schema (``columns_``): ``transform`` returns every column.

        Raises:
            NotFittedError: not fitted. ValueError: ``input_features`` not the fitted columns.
        """
        self._check_fitted()
        if input_features is not None and [str(c) for c in input_features] != self.columns_:
            raise ValueError(f"input_features must be the {len(self.columns_)} fitted columns in order")
        return np.asarray(self.columns_, dtype=object)

    def predict_z(self, table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Model output for ``table``: ``(pred, given)``, both (n, F) in z-space over
        ``columns_``; ``given`` holds the z-scored input (NaN where not given)."""
        from ..impute.train import predict

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
        raw, available = self._given(table, cols)
        given = (raw - self.mean_) / self.std_
        pred = predict(self.model_, given, available, self._adj) if len(table) else np.zeros((0, len(self.columns_)))
        return pred, given

    def _given(self, table: pd.DataFrame, cols: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(raw, available)``: ``table`` (whose columns ``cols`` are fitted columns) over
        ``columns_`` in original units, NaN where not given, ``(n, F)``; ``(F,)`` bool, the
        columns it has."""
        pos = {c: i for i, c in enumerate(self.columns_)}
        raw = np.full((len(table), len(self.columns_)), np.nan)
        idx = [pos[c] for c in cols]
        raw[:, idx] = table.to_numpy(dtype=np.float64, na_value=np.nan)
        available = np.zeros(len(self.columns_), dtype=bool)
        available[idx] = True
        return raw, available

    def transform(self, table: Any) -> Any:
        """``table`` over the global schema (``columns_``), original units, no NaN left; every
        cell ``table`` holds is copied from it bit for bit (never through the z-scoring).

        A DataFrame (any subset of the fitted columns) gives a DataFrame; a 2-D array
        (``n_features_in_`` columns, global order) gives an array. The columns a
        DataFrame lacks are structurally unavailable there; an array holds every column,
        so its NaN cells are missing cells of available columns.

        Raises:
            NotFittedError: not fitted. ValueError: a column unknown to the fit,
            non-numeric/complex/infinite values, or an array of the wrong width.
            TypeError: sparse input.
        """
        self._check_fitted()
        if not isinstance(table, pd.DataFrame):
            from sklearn.utils.validation import validate_data

            X = validate_data(self, table, reset=False, dtype=np.float64, ensure_all_finite="allow-nan")
            return self.transform(pd.DataFrame(X, columns=self.columns_)).to_numpy()
        if any(pd.api.types.is_complex_dtype(t) for t in table.dtypes):
            raise ValueError("Complex data not supported")
        from ..impute.fill import fill_from_predictions

        pred, given = self.predict_z(table)
        if np.isinf(given).any():
            raise ValueError("the table contains infinite values")
        raw, _ = self._given(table, [str(c) for c in table.columns])  # observed cells exactly as given
        unbounded = np.full(len(self.columns_), np.inf)
        pos = {c: j for j, c in enumerate(self.columns_)}
        values, _, _ = fill_from_predictions(raw, pred, self.mean_, self.std_, -unbounded,
                                             unbounded, np.zeros(len(self.columns_), bool),
                                             {pos[c]: v for c, v in getattr(self, "levels_", {}).items()})
        return pd.DataFrame(values, columns=self.columns_, index=table.index)

    def imputed_mask(self, table: pd.DataFrame) -> pd.DataFrame:
        """Which cells :meth:`transform` fills: ``True`` where ``table`` has no value (a missing
        cell, or a column it lacks), over ``columns_``, same index.

        Raises:
            NotFittedError: not fitted. ValueError: not a DataFrame, or a column unknown to the fit.
        """
        self._check_fitted()
        if not isinstance(table, pd.DataFrame):
            raise ValueError(f"imputed_mask expects a DataFrame, got {type(table).__name__}")
        unknown = [str(c) for c in table.columns if str(c) not in self.columns_]
        if unknown:
            raise ValueError(f"columns {unknown[:8]} were not seen in fit")
        given = table.rename(columns=str).reindex(columns=self.columns_)
        return given.isna()

    def fit_transform(self, tables: Any, y: Any = None, **kw: Any) -> Any:
        """Fit, then transform every site table (a list or dict like the input; one
        table -> one table, an array for an array)."""
        self.fit(tables, **kw)
        if is_single(tables):
            return self.transform(tables if isinstance(tables, pd.DataFrame) else site_tables(tables)["site0"]
                                  .to_numpy())
        named = site_tables(tables)
        out = {k: self.transform(t) for k, t in named.items()}
        return out if isinstance(tables, Mapping) else list(out.values())
