"""The imputation workflow (kept for older import paths): see :mod:`fedtab.federation.imputation`."""

from .imputation import *  # noqa: F401,F403
from .imputation import __all__ as _names
from .imputation.site import _dp_steps, _live  # noqa: F401

__all__ = list(_names)
