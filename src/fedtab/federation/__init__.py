"""Sites, messages and the server-side workflows (engine-independent).

Importing this package registers every site-side handler.
"""

from . import election_flow, secure_flow, training_flow  # noqa: F401  (registers handlers)
from .election_flow import ElectionOutcome, broadcast_mask, elect_from_ballots, gather_ballots, run_election
from .messages import Message, MessageError
from .protocol import Federation, FederationError, QuorumError, SiteError, SiteRefused, collect, exchange
from .schema import Schema, agree_schema
from .site import HANDLERS, Site, handler
from .training_flow import TrainingOutcome, run_training
from .tuning_flow import TuneOutcome, tune_flow  # noqa: F401  (registers the tuning handlers)
from .encoding_flow import federated_one_hot  # noqa: F401  (registers the one-hot handlers)
from .baseline_flow import run_baselines  # noqa: F401  (registers the local-baseline handler)
from .pooled_anova_flow import run_pooled_anova  # noqa: F401  (registers the class-moments handler)
from . import profile_flow  # noqa: F401  (registers the column-profile handler)

try:  # registered when the imputation capability is present
    from . import impute_flow  # noqa: F401
except ImportError as _exc:  # pragma: no cover - only while impute is absent or torch is missing
    if "impute_flow" not in str(_exc) and "torch" not in str(_exc):
        raise

__all__ = [
    "ElectionOutcome",
    "Federation",
    "FederationError",
    "HANDLERS",
    "Message",
    "MessageError",
    "QuorumError",
    "Schema",
    "SiteError",
    "agree_schema",
    "exchange",
    "Site",
    "SiteRefused",
    "TrainingOutcome",
    "broadcast_mask",
    "collect",
    "elect_from_ballots",
    "gather_ballots",
    "handler",
    "run_election",
    "run_baselines",
    "run_pooled_anova",
    "run_training",
]
