"""Tools for testing fedtab deployments as an adversary would (hostile sites; a curious server as a Flower
app in :mod:`fedtab.testing.curious_flower`, imported on its own: it needs the ``flower`` extra)."""

from .hostile import (ATTACKS, GARBAGE, MALFORMED_CLASS_MOMENTS, POISON, STEPS, HostileSite, corrupt, hostile_job_files,
                      hostile_model_files)

__all__ = ["ATTACKS", "GARBAGE", "MALFORMED_CLASS_MOMENTS", "POISON", "STEPS", "HostileSite", "corrupt",
           "hostile_job_files", "hostile_model_files"]
