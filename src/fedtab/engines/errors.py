"""The error every deployment raises when its run cannot be submitted, fails or leaves no result."""

from __future__ import annotations

__all__ = ["RunError"]


class RunError(RuntimeError):
    """A run on a deployment (Flower SuperLink, FLARE project or simulator) could not be
    submitted, failed, timed out or left no readable result; the message names the run
    and where its logs are."""
