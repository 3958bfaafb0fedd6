"""Federated models (FedAvg and exact aggregation), metrics and accounting."""

from .metrics import confusion, scores_from_confusion
from .models import MODELS, FederatedModel, LogisticRegressionModel, fedavg, make_model

__all__ = [
    "MODELS",
    "FederatedModel",
    "LogisticRegressionModel",
    "confusion",
    "fedavg",
    "make_model",
    "scores_from_confusion",
]
