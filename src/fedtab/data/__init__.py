"""Site tables: reading, schema alignment, synthetic data and partitions."""

from .synthetic import classification_table, split_rows
from .tables import TableError, global_schema, read_table

__all__ = ["TableError", "classification_table", "global_schema", "read_table", "split_rows"]
