"""Transports. ``local`` is always available; ``flower`` and ``nvflare`` need their extras."""

from .local import LocalFederation

__all__ = ["LocalFederation"]
