"""Results as JSON and plots."""

from .plots import plot_sweep

__all__ = ["plot_sweep"]
