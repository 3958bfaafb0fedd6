"""The job's one error type, in a module of its own so that every part of the job (the spec, the
site-file checks, the steps) can raise it without importing the spec's parser."""

from __future__ import annotations

__all__ = ["JobError"]


class JobError(ValueError):
    """The job file cannot be used; the message names the file and the key at fault."""
