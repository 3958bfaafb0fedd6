"""Results as JSON, plots and the self-contained HTML report."""

from .html import SECTIONS, TEMPLATES, render_report, write_report
from .plots import plot_sweep

__all__ = ["SECTIONS", "TEMPLATES", "plot_sweep", "render_report", "write_report"]
