"""The imputation's settings from the job's ``[impute]`` (:func:`impute_config`), in a module of its own:
the imputation step runs with them and the spec's parser validates them (``[impute]``), and this
module imports neither (a step module turns the spec's settings into a workflow's arguments)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtab.federation.workflows.imputation import ImputeConfig

    from ..spec import JobSpec

__all__ = ["impute_config"]


def impute_config(spec: "JobSpec") -> "ImputeConfig":
    """The :class:`~fedtab.federation.workflows.imputation.ImputeConfig` of ``spec`` (its ``[impute]`` and the
    run's seed; robust mode, secure sums and DP are the run's options, not the config's)."""
    from fedtab.federation.workflows.imputation import ImputeConfig

    assert spec.impute is not None
    settings = asdict(spec.impute)
    settings["use_prior"] = settings.pop("prior")
    return ImputeConfig(**settings, seed=spec.run.seed)
