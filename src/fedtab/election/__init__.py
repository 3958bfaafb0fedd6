"""Feature Election: federated feature selection by a sample-weighted vote."""

from .ballot import Ballot
from .rule import AGGREGATIONS, NORMALIZATIONS, ElectionResult, elect, elect_ballots
from .selectors import SELECTORS, Selection, Selector, make_selector
from .tally import ElectionTally
from .compat import COMPATS


def __getattr__(name: str):
    # the scikit-learn front door imports scikit-learn: loaded on first use only
    if name == "FederatedFeatureElection":
        from .estimator import FederatedFeatureElection

        return FederatedFeatureElection
    raise AttributeError(f"module 'fedtab.election' has no attribute {name!r}")


__all__ = [
    "AGGREGATIONS",
    "NORMALIZATIONS",
    "Ballot",
    "COMPATS",
    "FederatedFeatureElection",
    "ElectionResult",
    "ElectionTally",
    "SELECTORS",
    "Selection",
    "Selector",
    "elect",
    "elect_ballots",
    "make_selector",
]
