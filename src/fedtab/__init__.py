"""fedtab: federated feature election, imputation and training on tabular data.

Rows never leave their site: sites send ballots, statistics and model parameters.
``import fedtab`` needs only numpy/pandas/scikit-learn; PyTorch, Flower and NVIDIA
FLARE are optional extras used by the capabilities that need them.
"""

import importlib

__version__ = "0.1.0"

# Resolved on first access (PEP 562), so ``import fedtab.<sub>`` costs only what that
# submodule needs: a Flower ClientApp process, started anew for every message, must not
# pay for pandas/scikit-learn/scipy unless the step uses them. FederatedImputer needs torch.

_EXPORTS = {
    "ElectionResult": ".election", "ElectionTally": ".election", "elect": ".election", "elect_ballots": ".election",
    "LocalFederation": ".engines.local", "Message": ".federation", "Site": ".federation",
    "run_election": ".federation", "run_training": ".federation",
    "FederatedImputer": ".estimators", "FederatedFeatureElection": ".estimators",  # import scikit-learn
    "run_job": ".job.run", "load_model": ".job.model_file",  # the consortium job (docs/job.md)
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedtab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


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
    "load_model",
    "run_election",
    "run_job",
    "run_training",
    "__version__",
]
