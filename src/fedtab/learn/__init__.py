"""Federated models (FedAvg and exact aggregation), metrics and accounting.

Models (by name in :data:`MODELS`): ``logistic`` (L-BFGS + FedAvg/FedProx), ``sgd``
(log-loss mini-batch SGD + FedAvg), ``gnb`` (Gaussian Naive Bayes, exact aggregation of
class counts/sums/sums of squares), ``mlp`` (PyTorch, imported lazily, + FedAvg).
"""

from .accounting import communication_report, param_reduction, round_cost, traffic_summary
from .gnb import GaussianNBModel, gnb_from_statistics, gnb_statistics
from .metrics import confusion, scores_from_confusion
from .mlp import MLPModel
from .models import MODELS, FederatedModel, LogisticRegressionModel, fedavg, make_model
from .sgd import SGDClassifierModel

for _cls in (GaussianNBModel, SGDClassifierModel, MLPModel):
    MODELS.setdefault(_cls.name, _cls)

__all__ = [
    "MODELS",
    "FederatedModel",
    "GaussianNBModel",
    "LogisticRegressionModel",
    "MLPModel",
    "SGDClassifierModel",
    "communication_report",
    "confusion",
    "fedavg",
    "gnb_from_statistics",
    "gnb_statistics",
    "make_model",
    "param_reduction",
    "round_cost",
    "scores_from_confusion",
    "traffic_summary",
]
