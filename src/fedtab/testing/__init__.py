"""Tools for testing fedtab deployments as an adversary would (hostile sites)."""

from .hostile import ATTACKS, GARBAGE, POISON, STEPS, HostileSite, corrupt

__all__ = ["ATTACKS", "GARBAGE", "POISON", "STEPS", "HostileSite", "corrupt"]
