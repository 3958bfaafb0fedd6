"""Results as JSON, plots and the self-contained HTML report.

matplotlib is imported when a figure is drawn (``plot_sweep`` and the report's figures), not
with this package: ``fedtab predict`` and test collection never need it.
"""

from typing import Any

from .html import SECTIONS, TEMPLATES, render_report, write_report

__all__ = ["SECTIONS", "TEMPLATES", "plot_sweep", "render_report", "write_report"]


def __getattr__(name: str) -> Any:
    if name == "plot_sweep":
        from .plots import plot_sweep

        return plot_sweep
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
