"""Plots written by the CLI and the benchmarks (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_sweep", "plt", "save_figure"]


def save_figure(fig: Any, path: str | Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it as PNG at ``path`` (parent folders created), close it.

    Returns the written path. Every fedtab and benchmark plot ends here, so figures
    never stay open in a long process.
    """
    out = Path(path)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def plot_sweep(sweep: Sequence[dict[str, Any]], path: str | Path, *, title: str = "Feature Election sweep") -> Path:
    """Signal and noise features kept (bars) and F1 (line, right axis) against freedom degree.

    ``sweep`` rows need ``freedom_degree``, ``signal``, ``noise`` and optionally ``f1``.
    Returns the written path.
    """
    fds = [r["freedom_degree"] for r in sweep]
    x = range(len(fds))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sig = [r["signal"] for r in sweep]
    noise = [r["noise"] for r in sweep]
    ax.bar(x, sig, color="#2a9d8f", label="signal kept")
    ax.bar(x, noise, bottom=sig, color="#e76f51", label="noise kept")
    ax.set_xticks(list(x), [f"{f:g}" for f in fds])
    ax.set_xlabel("freedom degree")
    ax.set_ylabel("features kept")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if all("f1" in r for r in sweep):
        ax2 = ax.twinx()
        (line,) = ax2.plot(list(x), [r["f1"] for r in sweep], "o-", color="#264653", label="weighted F1 (FedAvg)")
        ax2.set_ylabel("weighted F1 on the sites' test splits")
        ax2.set_ylim(0, 1)
        handles.append(line)
        labels.append(line.get_label())
    ax.legend(handles, labels, loc="upper left", fontsize=8)
    return save_figure(fig, path, dpi=120)
