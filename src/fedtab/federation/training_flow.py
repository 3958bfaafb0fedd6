"""The training workflow (kept for older import paths): see :mod:`fedtab.federation.training`."""

from .protocol import SECURE_SUM  # noqa: F401
from .training import *  # noqa: F401,F403
from .training import __all__ as _names
from .training.site import _prepared, params_from as _params_from, params_to as _params_to  # noqa: F401

__all__ = [*_names, "SECURE_SUM"]
