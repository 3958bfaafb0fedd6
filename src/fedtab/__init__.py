"""fedtab: federated feature election, imputation and training on tabular data.

Rows never leave their site: sites send ballots, statistics and model parameters.
``import fedtab`` needs only numpy/pandas/scikit-learn; PyTorch, Flower and NVIDIA
FLARE are optional extras used by the capabilities that need them.
"""

from .election import ElectionResult, ElectionTally, elect, elect_ballots
from .engines.local import LocalFederation
from .federation import Message, Site, run_election, run_training

__version__ = "0.1.0"


def __getattr__(name: str):
    # FederatedImputer needs torch (an optional extra): imported on first use only.
    if name == "FederatedImputer":
        from .imputer import FederatedImputer

        return FederatedImputer
    if name == "FederatedFeatureElection":  # imports scikit-learn: on first use only
        from .election.estimator import FederatedFeatureElection

        return FederatedFeatureElection
    raise AttributeError(f"module 'fedtab' has no attribute {name!r}")

__all__ = [
    "ElectionResult",
    "ElectionTally",
    "FederatedFeatureElection",
    "FederatedImputer",
    "LocalFederation",
    "Message",
    "Site",
    "elect",
    "elect_ballots",
    "run_election",
    "run_training",
    "__version__",
]
