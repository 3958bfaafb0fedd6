"""Sites, messages and the server-side workflows (engine-independent).

Names are resolved on first access (PEP 562): ``import fedtab.federation.protocol.messages`` (a
Flower ClientApp process does, for every message) costs only that module, not every
workflow and pandas. A site imports the workflow module of a request's kind when it first
sees one (:func:`fedtab.federation.site.registry.find_handler`); :func:`register_all` imports all of
them (every handler and table step registered).
"""

from __future__ import annotations

import importlib

from fedtab._lazy import lazy_exports

#: public name -> submodule that defines it
_EXPORTS = {
    "ElectionOutcome": "workflows.election.server",
    "broadcast_mask": "workflows.election.server",
    "elect_from_ballots": "workflows.election.server",
    "gather_ballots": "workflows.election.server",
    "run_election": "workflows.election.server",
    "Message": "protocol.messages",
    "MessageError": "protocol.messages",
    "Federation": "protocol",
    "FederationError": "protocol",
    "QuorumError": "protocol",
    "SiteError": "protocol",
    "SiteRefused": "protocol",
    "exchange": "protocol",
    "Schema": "protocol.schema",
    "agree_schema": "protocol.agreement",
    "HANDLERS": "site.core",
    "Site": "site.core",
    "handler": "site.core",
    "TrainingOutcome": "workflows.training",
    "run_training": "workflows.training",
    "TuneOutcome": "workflows.tuning.server",
    "tune_flow": "workflows.tuning.server",
    "federated_one_hot": "steps.encoding",
    "run_baselines": "steps.baselines",
    "run_pooled_anova": "workflows.pooled_anova.server",
    "PooledScoreTest": "workflows.score_test.server",
    "run_pooled_score_test": "workflows.score_test.server",
}


__getattr__, __dir__ = lazy_exports(__name__, {name: f".{module}" for name, module in _EXPORTS.items()})


def register_all() -> None:
    """Import every workflow module, registering all handlers and table steps (the
    imputation module only when torch is installed)."""
    from fedtab.federation.site.core import HANDLER_HOMES

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
