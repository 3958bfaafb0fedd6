"""Tools for testing fedtab deployments as an adversary would (hostile sites)."""

from .hostile import (ATTACKS, GARBAGE, MALFORMED_CLASS_MOMENTS, POISON, STEPS, HostileSite, corrupt, hostile_job_files,
                      hostile_model_files)

__all__ = ["ATTACKS", "GARBAGE", "MALFORMED_CLASS_MOMENTS", "POISON", "STEPS", "HostileSite", "corrupt",
           "hostile_job_files", "hostile_model_files"]
