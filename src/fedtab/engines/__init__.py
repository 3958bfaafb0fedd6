"""Transports. ``local`` is always available; ``flower`` and ``nvflare`` need their extras.

``LocalFederation`` is resolved on first access, so importing an engine module (a Flower
ClientApp process does, for every message) does not import the local engine's workflows.
"""

__all__ = ["LocalFederation"]


def __getattr__(name: str):
    if name == "LocalFederation":
        from .local import LocalFederation

        return LocalFederation
    raise AttributeError(f"module 'fedtab.engines' has no attribute {name!r}")
