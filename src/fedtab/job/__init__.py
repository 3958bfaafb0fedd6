"""The consortium job: a job file -> steps in order on one engine -> model file, result, report.

``load_job`` / ``parse_job`` validate the job file (``docs/job.md`` lists its keys) into a
:class:`JobSpec`, the only settings object; ``spec_from_plan`` reads the plan an engine's run
config carries; ``check_spec`` validates a spec built in code. The one step loop is
:func:`fedtab.job.workflow.run_workflow`; :func:`fedtab.job.run.run_job` runs a job on an engine
and writes its outputs.
"""

from .spec import JobError, JobSpec, check_spec, load_job, parse_job, spec_from_plan

__all__ = ["JobError", "JobSpec", "check_spec", "load_job", "parse_job", "spec_from_plan"]
