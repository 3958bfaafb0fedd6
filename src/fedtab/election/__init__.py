"""Feature Election: federated feature selection by a sample-weighted vote."""

from .ballot import Ballot
from .rule import AGGREGATIONS, NORMALIZATIONS, ElectionResult, elect, elect_ballots
from .selectors import SELECTORS, Selection, Selector, make_selector
from .tally import ElectionTally

__all__ = [
    "AGGREGATIONS",
    "NORMALIZATIONS",
    "Ballot",
    "ElectionResult",
    "ElectionTally",
    "SELECTORS",
    "Selection",
    "Selector",
    "elect",
    "elect_ballots",
    "make_selector",
]
