"""The consortium job: a job file -> steps in order on one engine -> model file, result, report.

``load_job`` / ``parse_job`` validate the job file (``docs/job.md`` lists its keys).
"""

from .spec import JobError, JobSpec, load_job, parse_job

__all__ = ["JobError", "JobSpec", "load_job", "parse_job"]
