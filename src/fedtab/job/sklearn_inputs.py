"""A model file's input preparation as a scikit-learn transformer (the first step of ``to_sklearn()``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, TransformerMixin

__all__ = ["ModelInputs"]


class ModelInputs(TransformerMixin, BaseEstimator):
    """Schema columns in, the model's :attr:`~fedtab.job.model_file.FedtabModel.features` out.

    ``transform`` is :meth:`FedtabModel.model_inputs <fedtab.job.model_file.FedtabModel.model_inputs>`
    with the cells it leaves missing set to the federation's mean (so the scaler after it gives
    0, as the model does). Fitted when built: ``fit`` learns nothing.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def fit(self, X: pd.DataFrame, y: Any = None) -> "ModelInputs":
        """Nothing to learn: the federation fitted it."""
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return True

    def transform(self, X: pd.DataFrame) -> pd.DataFrame:
        """``(n, len(features))`` encoded (and, with an imputer, filled) features of ``X``."""
        out = self.model.model_inputs(X)
        mean = pd.Series(self.model.arrays["standardise/mean"], index=out.columns)
        return out.fillna(mean)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        return np.asarray(self.model.features, dtype=object)
