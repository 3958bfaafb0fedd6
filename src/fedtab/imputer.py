"""The old import path of :class:`~fedtab.estimators.FederatedImputer` (kept: ``from fedtab.imputer
import FederatedImputer`` still works); the estimators live in :mod:`fedtab.estimators`."""

from .estimators.imputer import FederatedImputer, ImputerNotFittedError

__all__ = ["FederatedImputer", "ImputerNotFittedError"]
