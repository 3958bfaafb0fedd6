"""Sites, messages and the server-side workflows (engine-independent).

Names are resolved on first access (PEP 562): ``import fedtab.federation.messages`` (a
Flower ClientApp process does, for every message) costs only that module, not every
workflow and pandas. A site imports the workflow module of a request's kind when it first
sees one (:func:`fedtab.federation.site.find_handler`); :func:`register_all` imports all of
them (every handler and table step registered).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> submodule that defines it
_EXPORTS = {
    "ElectionOutcome": "election_flow",
    "broadcast_mask": "election_flow",
    "elect_from_ballots": "election_flow",
    "gather_ballots": "election_flow",
    "run_election": "election_flow",
    "Message": "messages",
    "MessageError": "messages",
    "Federation": "protocol",
    "FederationError": "protocol",
    "QuorumError": "protocol",
    "SiteError": "protocol",
    "SiteRefused": "protocol",
    "exchange": "protocol",
    "Schema": "schema",
    "agree_schema": "schema",
    "HANDLERS": "site",
    "Site": "site",
    "handler": "site",
    "TrainingOutcome": "training_flow",
    "run_training": "training_flow",
    "TuneOutcome": "tuning_flow",
    "tune_flow": "tuning_flow",
    "federated_one_hot": "encoding_flow",
    "run_baselines": "baseline_flow",
    "run_pooled_anova": "pooled_anova_flow",
    "PooledScoreTest": "score_test_flow",
    "run_pooled_score_test": "score_test_flow",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedtab.federation' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


def register_all() -> None:
    """Import every workflow module, registering all handlers and table steps (the
    imputation module only when torch is installed)."""
    from .site import HANDLER_HOMES

    for module in HANDLER_HOMES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            if "torch" not in str(exc):
                raise


__all__ = [
    "ElectionOutcome",
    "Federation",
    "FederationError",
    "HANDLERS",
    "Message",
    "MessageError",
    "PooledScoreTest",
    "QuorumError",
    "Schema",
    "SiteError",
    "agree_schema",
    "exchange",
    "Site",
    "SiteRefused",
    "TrainingOutcome",
    "broadcast_mask",
    "elect_from_ballots",
    "gather_ballots",
    "handler",
    "register_all",
    "run_election",
    "run_baselines",
    "run_pooled_anova",
    "run_pooled_score_test",
    "run_training",
]
