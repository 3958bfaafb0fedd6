"""The job's steps, one module each, in run order (:data:`STEPS`).

Each step is a :class:`Step`: a name (its row in ``result["steps"]``), ``needed(spec, out)``
(a step the job does not need is skipped and costs no exchange) and ``run(federation, spec,
out)``, which reads the :class:`~fedtab.job.spec.JobSpec` and the outputs so far
(:class:`~fedtab.job.outputs.Outputs`) and adds its own. The steps are the only place that
turns the spec's settings into the workflows' keyword arguments (secure aggregation, DP,
robust mode, ``min_holders``); the quorum and the timeout are set once per run by
:func:`fedtab.job.guarantees.apply_trust`.
"""

from __future__ import annotations

from .step import Step

__all__ = ["STEPS", "Step"]


def _steps() -> tuple[Step, ...]:
    from . import categories, election, evaluation, imputation, schema, score_test, selection, training, tuning

    return (schema.STEP, categories.STEP, imputation.STEP, tuning.STEP, election.STEP, score_test.STEP,
            selection.STEP, training.STEP, evaluation.BASELINES, evaluation.ALL_COLUMNS)


#: schema → categories → imputation (never the label) → tuning → election or score test (or, with
#: ``tune = "cv"``, the selection in place of tuning, election and training) → training (with the
#: final evaluation) → baselines → all-columns comparison
STEPS: tuple[Step, ...] = _steps()
