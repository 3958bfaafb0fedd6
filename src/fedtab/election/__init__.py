"""Feature Election: federated feature selection by a sample-weighted vote."""

from .ballot import Ballot
from .rule import AGGREGATIONS, NORMALIZATIONS, ElectionResult
from .tally import ElectionTally, elect, elect_ballots
from .compat import COMPATS


_SELECTOR_NAMES = ("SELECTORS", "Selection", "Selector", "make_selector")


def __getattr__(name: str):
    # the selectors and the front door import scikit-learn: loaded on first use only
    if name == "FederatedFeatureElection":  # the old path of the front door (fedtab.estimators)
        from ..estimators import FederatedFeatureElection

        return FederatedFeatureElection
    if name in _SELECTOR_NAMES:
        from . import selectors

        return getattr(selectors, name)
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
