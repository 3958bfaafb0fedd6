"""A package's public names resolved on first access (PEP 562).

A Flower ClientApp process is started anew for every message and imports only the workflow's
``site`` module that answers it; a package ``__init__`` that imported its server loop (and,
through it, the model zoo, the run options and the schema agreement) made every message pay
for them. ``__getattr__, __dir__ = lazy_exports(__name__, {"name": ".module", ...})`` in the
package keeps ``from package import name`` working and imports ``.module`` only then.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose name ``n`` lives in the relative module
    ``exports[n]``; an unknown name raises ``AttributeError`` as a module's attribute would."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
