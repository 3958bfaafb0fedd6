"""Settings objects with keyword overrides: how a public function keeps its documented keyword
arguments while it takes at most a few parameters (issue 29: functions with many options group them
in a small frozen dataclass).

``run_training(fed, feats, model="gnb", rounds=3)`` and
``run_training(fed, feats, settings=TrainingSettings(model="gnb", rounds=3))`` are the same call:
the function takes ``settings`` plus ``**overrides`` and builds one object with :func:`settings_with`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

__all__ = ["settings_with"]

T = TypeVar("T")


def settings_with(cls: type[T], base: T | None, overrides: Mapping[str, Any], caller: str) -> T:
    """``base`` (default: ``cls()``) with the fields named in ``overrides`` replaced.

    Args:
        cls: a dataclass whose fields are the caller's options.
        base: settings given by the caller, or ``None``.
        overrides: the caller's ``**`` keyword arguments, each naming a field of ``cls``.
        caller: the public function's name, for the error message.

    Raises:
        TypeError: a keyword names no field (worded as Python words an unexpected keyword argument:
            ``"run_training() got an unexpected keyword argument 'x'"``); ``base`` is not a ``cls``.
    """
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in overrides:
        if key not in names:
            raise TypeError(f"{caller}() got an unexpected keyword argument {key!r}")
    if base is None:
        return cls(**overrides)
    if not isinstance(base, cls):
        raise TypeError(f"{caller}(): settings must be a {cls.__name__}, got {type(base).__name__}")
    return dataclasses.replace(base, **overrides)  # type: ignore[type-var]
