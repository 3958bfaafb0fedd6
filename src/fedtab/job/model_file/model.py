"""The model front door: :class:`FedtabModel` (what :func:`~fedtab.job.model_file.load_model`
returns) predicts on a DataFrame with the schema's columns, checks a table first
(:class:`InputCheck`) and exports to scikit-learn or XGBoost.

Categories are one-hot encoded with the agreed lists, the imputer (if any) fills missing cells and
absent columns exactly as the sites filled theirs (an integer code to the nearest value of its
agreed set, a missing category to exactly one category), then the standardisation and the model;
``site=NAME`` applies that site's personalised model (``fedtab predict --site NAME``), without it
the pooled federated model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .checks import check_imputer_weights
from .format import ModelFileError, PredictionError, PredictionWarning, gbdt_model

__all__ = ["FedtabModel", "InputCheck", "probe_rows"]


def _names(columns: list[str], limit: int = 10) -> str:
    shown = ", ".join(repr(c) for c in columns[:limit])
    return shown + (f" and {len(columns) - limit} more" if len(columns) > limit else "")


@dataclass(frozen=True)
class InputCheck:
    """What :meth:`FedtabModel.check` finds in a table before it is scored.

    Attributes:
        rows: the table's rows.
        missing: schema columns the model reads that the table lacks (schema order).
        unknown: ``{table column: closest model column or None}`` for columns the model does
            not know (the job's target is not reported).
        filled: ``{column the model reads: cells to fill}`` (an absent column: every row).
        uncoded: ``{categorical column: missing cells}``, encoded as no category, as in training
            (a model without an imputer; with one they are :attr:`filled` with one category).
        unseen: ``{categorical column: {category: rows}}`` for categories outside the model's list.
        other_level: ``{column of unseen: whether the model has an "(other)" level for it}``.
        fill_method: how cells are filled (the imputer, the federation's mean, trees' default branch).
    """

    rows: int
    missing: list[str]
    unknown: dict[str, str | None]
    filled: dict[str, int]
    uncoded: dict[str, int]
    unseen: dict[str, dict[str, int]]
    other_level: dict[str, bool]
    fill_method: str

    def _unknown_text(self) -> str:
        return ", ".join(f"{c!r}" + (f" (did you mean {m!r}?)" if m else "") for c, m in self.unknown.items())

    def missing_message(self, option: str) -> str:
        """The error for :attr:`missing`, naming ``option`` as the way to fill them."""
        text = f"the table lacks {len(self.missing)} column(s) the model reads: {_names(self.missing)}"
        renamed = {c: m for c, m in self.unknown.items() if m in self.missing}
        if renamed:
            text += "; the table has " + ", ".join(f"{c!r} (did you mean {m!r}?)" for c, m in renamed.items())
        how = self.fill_method if self.fill_method.startswith("with the model's") else (
            f"{self.fill_method}: the model has no imputer")
        return f"{text}. {option} fills them {how}"

    def warnings(self) -> list[str]:
        """One line per finding: unknown columns, filled cells, categories outside the lists."""
        out = []
        if self.unknown:
            out.append(f"{len(self.unknown)} column(s) the model does not know, ignored: {self._unknown_text()}")
        if self.filled:
            per = ", ".join(f"{c} {n}" + (" (absent)" if c in self.missing else "") for c, n in self.filled.items())
            out.append(f"filled {sum(self.filled.values())} missing cell(s) of {self.rows} row(s) "
                       f"{self.fill_method}: {per}")
        if self.uncoded:
            per = ", ".join(f"{c} {n}" for c, n in self.uncoded.items())
            out.append(f"{sum(self.uncoded.values())} missing cell(s) of categorical column(s) encoded as no "
                       f"category, as in training: {per}")
        for c, counts in self.unseen.items():
            level = "its '(other)' level" if self.other_level.get(c) else "no category (the model has no '(other)')"
            out.append(f"column {c!r}: {sum(counts.values())} row(s) with a category rare in training or new "
                       f"({_names(list(counts), 5)}) encoded as {level}")
        return out


#: standard deviations from the mean the probe rows of :meth:`FedtabModel.check_predictions` sit at
PROBE_SD = (1.0, 5.0)
#: features probed one at a time (all of them together in every case)
PROBE_FEATURES = 64


def probe_rows(d: int) -> np.ndarray:
    """``(n, d)`` standardised probe rows: zeros (the mean row); for the first
    :data:`PROBE_FEATURES` features, each alone at ``±s``; all features at ``±s`` with the same
    sign and with alternating signs (both phases), for each ``s`` in :data:`PROBE_SD`."""
    rows = [np.zeros(d)]
    k = min(d, PROBE_FEATURES)
    alternating = np.where(np.arange(d) % 2 == 0, 1.0, -1.0)
    for sd in PROBE_SD:
        for sign in (1.0, -1.0):
            unit = np.zeros((k, d))
            unit[np.arange(k), np.arange(k)] = sign * sd
            rows.extend([*unit, np.full(d, sign * sd), sign * sd * alternating])
    return np.vstack(rows) if d else np.zeros((1, 0))



def _label(value: str) -> Any:
    try:
        f = float(value)
    except ValueError:
        return value
    return int(f) if f.is_integer() else f


@dataclass
class _Imputer:
    columns: list[str]
    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    integer: np.ndarray
    #: the network, run in numpy (:class:`.imputer_net.NumpyImputerNet`)
    model: Any
    #: by column index, as :func:`fedtab.impute.fill.fill_from_predictions` takes them
    levels: dict[int, list[float]]
    groups: list[list[int]]


class FedtabModel:
    """A trained job's model, read from a model file by :func:`load_model`.

    Attributes:
        features: the columns the model reads (elected, after one-hot encoding).
        classes: the class labels, in the order of ``predict_proba``'s columns.
        input_columns: the schema's columns (before encoding) a table may hold.
        reads: those of them behind :attr:`features` (a table must hold them, or be filled).
        provenance: fedtab version, job, sites, engine, date.
    """

    def __init__(self, manifest: dict[str, Any], arrays: dict[str, np.ndarray], source: str = "<memory>") -> None:
        from ...learn.models import make_model

        self.manifest, self.arrays, self.source = manifest, arrays, source
        self.features: list[str] = list(manifest["features"])
        self.classes: list[Any] = [_label(c) for c in manifest["classes"]]
        #: a regression model (no classes): :meth:`predict` returns numbers, :meth:`predict_proba` refuses
        self.regression: bool = not self.classes
        self.schema: dict[str, Any] = manifest["schema"]
        self.input_columns: list[str] = list(self.schema["columns"])
        self.provenance: dict[str, Any] = dict(manifest.get("provenance", {}))
        self._model = make_model(manifest["model"])
        self._params = {k[len("model/"):]: a for k, a in arrays.items() if k.startswith("model/")}
        self._imputer: _Imputer | None = None
        self._trees = gbdt_model(manifest, arrays) if self._model.name == "gbdt" else None
        from ...data.categories import onehot_name

        cats = self.schema.get("categories", {})
        behind = {onehot_name(c, v): c for c, vs in cats.items() for v in vs}
        wanted = {behind.get(f, f) for f in self.features}
        self.reads: list[str] = [c for c in self.input_columns if c in wanted]
        pers = manifest.get("personalisation") or {}
        self.personalisation: str | None = pers.get("mode")
        #: the sites with a personalised model (``predict_proba(..., site=NAME)``); empty without one
        self.sites: list[str] = list(pers.get("sites") or [])

    @property
    def has_imputer(self) -> bool:
        return self.manifest.get("imputer") is not None

    def _imputer_live(self) -> _Imputer:
        if self._imputer is None:
            from ...impute.graph import FeatureGraph
            from .imputer_net import NumpyImputerNet, net_config

            im, a = self.manifest["imputer"], self.arrays

            def fail(msg: str) -> None:
                raise ModelFileError(f"{self.source}: {' '.join(str(msg).split())}")

            check_imputer_weights(im, a, fail)
            graph = FeatureGraph(im["columns"], a["imputer/edge_index"], a["imputer/weight"], a["imputer/sign"])
            cfg = net_config(im["model_config"])
            try:  # numpy, not torch: importing torch would be most of ``fedtab predict``'s time
                net = NumpyImputerNet(cfg, {k[len("imputer/w/"):]: v for k, v in a.items() if k.startswith("imputer/w/")},
                                      graph.edge_index, graph.sign * graph.weight,
                                      (a["imputer/prior_W"], a["imputer/prior_psi"]) if cfg.prior_rank > 0 else None)
            except ValueError as exc:
                fail(f"imputer: {exc}")
            pos = {c: j for j, c in enumerate(im["columns"])}
            self._imputer = _Imputer(im["columns"], a["imputer/mean"], a["imputer/std"], a["imputer/low"],
                                     a["imputer/high"], a["imputer/integer"], net,
                                     {pos[c]: list(v) for c, v in (im.get("levels") or {}).items()},
                                     [[pos[c] for c in g] for g in im.get("groups") or ()])
        return self._imputer

    # ----- the table -> model input -------------------------------------------------
    def _encoded(self, table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, dict[str, int]]]:
        """``(encoded, unseen)``: numeric columns checked, categorical columns one-hot encoded
        (absent columns left out); ``unseen[column][value]`` counts the rows whose category is
        not in the model's list, encoded as its ``(other)`` level (all zeros without one). A
        missing categorical cell is, as in the job: NaN in each indicator when the model has an
        imputer (which gives the row one category), all zeros (no category) without one."""
        from ...data.categories import category_key, onehot_name
        from ...privacy.policy import OTHER_CATEGORY

        if not isinstance(table, pd.DataFrame):
            raise PredictionError(f"expected a pandas DataFrame, got {type(table).__name__}")
        cats = self.schema.get("categories", {})
        parts, unseen = {}, {}
        for c in self.input_columns:
            if c not in table.columns:
                continue
            col = table[c]
            if c in cats:
                observed = col.notna().to_numpy()
                strings = col[observed].map(category_key)  # 7.0 read from a file is the code "7"
                new = ~strings.isin(cats[c])
                if new.any():  # rare in training (merged into "(other)" there) or never seen
                    unseen[c] = {str(k): int(v) for k, v in strings[new].value_counts().items()}
                    strings = strings.where(~new, OTHER_CATEGORY)
                index = {v: i for i, v in enumerate(cats[c])}
                block = np.zeros((len(table), len(cats[c]) + 1))  # the last column: no level
                if self.has_imputer:
                    block[~observed] = np.nan
                block[np.flatnonzero(observed), [index.get(v, len(cats[c])) for v in strings]] = 1.0
                for i, v in enumerate(cats[c]):
                    parts[onehot_name(c, v)] = block[:, i]
                continue
            values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.flatnonzero((np.isnan(values) & col.notna().to_numpy()) | np.isinf(values))
            if len(bad):
                pos = int(bad[0])
                raise PredictionError(f"row {pos + 1}, column {c!r}: value {col.iloc[pos]!r} is not a finite number")
            parts[c] = values
        return pd.DataFrame(parts, index=range(len(table))), unseen

    def _fill_method(self) -> str:
        if self.has_imputer:
            return "with the model's imputer"
        if self._trees is not None:
            return "as missing (each tree's default branch)"
        return "with the federation's mean"

    def _check(self, table: pd.DataFrame, unseen: dict[str, dict[str, int]]) -> "InputCheck":
        import difflib

        from ...privacy.policy import OTHER_CATEGORY

        known = set(self.input_columns)
        target = (self.provenance.get("job") or {}).get("target")
        lower = {c.lower(): c for c in self.input_columns}
        unknown = {}
        for c in map(str, table.columns):
            if c in known or c == target:
                continue
            close = difflib.get_close_matches(c, self.input_columns, n=1, cutoff=0.6)
            unknown[c] = lower.get(c.lower()) or (close[0] if close else None)
        missing = [c for c in self.reads if c not in table.columns]
        cats = self.schema.get("categories", {})
        gaps = {c: len(table) if c not in table.columns else int(table[c].isna().sum()) for c in self.reads}
        # as in training: a missing categorical cell is filled by the imputer, without one encoded as no category
        coded = {c for c in cats if c not in missing and not self.has_imputer}
        return InputCheck(rows=len(table), missing=missing, unknown=unknown,
                          filled={c: n for c, n in gaps.items() if n and c not in coded},
                          uncoded={c: n for c, n in gaps.items() if n and c in coded},
                          unseen=unseen, other_level={c: OTHER_CATEGORY in cats.get(c, []) for c in unseen},
                          fill_method=self._fill_method())

    def check(self, table: pd.DataFrame) -> "InputCheck":
        """What :meth:`predict_proba` would find in ``table``: the model's columns it lacks,
        columns the model does not know (with the closest model column), cells to be filled and
        categories outside the model's lists. Reads the table only; nothing is imputed.

        Raises:
            PredictionError: not a DataFrame, or a value that cannot be used (row and column named).
        """
        return self._check(table, self._encoded(table)[1])

    def _impute(self, enc: pd.DataFrame, index: pd.Index) -> pd.DataFrame:
        from ...impute.fill import fill_from_predictions

        im = self._imputer_live()
        raw = np.full((len(enc), len(im.columns)), np.nan)
        available = np.zeros(len(im.columns), dtype=bool)
        for j, c in enumerate(im.columns):
            if c in enc.columns:
                raw[:, j] = enc[c].to_numpy()
                available[j] = True
        pred = im.model.predict((raw - im.mean) / im.std, available) if len(enc) else raw
        values, _, _ = fill_from_predictions(raw, pred, im.mean, im.std, im.low, im.high, im.integer, im.levels,
                                             im.groups)
        return pd.DataFrame(values, columns=im.columns, index=index)

    def transform(self, table: pd.DataFrame) -> pd.DataFrame:
        """``table`` as the model sees it before standardisation: categories one-hot encoded and,
        with an imputer, every missing cell and absent column filled (original units, clipped
        to the pooled observed range, integer columns rounded, integer-coded columns to their
        agreed value set, a missing category to one category); rows and order kept.

        Raises:
            PredictionError: as :meth:`predict_proba`.
        """
        enc, _ = self._encoded(table)
        if self.has_imputer:
            return self._impute(enc, table.index)
        enc.index = table.index
        return enc

    def model_inputs(self, table: pd.DataFrame) -> pd.DataFrame:
        """The :attr:`features` columns of ``table``, encoded, before standardisation; rows kept.

        A missing cell or absent column is filled by the imputer (its network run in numpy, only
        when a cell needs it; no torch either way), else left NaN (the federation's mean after
        standardisation; each tree's default branch for boosted trees). Warns nothing, checks
        nothing beyond the values: see :meth:`check`.
        """
        return self._features(self._encoded(table)[0], table.index)

    def _features(self, enc: pd.DataFrame, index: pd.Index) -> pd.DataFrame:
        present = [f for f in self.features if f in enc.columns]
        if self.has_imputer and (len(present) < len(self.features) or enc[present].isna().to_numpy().any()):
            enc = self._impute(enc, index)
        X = np.column_stack([enc[f].to_numpy(dtype=np.float64) if f in enc.columns else np.full(len(enc), np.nan)
                             for f in self.features])
        return pd.DataFrame(X, columns=self.features, index=index)

    def _standardised(self, X: np.ndarray) -> np.ndarray:
        if self._trees is not None:  # trees: raw values, a missing cell follows each split's default direction
            return X
        Z = (X - self.arrays["standardise/mean"]) / self.arrays["standardise/std"]
        Z[np.isnan(Z)] = 0.0  # as in training: a missing cell is the federation's mean
        return Z

    # ----- public API ---------------------------------------------------------------
    def site_params(self, site: str) -> dict[str, np.ndarray]:
        """Site ``site``'s personalised parameters (``{}`` in mode ``"none"``).

        Raises:
            PredictionError: the model has no per-site models, or none for ``site`` (naming the known ones).
        """
        if self.personalisation is None:
            raise PredictionError("this model has no per-site models (only a job with [election] tune = \"cv\" "
                                  "stores them); predict without a site for the pooled model")
        if site not in self.sites:
            raise PredictionError(f"unknown site {site!r}; the model has per-site models for: {', '.join(self.sites)}")
        i = self.sites.index(site)
        prefix = f"personal/{i}/"
        return {k[len(prefix):]: a for k, a in self.arrays.items() if k.startswith(prefix)}

    def predict_proba(self, table: pd.DataFrame, site: str | None = None, *,
                      allow_missing: bool | None = None) -> np.ndarray:
        """``(n, len(classes))`` class probabilities for the rows of ``table``, in order; with
        ``site``, of that site's personalised model (:attr:`sites`), else the pooled model.

        Columns are matched by name. A category outside the model's list (rare in training or
        new) is encoded as the model's ``(other)`` level (all zeros when the model has none), as
        scikit-learn's ``handle_unknown="infrequent_if_exist"``. Each finding of :meth:`check`
        (unknown columns with a did-you-mean, cells filled per column, unseen categories) is a
        :class:`PredictionWarning`.

        Args:
            allow_missing: whether columns the model reads may be absent (filled as
                :meth:`model_inputs` says). ``None``: only when the model has an imputer.

        Raises:
            PredictionError: the table lacks columns the model reads (listed, with did-you-mean)
                and ``allow_missing`` does not allow it, or a value cannot be used (naming the row
                and column); a site the model has no personalised model for (naming the known ones).
        """
        if self.regression:
            raise PredictionError("a regression model predicts numbers, not class probabilities: use predict")
        return self._proba(*self._inputs(table, site, allow_missing))

    def _inputs(self, table: pd.DataFrame, site: str | None, allow_missing: bool | None
                ) -> tuple[np.ndarray, Mapping[str, np.ndarray] | None]:
        """``(Z, own)``: the model's inputs for ``table`` and ``site``'s own parameters (as :meth:`predict_proba`)."""
        import warnings

        own = self.site_params(site) if site is not None else None

        enc, unseen = self._encoded(table)
        found = self._check(table, unseen)
        allowed = self.has_imputer if allow_missing is None else allow_missing
        if found.missing and not allowed:
            raise PredictionError(found.missing_message("allow_missing=True"))
        for message in found.warnings():
            warnings.warn(message, PredictionWarning, stacklevel=2)
        Z = self._standardised(self._features(enc, table.index).to_numpy(dtype=np.float64))
        return Z, own

    def _values(self, Z: np.ndarray) -> np.ndarray:
        """``(n,)`` predicted numbers of a regression model's inputs ``Z``."""
        if self._trees is not None:
            return np.asarray(self._trees.predict(Z), dtype=np.float64)
        return np.asarray(self._model.predict(self._params, Z), dtype=np.float64)

    def _proba(self, Z: np.ndarray, own: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """``(n, classes)`` probabilities of the model's inputs ``Z`` (standardised; raw for
        trees), of the personalised model with ``own`` (a site's parameters)."""
        from ...learn.personalise import personalised_proba

        if self._trees is not None:
            return np.asarray(self._trees.predict_proba(Z), dtype=np.float64)
        if own is not None and self.personalisation not in (None, "none"):
            return personalised_proba(str(self.personalisation), self._params, own, Z)
        return np.asarray(self._model.predict_proba(self._params, Z), dtype=np.float64)

    def check_predictions(self) -> None:
        """Refuse a model whose predictions are not finite probabilities on the probe rows
        (:func:`probe_rows`: the mean row, each feature at ±1 and ±5 standard deviations, all
        features together at ±1 and ±5 with the same and with alternating signs) -- e.g. a
        coefficient of 1e308, whose logits overflow to ``inf - inf``; for the pooled model and
        every site's personalised one.

        Raises:
            ValueError: one line naming the model (pooled or site) and the largest parameter.
        """
        import warnings

        mean, std = self.arrays["standardise/mean"], self.arrays["standardise/std"]
        X = probe_rows(len(self.features)) * std + mean
        Z = self._standardised(X)
        for site in [None, *self.sites]:
            own = None if site is None else self.site_params(site)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    if self.regression:
                        values = self._values(Z)
                        ok = bool(np.isfinite(values).all())
                        proba = None
                    else:
                        proba = self._proba(Z, own)
                    ok = ok if proba is None else bool(np.isfinite(proba).all() and np.all(proba >= 0)
                              and np.allclose(proba.sum(axis=1), 1.0, atol=1e-6))
                except (ValueError, FloatingPointError, OverflowError):
                    ok = False
            if not ok:
                params = {**self._params, **(own or {})}
                big = max(((float(np.abs(a).max()), k) for k, a in params.items()
                           if a.size and np.asarray(a).dtype.kind == "f"), default=(float("nan"), "?"))
                raise ValueError(f"the {'pooled model' if site is None else f'model of site {site!r}'} yields "
                                 f"non-finite probabilities (largest parameter |{big[1]}| = {big[0]:.3g})")

    def labels(self, proba: np.ndarray) -> np.ndarray:
        """The class label of each row of ``proba`` (its largest probability)."""
        return np.asarray(self.classes, dtype=object)[np.argmax(proba, axis=1)] if len(proba) else np.zeros(0)

    def to_xgboost(self):
        """An ``xgboost.Booster`` with the model's trees (``gbdt`` models; needs the xgboost extra).

        Its ``predict`` on :attr:`features` (``xgboost.DMatrix`` of the encoded columns, NaN for
        missing) equals :meth:`predict_proba`'s positive-class column (binary) or its rows
        (multiclass) within 1e-5.

        Raises:
            NotImplementedError: the model is not boosted trees.
        """
        if self._trees is None:
            raise NotImplementedError(f"model {self._model.name!r} is not boosted trees; to_xgboost needs 'gbdt'")
        return self._trees.to_xgboost()

    @property
    def trees(self) -> Any:
        """The :class:`~fedtab.learn.gbdt.GBDTModel` of a ``gbdt`` model (``None`` otherwise)."""
        return self._trees

    def predict(self, table: pd.DataFrame, site: str | None = None, *,
                allow_missing: bool | None = None) -> np.ndarray:
        """``(n,)`` predicted class labels for the rows of ``table``, in order (``site``,
        ``allow_missing``: as :meth:`predict_proba`). A regression model: ``(n,)`` predicted numbers."""
        if self.regression:
            return self._values(self._inputs(table, site, allow_missing)[0])
        return self.labels(self.predict_proba(table, site, allow_missing=allow_missing))

    def to_sklearn(self):
        """A fitted scikit-learn pipeline that predicts as :meth:`predict_proba` on the same tables.

        Steps: ``prepare`` (:class:`~fedtab.job.sklearn_inputs.ModelInputs`: the table's schema
        columns encoded with the agreed categories and, for a model with an imputer, its missing
        cells filled by that imputer (in numpy, no torch); cells it
        leaves missing become the federation's mean), ``standardise`` (the federation's
        mean/std) and ``model``: a ``LogisticRegression`` (models ``logistic``, ``sgd``) or
        ``GaussianNB`` (``gnb``) holding the federated parameters. Unlike :meth:`predict_proba`
        it fills absent columns without asking and warns nothing; run :meth:`check` first.

        Raises:
            NotImplementedError: for models without a scikit-learn equivalent (``mlp``, ``gbdt``:
                use :meth:`to_xgboost`), saying why.
        """
        from sklearn.linear_model import LogisticRegression
        from sklearn.naive_bayes import GaussianNB
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        from ..sklearn_inputs import ModelInputs

        name = self._model.name
        d = len(self.features)
        scaler = StandardScaler()
        scaler.mean_ = self.arrays["standardise/mean"].copy()
        scaler.scale_ = self.arrays["standardise/std"].copy()
        scaler.var_ = scaler.scale_**2
        scaler.n_features_in_ = d
        scaler.feature_names_in_ = np.asarray(self.features, dtype=object)
        scaler.n_samples_seen_ = 1
        classes = np.asarray(self.classes)
        if name in ("logistic", "sgd"):
            est = LogisticRegression()
            est.coef_ = np.asarray(self._params["coef"], np.float64).copy()
            est.intercept_ = np.asarray(self._params["intercept"], np.float64).copy()
        elif name == "gnb":
            est = GaussianNB()
            est.theta_ = np.asarray(self._params["theta"], np.float64).copy()
            est.var_ = np.asarray(self._params["var"], np.float64).copy()
            est.class_prior_ = np.exp(np.asarray(self._params["log_prior"], np.float64))
            est.class_count_ = est.class_prior_.copy()
            est.epsilon_ = 0.0
        elif name == "gbdt":
            raise NotImplementedError("model 'gbdt' is boosted trees, which scikit-learn cannot hold with the "
                                      "federation's splits; use to_xgboost(), or predict/predict_proba")
        else:
            raise NotImplementedError(f"model {name!r} is a neural network with no scikit-learn equivalent; use "
                                      "predict/predict_proba")
        est.classes_ = classes
        est.n_features_in_ = d
        return Pipeline([("prepare", ModelInputs(self)), ("standardise", scaler), ("model", est)])
