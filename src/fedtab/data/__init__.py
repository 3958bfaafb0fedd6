"""Site tables: reading, schema alignment, synthetic data and partitions.

The names below import pandas; they are loaded on first use, so a module that needs only
:mod:`fedtab.data.categories`' names (a server naming one-hot columns) imports no pandas.
"""

from __future__ import annotations

from typing import Any

_HOMES = {"classification_table": "synthetic", "split_rows": "synthetic", "TableError": "tables",
          "global_schema": "tables", "read_table": "tables"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fedtab.data' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = ["TableError", "classification_table", "global_schema", "read_table", "split_rows"]
